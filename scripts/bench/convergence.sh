#!/usr/bin/env bash
# Convergence of FP8 against BF16 on one GPU: for each model size, the same data and schedule in
# bf16 (seed 1337), bf16 with seed 1338 (the noise floor), fp8 and fp8 with the leanest storage and
# state, then scripts/plot_metrics.py's overlaid curves (SIZE.png) and final-loss table (SIZE.md).
# Usage: [SIZES="124m 350m"] [EPOCHS=2] [SKIP_SEED2=1] [RUNS="..."] [DRY_RUN=1] scripts/bench/convergence.sh
# RUNS picks the runs (default "bf16 bf16-seed2 fp8 fp8-lean extra"; SKIP_SEED2=1 drops bf16-seed2), e.g.
# RUNS="fp8-lean extra" for an A/B of one option within one device call; the plot and table cover those runs.
# EXTRA_SET="KEY=VALUE ..." adds one more run, the lean FP8 one with those options too, named SIZE-$EXTRA_NAME
# (default fp8-extra): e.g. EXTRA_SET="precision.fp8.fast_accum=[forward]" EXTRA_NAME=fp8-te-accum, the lean run with
# Transformer Engine's accumulation (the FP8 configs' default is fast accumulation in every FP8 GEMM since 2026-12-06).
# The step count covers EPOCHS passes over the train shards at TOTAL_BATCH_TOKENS per step, counted
# from the shard headers (or TRAIN_TOKENS=N, for a dry run without the data). DRY_RUN=1 prints the
# arithmetic and the commands instead of running them.
set -euo pipefail
cd "$(dirname "$0")/../.."

