#!/usr/bin/env bash
# Runs the malformed-input corpus (cases.txt) through an fp8train binary: every case must end with
# exit code 1 (a refusal, not a signal or a sanitizer report), print no "unexpected error", and name
# what is wrong (each of its words appears in the output). Cases listed in expected_failures.txt
# may fail (XFAIL); one that passes is reported as XPASS so the list can shrink.
# Usage: tests/malformed/run.sh FP8TRAIN WORKDIR [ID_PATTERN...]   (patterns: bash globs on case ids)
# Env: MALFORMED_TIMEOUT (seconds per case, default 60), MALFORMED_VERBOSE=1 (print every output).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
SRC="$(cd "$HERE/../.." && pwd)"
if [ $# -lt 2 ]; then
  sed -n '2,8p' "$0" >&2
  exit 2
fi
BIN="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
WORK="$2"
shift 2
PATTERNS=("$@")
TIMEOUT="${MALFORMED_TIMEOUT:-60}"
[ -x "$BIN" ] || { echo "malformed: $BIN is not an executable" >&2; exit 2; }

rm -rf "$WORK"
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"
cd "$WORK"
ln -s "$HERE" cases
ln -s "$SRC/data" data  # the GPT-2 vocabulary for sample
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# A sanitizer report must not pass for a clean refusal that happens to exit 1. A case that allocates
# without bound must not take the machine with it: 4 GiB, through ASan's RSS limit in a sanitized
# build (whose shadow memory rules out an address-space limit), else through ulimit -v.
# Appended to the caller's options (the later setting of a flag wins), so these always hold.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}exitcode=86:hard_rss_limit_mb=4096"
grep -qa "AddressSanitizer" "$BIN" || ulimit -v $((4 * 1024 * 1024))
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"

# ---- token shards: make_shard FILE [magic=M] [version=V] [count=C] [n=N] [id=I] [at=P] [tail=BYTES]
# [cut=BYTES] [raw=TEXT]. N tokens (default 4096) of a fixed pattern below 50257 (and below 500 for
# the first 500), count defaults to N; id=I at=P puts token I at position P (P may be "last");
# tail appends zero bytes, cut removes bytes from the end, raw writes TEXT instead of a shard.
make_shard() {
  local file="$1"
  shift
  mkdir -p "$(dirname "$file")"
  perl -e '
    my %o = (magic => 20240520, version => 1, n => 4096, tail => 0, cut => 0);
    for (@ARGV[1..$#ARGV]) { my ($k, $v) = split /=/, $_, 2; $o{$k} = $v; }
    open(my $f, ">:raw", $ARGV[0]) or die "$ARGV[0]: $!";
    if (exists $o{raw}) { print $f $o{raw}; exit 0; }
    my $count = exists $o{count} ? $o{count} : $o{n};
    my @h = (0) x 256; @h[0, 1, 2] = ($o{magic}, $o{version}, $count);
    my @t = map { ($_ * 7919 + 13) % 499 } 0 .. $o{n} - 1;
    if (exists $o{id}) { my $p = $o{at} eq "last" ? $o{n} - 1 : ($o{at} // 0); $t[$p] = $o{id}; }
    my $bytes = pack("l<256", @h) . pack("S<*", @t) . ("\0" x $o{tail});
    substr($bytes, length($bytes) - $o{cut}) = "" if $o{cut} > 0;
    print $f $bytes;' "$file" "$@"
}

# ---- checkpoint edits, all relative to $CK (the checkpoint directory of the case's copy)
own() {  # replace a hard link to the base run by a private copy before editing
  local f="$CK/$1"
  [ -e "$f" ] || return 0
  cp "$f" "$f.own" && mv "$f.own" "$f"
}
cut_bytes() { own "$1"; truncate -s "-$2" "$CK/$1"; }          # drop the last N bytes
empty() { own "$1"; : >"$CK/$1"; }
extend() { own "$1"; head -c "$2" /dev/zero >>"$CK/$1"; }      # append N zero bytes
flip() {                                                       # flip the low bit of byte OFFSET
  own "$1"
  perl -e 'open(my $f, "+<:raw", $ARGV[0]) or die; seek($f, $ARGV[1], 0); read($f, my $b, 1);
           seek($f, $ARGV[1], 0); print $f chr(ord($b) ^ 1);' "$CK/$1" "$2"
}
put_f32() {                                                    # put_f32 FILE INDEX nan|inf|-inf|VALUE
  own "$1"
  perl -e 'my %v = (nan => "\0\0\xc0\x7f", inf => "\0\0\x80\x7f", "-inf" => "\0\0\x80\xff");
           open(my $f, "+<:raw", $ARGV[0]) or die; seek($f, 4 * $ARGV[1], 0);
           print $f ($v{$ARGV[2]} // pack("f<", $ARGV[2]));' "$CK/$1" "$2" "$3"
}
put() { own "$1"; printf '%s' "$2" >"$CK/$1"; }               # replace the file by TEXT
drop() { rm -rf "${CK:?}/$1"; }
unmanifest() { drop manifest.json; }  # a checkpoint as written before manifests (format 1)
json_edit() {  # json_edit FILE PERL: the file decoded as $j, edited by PERL, written back
  own "$1"
  perl -MJSON::PP -e 'local $/; open(my $f, "<", $ARGV[0]) or die; my $j = decode_json(<$f>); close $f;
           eval $ARGV[1]; die $@ if $@; open($f, ">", $ARGV[0]) or die;
           print $f JSON::PP->new->canonical->allow_nonref->encode($j);' "$CK/$1" "$2"
}
text_edit() { own "$1"; perl -0pi -e "$2" "$CK/$1"; }         # a perl substitution on the file's text
set_latest() { printf '%s' "$1" >"$RUN/checkpoints/latest"; }

# ---- the base run config and the runs whose checkpoints the checkpoint cases damage
write_base_config() {  # write_base_config FILE COMPUTE
  cat >"$1" <<EOF
run: {name: malformed, out_dir: out/base, seed: 1, device: cpu, log_every: 1}
model: {arch: gpt2, n_layer: 1, n_head: 2, d_model: 16, vocab_size: 50257, seq_len: 16}
data: {train: shards/good/train_*.bin, val: shards/good/val_*.bin}
train: {micro_batch: 2, max_steps: 2, eval_every: 0, eval_steps: 1, checkpoint_every: 0}
optim: {lr: 1.0e-3, warmup_steps: 0}
precision: {compute: $2, fp8: {amax_history_len: 4}}
distributed: {zero_stage: 0}
EOF
}

make_shard shards/good/train_000000.bin n=4096
make_shard shards/good/val_000000.bin n=1024
write_base_config base.yaml fp32
write_base_config base8.yaml fp8
for base in base base8; do
  if ! "$BIN" train --config "$base.yaml" --set run.out_dir="runs/$base" >"$base.log" 2>&1; then
    echo "malformed: the base run $base failed; its output:"
    cat "$base.log"
    exit 1
  fi
  [ -f "runs/$base/checkpoints/latest" ] || { echo "malformed: runs/$base has no checkpoint" >&2; exit 1; }
done

# A copy of a base run: checkpoint binaries hard-linked (edits go through own), the rest copied.
copy_run() {  # copy_run BASE DEST
  mkdir -p "$2"
  (cd "runs/$1" && find . -type d -exec mkdir -p "$WORK/$2/{}" \; &&
   find . -type f -name '*.bin' -exec ln {} "$WORK/$2/{}" \; &&
   find . -type f ! -name '*.bin' -exec cp {} "$WORK/$2/{}" \;)
}

declare -A XFAIL=()
while IFS= read -r line; do
  [[ -z "$line" || "$line" == \#* ]] && continue
  id="${line%%[[:space:]]*}"
  XFAIL["$id"]="${line#"$id"}"
done <"$HERE/expected_failures.txt"

pass=0 fail=0 xfail=0 xpass=0 total=0
failed_ids=() xpass_ids=()
mkdir -p logs

run_case() {  # run_case ID ACTION WORDS; sets $verdict and $why
  local id="$1" action="$2" words="$3"
  local kind args
  kind="${action%% *}"
  args="${action#"$kind"}"
  local slug="${id//\//_}"
  CK="" RUN=""
  local cmd=() extra=()
  if [[ "$args" == *" -- "* ]]; then  # ACTION ARGS -- FP8TRAIN ARGS
    eval "extra=(${args#* -- })"
    args="${args%% -- *}"
  fi
  case "$kind" in
    config)  # config FILE [ARGS]: a file of tests/malformed/config
      eval "local a=($args)"
      cmd=("$BIN" train --config "cases/config/${a[0]}" "${a[@]:1}")
      ;;
    set)  # set ARGS: overrides of the valid base config
      eval "local a=($args)"
      cmd=("$BIN" train --config base.yaml --set run.out_dir="out/$slug" "${a[@]}")
      ;;
    shard | shard2 | valshard)  # a generated shard: as the only train shard, the second one, or the val shard
      local dir="shards/$slug"
      eval "local spec=($args)"
      local data=(--set data.train="$dir/train_*.bin")
      case "$kind" in
        shard) make_shard "$dir/train_000000.bin" "${spec[@]}" ;;
        shard2) make_shard "$dir/train_000000.bin" && make_shard "$dir/train_000001.bin" "${spec[@]}" ;;
        valshard) make_shard "$dir/val_000000.bin" "${spec[@]}"; data=(--set data.val="$dir/val_*.bin") ;;
      esac
      SHARD="$dir"
      cmd=("$BIN" train --config base.yaml --set run.out_dir="out/$slug" "${data[@]}" "${extra[@]}")
      ;;
    resume | resume8 | sample | export)  # a damaged copy of a base run's checkpoint
      local base=base
      [ "$kind" = resume8 ] && base=base8
      RUN="$WORK/ck/$slug"
      copy_run "$base" "ck/$slug"
      CK="$RUN/checkpoints/$(cat "$RUN/checkpoints/latest")"
      local edit="$args"
      if ! (eval "$edit"); then
        verdict=FAIL why="the case's edit failed: $edit"
        return
      fi
      case "$kind" in
        resume | resume8)
          cmd=("$BIN" train --config "$base.yaml" --set run.out_dir="$RUN" --set train.max_steps=3 "${extra[@]}"
               --resume "$RUN") ;;
        sample) cmd=("$BIN" sample --checkpoint "$RUN" --vocab data/gpt2-vocab --prompt "hi" --tokens 2 "${extra[@]}") ;;
        export) cmd=("$BIN" export --checkpoint "$RUN" --out "$WORK/export/$slug" "${extra[@]}") ;;
      esac
      ;;
    *)
      verdict=FAIL why="unknown action kind '$kind'"
      return
      ;;
  esac
  local log="logs/$slug.log" rc=0
  timeout -k 5 "$TIMEOUT" "${cmd[@]}" >"$log" 2>&1 </dev/null || rc=$?
  local out
  out="$(cat "$log")"
  verdict=PASS why=""
  if [ "$rc" -eq 0 ]; then
    verdict=FAIL why="accepted (exit 0)"
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    verdict=FAIL why="no answer within ${TIMEOUT}s (exit $rc)"
  elif [ "$rc" -ge 128 ]; then
    verdict=FAIL why="killed by signal $((rc - 128)) (exit $rc)"
  elif [ "$rc" -ne 1 ]; then
    verdict=FAIL why="exit $rc, not 1"
  fi
  local bad
  for bad in "unexpected error" "Sanitizer" "runtime error:" "terminate called" "Segmentation fault"; do
    if [[ "$out" == *"$bad"* ]]; then
      verdict=FAIL why="${why:+$why; }output has '$bad'"
    fi
  done
  local w missing=()
  IFS=';' read -r -a wl <<<"$words"
  for w in "${wl[@]}"; do
    w="$(echo "$w" | sed -e 's/^ *//' -e 's/ *$//')"
    [ -n "$w" ] || continue
    w="${w//\{ck\}/$CK}"
    w="${w//\{run\}/$RUN}"
    w="${w//\{shard\}/${SHARD:-}}"
    [[ "$out" == *"$w"* ]] || missing+=("'$w'")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    verdict=FAIL why="${why:+$why; }message lacks ${missing[*]}"
  fi
}

