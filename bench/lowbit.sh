#!/usr/bin/env bash
# The 2–3-bit lattice i-quants, calibrated against llama.cpp's importance-matrix files of the
# same type: for each model and each of IQ2_XXS, IQ2_XS, IQ2_S, IQ2_M, IQ3_XXS, IQ3_S, IQ3_M,
# the file llama-quantize --imatrix writes (with LLAMA_CPP set, llama-imatrix and llama-quantize
# themselves; else memwall's, which are byte-identical to them) and memwall calibrate quantize
# with each of METHODS, all scored by their KL divergence from the F16 on held-out Chinese text
# (fixtures/perplexity/heldout-24k.txt). The importance matrix and the calibration read other
# Chinese text (documents 60 on of fixtures/tiny-zh/heldout.jsonl, as bench/fit.sh).
# Models: tiny-zh F16; SmolLM2-135M-Instruct F16 from fixtures/cache (skipped when absent;
# its 576-wide matrices fall back to other types for most tensors, as llama-quantize does).
#
#   bench/lowbit.sh
#   LLAMA_CPP=/path/to/llama.cpp LLAMA_BUILD=build512 MODELS=tiny-zh bench/lowbit.sh
#   TYPES="IQ2_XXS IQ3_XXS" METHODS="awq awq+gptq" bench/lowbit.sh
set -euo pipefail
THREADS="${THREADS:-2}"
TYPES="${TYPES:-IQ2_XXS IQ2_XS IQ2_S IQ2_M IQ3_XXS IQ3_S IQ3_M}"
METHODS="${METHODS:-awq gptq awq+gptq}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
work="${WORK:-$(mktemp -d)}"
mkdir -p "$work"
cargo build -q --release --manifest-path "$root/Cargo.toml" -p memwall
mw="$root/target/release/memwall"
heldout="$root/fixtures/perplexity/heldout-24k.txt"
bin=""
[ -n "${LLAMA_CPP:-}" ] && bin="$LLAMA_CPP/${LLAMA_BUILD:-build}/bin"

python3 "$here/calib_zh_text.py" "$root" "$work/calib-zh.txt"

kld() {
  "$mw" perplexity -m "$1" --kl-divergence "$2" -t "$THREADS" --json 2>/dev/null |
    python3 -c 'import json, sys; print("%.6f" % json.load(sys.stdin)["kld"]["mean"])'
}

one_model() {
  local name="$1" f16="$2" ctx="$3"
  echo "== $name (KLD on windows of $ctx; imatrix ${bin:+by llama-imatrix, files by llama-quantize})"
  if [ -n "$bin" ]; then
    "$bin/llama-imatrix" -m "$f16" -f "$work/calib-zh.txt" -c "$ctx" -t "$THREADS" \
      -o "$work/$name-imatrix.gguf" > "$work/log" 2>&1 || { tail "$work/log"; exit 1; }
  else
    "$mw" calibrate imatrix -m "$f16" -f "$work/calib-zh.txt" -c "$ctx" -t "$THREADS" \
      -o "$work/$name-imatrix.gguf" > /dev/null 2>&1
  fi
  "$mw" perplexity -m "$f16" -f "$heldout" -c "$ctx" -t "$THREADS" --save-logits "$work/$name-base.kld" > /dev/null 2>&1
  printf '%-8s %10s %10s' type "bytes" "imatrix"
  for m in $METHODS; do printf ' | %10s %6s %6s' "$m" "÷ imat" secs; done
  echo
  for ty in $TYPES; do
    local ll="$work/$name-$ty.gguf"
    if [ -n "$bin" ]; then
      "$bin/llama-quantize" --imatrix "$work/$name-imatrix.gguf" "$f16" "$ll" "$ty" > "$work/log" 2>&1 ||
        { tail "$work/log"; exit 1; }
    else
      "$mw" quantize "$f16" "$ll" "$ty" --imatrix "$work/$name-imatrix.gguf" > /dev/null 2>&1
    fi
    local lk
    lk=$(kld "$ll" "$work/$name-base.kld")
    printf '%-8s %10d %10s' "$ty" "$(stat -c %s "$ll")" "$lk"
    for m in $METHODS; do
      local out="$work/$name-$m-$ty.gguf" start end ck
      start=$(date +%s.%N)
      "$mw" calibrate quantize -m "$f16" -f "$work/calib-zh.txt" --samples 32 --seq-len 256 -t "$THREADS" \
        --method "$m" --type "$ty" -o "$out" > "$work/log" 2>&1 || { tail "$work/log"; exit 1; }
      end=$(date +%s.%N)
      ck=$(kld "$out" "$work/$name-base.kld")
      printf ' | %10s %6.2f %6.1f' "$ck" "$(python3 -c "print($ck / $lk)")" "$(python3 -c "print($end - $start)")"
    done
    echo
  done
}

models=" ${MODELS:-tiny-zh smollm2} "
if [[ $models == *" tiny-zh "* ]]; then
  one_model tiny-zh "$root/fixtures/tiny-zh/reference/tiny-zh-f16.gguf" 128
fi
smol="$root/fixtures/cache/SmolLM2-135M-Instruct.Q4_1.gguf"
if [[ $models == *" smollm2 "* ]]; then
  if [ -f "$smol" ]; then
    "$mw" export "$smol" "$work/smol" > /dev/null
    "$mw" convert "$work/smol" -o "$work/smol-f16.gguf" --outtype f16 > /dev/null
    one_model smollm2 "$work/smol-f16.gguf" 256
  else
    echo "(SmolLM2 skipped: $smol is absent; fixtures/fetch.sh brings it)"
  fi
fi
echo "work files in $work"
