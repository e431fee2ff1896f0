#!/usr/bin/env bash
# The Slurm test (CTest label slurm): on a one-node cluster from local_cluster.sh, `sbatch --wait` of
# train.sbatch with 2 CPU tasks at ZeRO-1, once through srun --mpi=pmix (MPI collectives) and once
# through plain srun (ranks from the Slurm variables, TCP collectives); each run directory is checked
# (metrics for every step, val loss, checkpoint, both ranks' optimizer shards) and the two runs must
# log the same losses bit for bit. srun --mpi=pmi2 must either train as well or fail saying why.
# Usage: scripts/slurm/test_local_cluster.sh FP8TRAIN_BINARY
# Exit status: 0 pass, 1 fail, 77 skipped (no Slurm tools, or not root).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=$(realpath "${1:?usage: $0 FP8TRAIN_BINARY}")
SKIP=77

if [ "${FP8T_IN_LOCAL_CLUSTER:-0}" != 1 ]; then
  for tool in sbatch srun sinfo slurmctld slurmd munged python3; do
    if ! command -v "$tool" >/dev/null; then
      echo "SKIP: $tool not found: install slurmctld slurmd slurm-client munge (scripts/setup.sh does)"
      exit $SKIP
    fi
  done
  if [ "$(id -u)" != 0 ]; then
    echo "SKIP: the local Slurm cluster needs root (slurmd starts the jobs)"
    exit $SKIP
  fi
  FP8T_IN_LOCAL_CLUSTER=1 exec "$ROOT/scripts/slurm/local_cluster.sh" "${BASH_SOURCE[0]}" "$@"
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/fp8t-slurm-test.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
FAILED=0
fail() {
  echo "FAIL: $*"
  FAILED=1
}
python3 "$ROOT/tests/scripts/make_shards.py" "$WORK/data"

# tiny-cpu.yaml for a few steps, with a vocabulary of 512 (the shards use the first 512 ids) to stay quick.
STEPS=4
TOKENS_PER_STEP=$((2 * 8 * 128))  # ranks x micro_batch x seq_len of tiny-cpu.yaml
# Runs train.sbatch as a user would, with MODE as srun's --mpi; sets JOB_RC (sbatch --wait's exit status,
# the job's), JOB_STATE ("COMPLETED 0:0": Slurm's JobState and ExitCode) and JOB_OUT (its output file).
submit() {
  local mode=$1 run="$WORK/run-$1" id
  JOB_OUT="$WORK/job-$mode.out"
  local t0=$SECONDS
  set +e
  id=$(CONFIG=configs/tiny-cpu.yaml FP8T_BIN="$BIN" FP8T_SRUN_MPI=$mode \
    sbatch --wait --parsable --job-name="fp8t-$mode" --nodes=1 --ntasks-per-node=2 --gpus-per-node=0 \
    --cpus-per-task=1 --time=10 --chdir="$ROOT" --output="$JOB_OUT" "$ROOT/scripts/slurm/train.sbatch" \
    --set run.out_dir="$run" --set data.train="$WORK/data/train_*.bin" --set data.val="$WORK/data/val_*.bin" \
    --set train.max_steps=$STEPS --set train.eval_every=2 --set train.eval_steps=2 --set run.log_every=1 \
    --set model.vocab_size=512 --set distributed.zero_stage=1 --set distributed.timeout_s=60)
  JOB_RC=$?
  set -e
  # sbatch --wait may return while the job is still COMPLETING (slurmd cleaning up): wait for its end state.
  for _ in $(seq 60); do
    JOB_STATE=$(scontrol show job "${id:-none}" 2>&1 |
      sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p; s/.* ExitCode=\([0-9:]*\).*/\1/p' | paste -sd' ' || true)
    case "$JOB_STATE" in COMPLETING* | RUNNING* | PENDING* | "") sleep 0.5 ;; *) break ;; esac
  done
  echo "---- srun --mpi=$mode: job ${id:-?} $JOB_STATE, sbatch --wait exit $JOB_RC after $((SECONDS - t0)) s; output:"
  sed 's/^/    /' "$JOB_OUT" 2>/dev/null || echo "    (no output file)"
}

