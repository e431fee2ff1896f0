#!/usr/bin/env python3
"""scripts/bench/timeline.py on a hand-made timeline: step windows from AdamW kernels (a group of two counts
once), busy time as the union over streams, idle gaps by length, and the printed medians."""
import importlib.util
import os
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
script = os.path.join(here, "..", "..", "scripts", "bench", "timeline.py")
spec = importlib.util.spec_from_file_location("timeline", script)
timeline = importlib.util.module_from_spec(spec)
spec.loader.exec_module(timeline)

US = 1000  # ns
rows = [  # kind, start, end (us), stream, name
    ("kernel", 0, 10, 7, "void fp8t::kernels::adamw_kernel<float>(float*)"),  # step 1 ends at 10
    ("kernel", 11, 50, 7, "k1"),        # gap 1 us
    ("memset", 55, 60, 7, "4096 bytes"),  # gap 5 us
    ("kernel", 60, 100, 7, "k2"),       # no gap
    ("kernel", 90, 130, 9, "k3"),       # overlaps k2 on another stream
    ("kernel", 180, 200, 7, "adamw_kernel"),  # gap 50 us; step 2 ends at 200
    ("kernel", 400, 410, 7, "k4"),      # gap 200 us
    ("kernel", 410, 420, 7, "adamw_kernel"),  # two AdamW launches in a row: one group,
    ("kernel", 420, 430, 7, "adamw_kernel"),  # step 3 ends at 430
]
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "timeline.csv")
    with open(path, "w") as f:
        f.write("kind,start_ns,end_ns,stream,name\n")
        for kind, s, e, stream, name in rows:
            f.write(f'{kind},{s * US},{e * US},{stream},"{name}"\n')
    acts = timeline.load(path)
    windows = timeline.steps_of(acts)
    assert windows == [(10 * US, 200 * US), (200 * US, 430 * US)], windows

    r, gaps, _ = timeline.analyse(acts, *windows[0])
    want = {"step ms": 0.19, "busy ms": 0.134, "idle ms": 0.056, "kernel ms": 0.139, "memset ms": 0.005,
            "memcpy ms": 0.0, "activities": 5, "gaps < 2 us": 1, "gaps 2-10 us": 1, "gaps 10-100 us": 1,
            "gaps >= 100 us": 0}
    for k, v in want.items():
        assert abs(r[k] - v) < 1e-9, (k, r[k], v)
    assert sorted(g for g, _, _ in gaps) == [1 * US, 5 * US, 50 * US], gaps

    r, gaps, _ = timeline.analyse(acts, *windows[1])
    assert abs(r["busy ms"] - 0.03) < 1e-9 and abs(r["idle ms"] - 0.2) < 1e-9, r
    assert r["gaps >= 100 us"] == 1 and abs(r["gaps >= 100 us ms"] - 0.2) < 1e-9, r

    # The command line: SKIP 2 leaves the third step only.
    out = subprocess.run([sys.executable, script, path, "2"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("1 steps (after the first 2)"), out
    assert "| 0.23 | 0.03 | 0.2 |" in out, out
    assert "200.0 us  after k4" not in out and "200.0 us  after (step start)  before k4" in out, out
    # Categories: the step-2 window holds k1, k2, k3 (other kernels), a memset and 56 us idle.
    r, _, inside = timeline.analyse(acts, *windows[0])
    cats = timeline.by_category(inside, *windows[0], r["idle ms"])
    assert abs(cats["other kernels"] - 0.119) < 1e-9 and abs(cats["memsets"] - 0.005) < 1e-9, cats
    assert abs(cats["optimizer, grad norm"] - 0.02) < 1e-9 and abs(cats["idle"] - 0.056) < 1e-9, cats
    for name, want in [("nvjet_sm90_qqtst_192x192_128x4_1x2_h_bz_coopB_bias_TNN", "FP8 GEMM"),
                       ("nvjet_sm90_tst_320x128_64x3_1x2_h_badd_coopB_NTT", "BF16 GEMM"),
                       ("void fp8t::kernels::attention_backward_wgmma_kernel<3, (DqLayout)1>(float*)", "attention"),
                       ("void fp8t::kernels::(anonymous namespace)::cast_transpose_kernel<(fp8t::Fp8Format)0>(float*)",
                        "FP8 casts, saves, restores"),
                       ("void fp8t::kernels::(anonymous namespace)::saved_gelu_pair_kernel<(fp8t::Fp8Format)1, true>"
                        "(__nv_bfloat16 const*)", "FP8 casts, saves, restores"),
                       ("void fp8t::kernels::layernorm_backward_fused_kernel<8>(float*)", "LayerNorm")]:
        assert timeline.category("kernel", name) == want, (name, timeline.category("kernel", name))
    assert "| idle | 0.20 | 87.0% |" in out, out
    # No AdamW at all: a clear message, not a traceback.
    with open(path, "w") as f:
        f.write("kind,start_ns,end_ns,stream,name\nkernel,0,10,7,k1\n")
    p = subprocess.run([sys.executable, script, path], capture_output=True, text=True)
    assert p.returncode != 0 and "no complete step" in p.stderr and "Traceback" not in p.stderr, p.stderr
print("timeline analysis: all checks passed")