# FP8 with the least memory for activations and state; extend as the trainer gains options, e.g.
# LEAN_SET="precision.fp8.activation_storage=fp8_all precision.grad_dtype=bf16 optim.state_dtype=fp8"
LEAN_SET=${LEAN_SET:-"precision.fp8.activation_storage=fp8_all precision.grad_dtype=bf16 optim.state_dtype=fp8"}
read -ra EXTRA <<< "${EXTRA_SET:-}"  # split on spaces, no globbing ([a,b] lists)
EXTRA_NAME=${EXTRA_NAME:-fp8-extra}
RUNS=" ${RUNS:-bf16 bf16-seed2 fp8 fp8-lean extra} "
[[ ${SKIP_SEED2:-0} == 1 ]] && RUNS=${RUNS/ bf16-seed2 / }
((${#EXTRA[@]} > 0)) || RUNS=${RUNS/ extra / }
for r in $RUNS; do
  case $r in
    bf16 | bf16-seed2 | fp8 | fp8-lean | extra) ;;
    *) echo "convergence: RUNS has '$r'; the runs are bf16 bf16-seed2 fp8 fp8-lean extra (extra needs EXTRA_SET)" >&2
       exit 2 ;;
  esac
done
SIZES=${SIZES:-"124m 350m"}
EPOCHS=${EPOCHS:-2}
TOTAL_BATCH_TOKENS=${TOTAL_BATCH_TOKENS:-65536}
MICRO_BATCH=${MICRO_BATCH:-32}
SEQ_LEN=${SEQ_LEN:-1024}     # the configs' model.seq_len
CONFIGS=${CONFIGS:-configs}  # holds gpt2-SIZE-bf16.yaml and gpt2-SIZE-fp8.yaml
WARMUP_PERCENT=${WARMUP_PERCENT:-5}
EVALS=${EVALS:-20}           # evaluations over the run, besides the one before the first step
EVAL_STEPS=${EVAL_STEPS:-8}  # micro-batches per set per evaluation: 8 x 32 x 1024 = 262k tokens
TRAIN_GLOB=${TRAIN_GLOB:-"data/medium/train_*.bin"}
# The in-distribution split and the held-out State of the Union addresses (docs/data.md).
VAL_SETS=${VAL_SETS:-"{val: data/medium/val_*.bin, sotu: data/medium/sotu_val_*.bin}"}
FP8T_BIN=${FP8T_BIN:-build/fp8train}
OUT_ROOT=${OUT_ROOT:-runs/convergence}
PYTHON=${PYTHON:-python3}
DRY_RUN=${DRY_RUN:-0}
export NCCL_NVLS_ENABLE=0

micro_tokens=$((MICRO_BATCH * SEQ_LEN))
if ((TOTAL_BATCH_TOKENS % micro_tokens != 0)); then
  echo "convergence: TOTAL_BATCH_TOKENS=$TOTAL_BATCH_TOKENS is not a multiple of" \
    "MICRO_BATCH x $SEQ_LEN = $micro_tokens" >&2
  exit 2
fi

# Micro-batches in one epoch, as ShardLoader counts them: floor((n - 1) / (B*T)) per shard.
train_tokens=0 micro_per_epoch=0
if [[ -n ${TRAIN_TOKENS:-} ]]; then
  train_tokens=$TRAIN_TOKENS
  micro_per_epoch=$(((TRAIN_TOKENS - 1) / micro_tokens))
else
  shopt -s nullglob
  # shellcheck disable=SC2206
  shards=($TRAIN_GLOB)
  shopt -u nullglob
  if ((${#shards[@]} == 0)); then
    echo "convergence: no shards match $TRAIN_GLOB (set TRAIN_GLOB, or TRAIN_TOKENS for a dry run)" >&2
    exit 2
  fi
  for f in "${shards[@]}"; do
    n=$(od -An -t d4 -j 8 -N 4 "$f" | tr -d ' ')  # int32 header[2]: the token count
    train_tokens=$((train_tokens + n))
    micro_per_epoch=$((micro_per_epoch + (n - 1) / micro_tokens))
  done
fi
accum=$((TOTAL_BATCH_TOKENS / micro_tokens))
steps=$((EPOCHS * micro_per_epoch / accum))
if ((steps < 1)); then
  echo "convergence: $train_tokens train tokens give no step of $TOTAL_BATCH_TOKENS tokens" >&2
  exit 2
fi
warmup=$(((steps * WARMUP_PERCENT + 50) / 100))
eval_every=$(((steps + EVALS - 1) / EVALS))
echo "convergence: $train_tokens train tokens = $micro_per_epoch micro-batches of $MICRO_BATCH x $SEQ_LEN per epoch;" \
  "$EPOCHS epochs at $TOTAL_BATCH_TOKENS tokens/step ($accum micro-batches) = $steps steps," \
  "warmup $warmup, eval every $eval_every steps x $EVAL_STEPS micro-batches per set"

COMMON=(--set "data.train=$TRAIN_GLOB" --set "data.val=$VAL_SETS"
        --set train.micro_batch="$MICRO_BATCH" --set train.total_batch_tokens="$TOTAL_BATCH_TOKENS"
        --set train.max_steps="$steps" --set optim.warmup_steps="$warmup"
        --set train.eval_every="$eval_every" --set train.eval_steps="$EVAL_STEPS"
        --set train.checkpoint_every=-1 --set run.log_every=10)

# run NAME CONFIG KEY=VALUE...: one training run into $OUT_ROOT/NAME, its output in $OUT_ROOT/NAME.log.
run() {
  local name=$1 config=$2
  shift 2
  local cmd=("$FP8T_BIN" train --config "$config" "${COMMON[@]}"
             --set run.name="$name" --set run.out_dir="$OUT_ROOT/$name")
  for kv in "$@"; do cmd+=(--set "$kv"); done
  if [[ $DRY_RUN == 1 ]]; then
    printf '%q ' "${cmd[@]}"
    printf '> %q 2>&1\n' "$OUT_ROOT/$name.log"
    return
  fi
  echo "convergence: $name"
  "${cmd[@]}" > "$OUT_ROOT/$name.log" 2>&1 || { tail -20 "$OUT_ROOT/$name.log"; exit 1; }
  tail -1 "$OUT_ROOT/$name.log"
}

if [[ $DRY_RUN != 1 ]]; then
  mkdir -p "$OUT_ROOT"
  "$PYTHON" -c "import matplotlib" 2>/dev/null ||
    echo "convergence: warning: $PYTHON lacks matplotlib; the runs will train but not plot (set PYTHON)" >&2
fi
for size in $SIZES; do
  bf16=$CONFIGS/gpt2-$size-bf16.yaml fp8=$CONFIGS/gpt2-$size-fp8.yaml
  [[ -f $bf16 && -f $fp8 ]] || { echo "convergence: no $bf16 or $fp8" >&2; exit 2; }
  declare -A args=(
    [bf16]="$bf16 run.seed=1337" [bf16-seed2]="$bf16 run.seed=1338"
    # Today's FP8 mode before the lean state: FP32 gradients and moments.
    [fp8]="$fp8 run.seed=1337 precision.fp8.activation_storage=fp8 precision.grad_dtype=fp32 optim.state_dtype=fp32"
    [fp8-lean]="$fp8 run.seed=1337 $LEAN_SET" [extra]="$fp8 run.seed=1337 $LEAN_SET ${EXTRA[*]}")
  runs=()
  for r in $RUNS; do
    name=$size-$r
    [[ $r == extra ]] && name=$size-$EXTRA_NAME
    read -ra run_args <<< "${args[$r]}"  # split on spaces, no globbing ([a,b] lists)
    run "$name" "${run_args[@]}"
    runs+=("$OUT_ROOT/$name")
  done
  plot=("$PYTHON" scripts/plot_metrics.py "${runs[@]}" --out "$OUT_ROOT/$size.png" --table "$OUT_ROOT/$size.md")
  if [[ $DRY_RUN == 1 ]]; then printf '%q ' "${plot[@]}"; echo; else "${plot[@]}"; fi
done
