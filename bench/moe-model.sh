#!/usr/bin/env bash
# A synthetic mixture of experts at Qwen3-30B-A3B's widths for the memory-wall benchmark:
# hidden 2048, 128 experts of FFN 768 with 8 routed per token, 32 query / 4 KV heads of 128,
# 2 layers (of 48) and SmolLM2's tokenizer (vocab 49 152), converted to Q8_0 (1.5 GB).
# The routers are skewed (memwall-synth --router-skew, default 0.25): each expert's router
# row is scaled by exp(skew · z), z the normal quantile of its rank in a per-layer shuffle,
# which puts 90 % of a layer's routing in about half of its experts, as llama-imatrix's
# counts show for Qwen3-30B-A3B (docs/BENCHMARKS.md has the source and the measured skew).
# Its text is noise: use it for speed, memory and bytes read.
#
#   bench/moe-model.sh OUT.gguf [SKEW]     then   bench/memwall.sh OUT.gguf 30,60,90
set -euo pipefail
out="${1:?usage: bench/moe-model.sh OUT.gguf [SKEW]}"
skew="${2:-0.25}"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build --release --quiet -p memwall -p memwall-fixtures
bin="$PWD/target/release"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/memwall-moe.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
"$bin/memwall-synth" --preset qwen3-30b-a3b --layers 2 --vocab 49152 --router-skew "$skew" \
  --tokenizer fixtures/smollm2 --out "$tmp/hf"
"$bin/memwall" convert "$tmp/hf" -o "$out" --outtype q8_0
