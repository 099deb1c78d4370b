#!/usr/bin/env bash
# Quantization speed, memwall vs llama-quantize side by side: same input, same thread
# count, page cache warm, best of RUNS wall times per tool. Each memwall output is compared
# with llama-quantize's (cmp): the speed is only reported for identical files.
#
#   LLAMA_CPP=/path/to/llama.cpp bench/quantize.sh INPUT-F16.gguf [THREADS] [TYPE...]
#
# A suitable input with K-quant-friendly shapes (llama-3.1-8b widths, 2 layers, 0.84 B
# weights, 1.7 GB F16):
#   cargo run -p memwall-fixtures --release --bin memwall-synth -- --preset llama-3.1-8b \
#       --layers 2 --vocab 49152 --tokenizer fixtures/smollm2 --out /tmp/bench-llama
#   python convert_hf_to_gguf.py /tmp/bench-llama --outtype f16 --outfile /tmp/bench-llama-f16.gguf
# (until `memwall convert` lands, llama.cpp's converter makes the F16 GGUF).
#
# LLAMA_BUILD names the cmake build directory under LLAMA_CPP (default `build`; see
# bench/runtime.sh for the AVX-512 build without AMX).
#
# IMATRIX=FILE passes `--imatrix FILE` to both (the 1-2-bit i-quants and IQ3_XXS need one;
# e.g. from `memwall calibrate imatrix` or llama-imatrix on any text).
#
# TENSOR_TYPES="attn=nvfp4 ffn=nvfp4" passes each as `--tensor-type` to both (NVFP4 is no
# file type in llama-quantize: time it as overrides over another TYPE, e.g. Q8_0).
#
# memwall writes through <out>.partial and fsyncs before renaming; llama-quantize does
# not fsync. The times include that cost. Each run times llama-quantize, then memwall.
set -euo pipefail
: "${LLAMA_CPP:?set LLAMA_CPP to a llama.cpp source tree built with cmake (build/bin)}"
input="${1:?usage: bench/quantize.sh INPUT.gguf [THREADS] [TYPE...]}"
threads="${2:-2}"
shift $(( $# >= 2 ? 2 : 1 ))
types=("$@")
[ ${#types[@]} -gt 0 ] || types=(Q8_0 Q6_K Q5_K_M Q4_K_M Q3_K_M IQ4_XS Q4_0)
runs="${RUNS:-2}"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build --release --quiet -p memwall
mw="${CARGO_TARGET_DIR:-$PWD/target}/release/memwall"
lb="$LLAMA_CPP/${LLAMA_BUILD:-build}/bin"
lq="$lb/llama-quantize"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/memwall-bench.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
cat "$input" > /dev/null

imx=()
[ -n "${IMATRIX:-}" ] && imx=(--imatrix "$IMATRIX")
for tt in ${TENSOR_TYPES:-}; do imx+=(--tensor-type "$tt"); done

seconds() { # wall time in seconds of "$@"
  local t0 t1
  t0=$(date +%s.%N); "$@" > /dev/null 2>&1; t1=$(date +%s.%N)
  python3 -c "print(f'{$t1 - $t0:.3f}')"
}
less() { python3 -c "import sys; sys.exit(0 if $1 < $2 else 1)"; }

echo "input: $input ($(du -h "$input" | cut -f1)), threads: $threads, best of $runs"
[ -n "${TENSOR_TYPES:-}" ] && echo "tensor types: $TENSOR_TYPES"
echo "llama.cpp: $("$lb/llama-tokenize" --version 2>&1 | head -1)"
printf '%-8s %12s %12s %8s  %s\n' type llama-quantize memwall ratio output
for t in "${types[@]}"; do
  tl="" tm=""
  for _ in $(seq "$runs"); do
    a=$(seconds "$lq" "${imx[@]}" "$input" "$tmp/llama.gguf" "$t" "$threads")
    b=$(seconds "$mw" quantize "${imx[@]}" "$input" "$tmp/memwall.gguf" "$t" --threads "$threads")
    if [ -z "$tl" ] || less "$a" "$tl"; then tl=$a; fi
    if [ -z "$tm" ] || less "$b" "$tm"; then tm=$b; fi
  done
  if cmp -s "$tmp/llama.gguf" "$tmp/memwall.gguf"; then same=identical; else same=DIFFERENT; fi
  ratio=$(python3 -c "print(f'{$tl / $tm:.2f}x')")
  printf '%-8s %11ss %11ss %8s  %s\n' "$t" "$tl" "$tm" "$ratio" "$same"
done