# The run directory of a 2-rank ZeRO-1 run of STEPS steps; BACKEND is what its log must name.
check_run() {
  local mode=$1 backend=$2 run="$WORK/run-$1"
  grep -q "2 ranks launched by" "$JOB_OUT" || fail "$mode: no '2 ranks launched by' line: not a 2-rank run"
  grep -q "($backend backend)" "$run/log.txt" 2>/dev/null || fail "$mode: log.txt does not name the $backend backend"
  python3 - "$run/metrics.jsonl" "$STEPS" "$TOKENS_PER_STEP" <<'PY' || fail "$mode: metrics.jsonl (above)"
import json, math, sys
path, steps, per_step = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
recs = [json.loads(l) for l in open(path)]
train = [r for r in recs if "loss" in r]
evals = [r["step"] for r in recs if "val_loss" in r]
errors = []
if [r["step"] for r in train] != list(range(1, steps + 1)):
    errors.append(f"train steps {[r['step'] for r in train]}, expected 1..{steps}")
if not all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in train):
    errors.append("a non-finite loss or gradient norm")
if train and train[-1]["tokens"] != steps * per_step:
    errors.append(f"{train[-1]['tokens']} tokens after {steps} steps, expected {steps * per_step} (2 ranks)")
if evals != [0, 2, 4]:
    errors.append(f"val_loss at steps {evals}, expected [0, 2, 4]")
for e in errors:
    print(f"    metrics.jsonl: {e}")
sys.exit(1 if errors else 0)
PY
  local ck
  ck="$run/checkpoints/$(cat "$run/checkpoints/latest" 2>/dev/null || echo missing)"
  [ "$(basename "$ck")" = "step_$(printf %08d $STEPS)" ] || fail "$mode: checkpoints/latest is not step $STEPS"
  [ -s "$ck/model.bin" ] || fail "$mode: $ck/model.bin missing"
  for r in 0 1; do
    compgen -G "$ck/optim*rank$r.bin" >/dev/null || fail "$mode: no optimizer shard of rank $r in $ck"
  done
  if compgen -G "$run/.tcp_*" >/dev/null; then fail "$mode: rendezvous file left in $run"; fi
}

# The losses of every step and evaluation, as logged.
losses() {
  python3 -c 'import json, sys
print([(r["step"], r.get("loss"), r.get("val_loss")) for r in map(json.loads, open(sys.argv[1]))])' "$1"
}

submit pmix
[ "$JOB_RC" = 0 ] && [ "$JOB_STATE" = "COMPLETED 0:0" ] || fail "srun --mpi=pmix: exit $JOB_RC, job $JOB_STATE"
check_run pmix mpi

submit none
[ "$JOB_RC" = 0 ] && [ "$JOB_STATE" = "COMPLETED 0:0" ] || fail "plain srun: exit $JOB_RC, job $JOB_STATE"
check_run none tcp
if [ "$(losses "$WORK/run-pmix/metrics.jsonl" 2>&1)" = "$(losses "$WORK/run-none/metrics.jsonl" 2>&1)" ]; then
  echo "---- the MPI and TCP runs logged the same losses, bit for bit"
else
  fail "the MPI and TCP runs logged different losses (2 ranks: the same sums, so they must be bit-identical)"
  echo "    mpi: $(losses "$WORK/run-pmix/metrics.jsonl" 2>&1)"
  echo "    tcp: $(losses "$WORK/run-none/metrics.jsonl" 2>&1)"
fi

# pmi2: Debian's Open MPI has no PMI-2 client and refuses to start; an MPI that would start its ranks as
# worlds of one must be stopped by fp8train instead of training twice; one that speaks PMI-2 must train.
submit pmi2
if [ "$JOB_RC" = 0 ]; then
  check_run pmi2 mpi
elif [ "${JOB_STATE%% *}" != FAILED ] ||
  ! grep -qE "MPI sees a world of 1|not built with SLURM's PMI support" "$JOB_OUT"; then
  fail "srun --mpi=pmi2: exit $JOB_RC, job $JOB_STATE, without saying that MPI does not speak PMI-2"
fi

[ "$FAILED" = 0 ] && echo "PASS: Slurm jobs through srun --mpi=pmix, plain srun and --mpi=pmi2"
exit "$FAILED"
