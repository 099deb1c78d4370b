#!/usr/bin/env bash
# The compact KL-divergence reference (`memwall perplexity --save-logits F --top-k K`) against
# the full one (llama.cpp's --kl-divergence-base format) on the same windows: file sizes, and
# the mean, median and 99th-percentile KLD of a Q4_K_M and a Q2_K of the model against each.
# Models: tiny-zh F16, and SmolLM2-135M-Instruct F16 made from fixtures/cache's Q4_1 (skipped
# when the cache is absent). Text: fixtures/perplexity/heldout-24k.txt.
#
#   bench/kld-top-k.sh                   (KS="8 64", CTX=128 for tiny-zh, 256 for SmolLM2)
#   LLAMA_CPP=/path/to/llama.cpp LLAMA_BUILD=build512 bench/kld-top-k.sh
#       also prints llama-perplexity's KLD of the same quantized files from the full reference.
set -euo pipefail
KS="${KS:-8 64}"
THREADS="${THREADS:-2}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
work="${WORK:-$(mktemp -d)}"
mkdir -p "$work"
cargo build -q --release --manifest-path "$root/Cargo.toml" -p memwall
mw="$root/target/release/memwall"
text="$root/fixtures/perplexity/heldout-24k.txt"

stats() {
  "$mw" perplexity -m "$1" --kl-divergence "$2" -t "$THREADS" --json 2>/dev/null | python3 -c '
import json, sys
d = json.load(sys.stdin)["kld"]
print(d["mean"], d["median"], d["percentiles"]["99.0"])'
}

one_model() {
  local name="$1" f16="$2" ctx="$3"
  echo "== $name, windows of $ctx"
  for ty in Q4_K_M Q2_K; do
    "$mw" quantize "$f16" "$work/$name-$ty.gguf" "$ty" > /dev/null 2>&1
  done
  "$mw" perplexity -m "$f16" -f "$text" -c "$ctx" -t "$THREADS" --save-logits "$work/$name-full.kld" > /dev/null 2>&1
  for k in $KS; do
    "$mw" perplexity -m "$f16" -f "$text" -c "$ctx" -t "$THREADS" --save-logits "$work/$name-top$k.kld" \
      --top-k "$k" > /dev/null 2>&1
  done
  printf '%-10s %-8s %12s %10s %10s %10s %9s\n' type reference bytes mean median p99 "vs full"
  for ty in Q4_K_M Q2_K; do
    read -r fmean fmed fp99 < <(stats "$work/$name-$ty.gguf" "$work/$name-full.kld")
    printf '%-10s %-8s %12d %10.6f %10.6f %10.6f %9s\n' "$ty" full \
      "$(stat -c %s "$work/$name-full.kld")" "$fmean" "$fmed" "$fp99" ""
    for k in $KS; do
      read -r mean med p99 < <(stats "$work/$name-$ty.gguf" "$work/$name-top$k.kld")
      printf '%-10s %-8s %12d %10.6f %10.6f %10.6f %+8.2f%%\n' "$ty" "top-$k" \
        "$(stat -c %s "$work/$name-top$k.kld")" "$mean" "$med" "$p99" \
        "$(python3 -c "print(100 * ($mean / $fmean - 1))")"
    done
    if [ -n "${LLAMA_CPP:-}" ]; then
      local bin="$LLAMA_CPP/${LLAMA_BUILD:-build}/bin"
      "$bin/llama-perplexity" -m "$work/$name-$ty.gguf" --kl-divergence-base "$work/$name-full.kld" \
        --kl-divergence -t "$THREADS" > "$work/llama.log" 2>&1
      printf '%-10s %-8s %s\n' "$ty" "llama" "$(grep -m1 'Mean    KLD' "$work/llama.log")"
    fi
  done
}

one_model tiny-zh "$root/fixtures/tiny-zh/reference/tiny-zh-f16.gguf" "${CTX:-128}"
smol="$root/fixtures/cache/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ -f "$smol" ]; then
  "$mw" export "$smol" "$work/smol" > /dev/null
  "$mw" convert "$work/smol" -o "$work/smol-f16.gguf" --outtype f16 > /dev/null
  one_model smollm2 "$work/smol-f16.gguf" "${CTX:-256}"
else
  echo "(SmolLM2 skipped: $smol is absent; fixtures/fetch.sh brings it)"
fi
echo "work files in $work"