while IFS= read -r line; do
  [[ -z "${line// /}" || "$line" == \#* ]] && continue
  id="$(echo "${line%%|*}" | sed 's/ *$//')"
  rest="${line#*|}"
  action="$(echo "${rest%%|*}" | sed -e 's/^ *//' -e 's/ *$//')"
  words="${rest#*|}"
  [ "$words" = "$rest" ] && words=""
  if [ ${#PATTERNS[@]} -gt 0 ]; then
    hit=0
    for p in "${PATTERNS[@]}"; do [[ "$id" == $p ]] && hit=1; done
    [ $hit -eq 1 ] || continue
  fi
  total=$((total + 1))
  SHARD=""
  verdict=FAIL why=""
  run_case "$id" "$action" "$words"
  slug="${id//\//_}"
  if [ -n "${XFAIL[$id]+x}" ]; then
    if [ "$verdict" = PASS ]; then
      xpass=$((xpass + 1)) xpass_ids+=("$id")
      echo "XPASS $id: now passes; remove it from expected_failures.txt"
    else
      xfail=$((xfail + 1))
      echo "XFAIL $id: $why"
    fi
  elif [ "$verdict" = PASS ]; then
    pass=$((pass + 1))
    if [ "${MALFORMED_VERBOSE:-0}" = 1 ]; then echo "PASS  $id" && sed 's/^/      | /' "logs/$slug.log" | tail -n 5; fi
  else
    fail=$((fail + 1)) failed_ids+=("$id")
    echo "FAIL  $id: $why"
    echo "      $action"
    if [ -f "logs/$slug.log" ]; then sed 's/^/      | /' "logs/$slug.log" | tail -n 6; fi
  fi
done <"$HERE/cases.txt"

echo "malformed: $total case(s): $pass pass, $fail fail, $xfail expected failure(s), $xpass unexpected pass(es)"
[ ${#xpass_ids[@]} -eq 0 ] || echo "malformed: now passing, drop from expected_failures.txt: ${xpass_ids[*]}"
if [ "$total" -eq 0 ]; then
  echo "malformed: no case matched" >&2
  exit 1
fi
[ "$fail" -eq 0 ]
