"""Per-kernel CUDA time of one training step of the PyTorch peer (torch.compile, BF16 autocast), to set
beside scripts/bench/profile_step.sh's profile of ours on the same shapes.
Usage: python3 scripts/bench/peer_profile.py L C H B [T=1024] [PEER=.carry/bench/torch_gpt2.py]
Prints kernels grouped by name, largest total first (ms per step), and the step's GPU total.
"""
import importlib.util
import sys
from collections import defaultdict

import torch


def load_peer(path):
    spec = importlib.util.spec_from_file_location("torch_gpt2", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    L, C, H, B = (int(a) for a in sys.argv[1:5])
    T = int(sys.argv[5]) if len(sys.argv) > 5 else 1024
    peer = load_peer(sys.argv[6] if len(sys.argv) > 6 else ".carry/bench/torch_gpt2.py")
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    model = peer.GPT(L, C, H, T=T).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    fwd = torch.compile(model)
    batch = torch.randint(0, 50257, (B, T + 1), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(batch[:, :-1], batch[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(4):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    total, count = defaultdict(float), defaultdict(int)
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", None)
        if us is None:
            us = e.self_cuda_time_total
        if us > 0:
            total[e.key] += us / 1e3
            count[e.key] += e.count
    gpu = sum(total.values())
    print(f"peer L={L} C={C} H={H} B={B} T={T}: {gpu:.2f} ms GPU per step, {len(total)} kernel names")
    for name, ms in sorted(total.items(), key=lambda kv: -kv[1])[:30]:
        print(f"{ms:9.3f} ms {count[name]:5d}x  {name[:110]}")

if __name__ == "__main__":
    main()
