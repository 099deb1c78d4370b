#!/usr/bin/env bash
# How well `memwall plan` predicts this machine: a device profile measured by
# `memwall plan --measure-host`, then for each model the predicted decode speed
# (at 32 cached tokens, as a 64-token decode from an empty cache averages) next to
# `memwall bench -n 64`, and the predicted memory next to the peak RSS of
# `memwall run --no-mmap` on a prompt of about CTX tokens.
#
#   bench/plan.sh [THREADS] [CTX]
#
# Models: tiny-zh F16 and its Q8_0/Q4_K_M; SmolLM2-135M-Instruct's Q4_1 and (with
# SMOLLM2=1) its F16, Q8_0 and Q4_K_M (exported and converted by memwall).
set -euo pipefail
threads="${1:-2}"
ctx="${2:-1024}"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build --release --quiet -p memwall
fixtures/fetch.sh > /dev/null
mw="$PWD/target/release/memwall"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/memwall-plan.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
tiny=fixtures/tiny-zh/reference/tiny-zh-f16.gguf
models=("$tiny")
for t in Q8_0 Q4_K_M; do
  "$mw" quantize "$tiny" "$tmp/tiny-zh-$t.gguf" "$t" > /dev/null 2>&1
  models+=("$tmp/tiny-zh-$t.gguf")
done
models+=(fixtures/cache/SmolLM2-135M-Instruct.Q4_1.gguf)
if [ "${SMOLLM2:-0}" = 1 ]; then
  "$mw" export fixtures/cache/SmolLM2-135M-Instruct.Q4_1.gguf "$tmp/smol" > /dev/null
  "$mw" convert "$tmp/smol" -o "$tmp/smollm2-F16.gguf" --outtype f16 > /dev/null
  models+=("$tmp/smollm2-F16.gguf")
  for t in Q8_0 Q4_K_M; do
    "$mw" quantize "$tmp/smollm2-F16.gguf" "$tmp/smollm2-$t.gguf" "$t" > /dev/null 2>&1
    models+=("$tmp/smollm2-$t.gguf")
  done
fi
"$mw" plan --measure-host --save "$tmp/host.toml" -t "$threads" > /dev/null 2>&1
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; threads $threads; $(date -u +%F)"
grep -E 'ram_bandwidth|compute_gweights|dispatch' "$tmp/host.toml" | tr '\n' ' '; echo
printf '%-34s %11s %11s %7s   %11s %11s %7s\n' model "pred t/s" "bench t/s" ratio "pred MiB" "RSS MiB" ratio
python3 - "$mw" "$tmp" "$threads" "$ctx" "${models[@]}" <<'PY'
import json, subprocess, sys
mw, tmp, threads, ctx, models = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:]
text = open("fixtures/perplexity/heldout-24k.txt", encoding="utf-8").read()
def j(args):
    return json.loads(subprocess.run([mw] + args, capture_output=True, check=True, text=True).stdout)
for m in models:
    pred = j(["plan", m, "--device", f"{tmp}/host.toml", "-c", "64", "--types", "Q8_0", "--json"])
    speed = pred["rows"][0]["decode"]["tokens_per_s"]
    bench = j(["bench", "-m", m, "-p", "0", "-n", "64", "-r", "3", "-t", threads, "--json"])
    meas = bench["results"][0]["tokens_per_second"]
    # A prompt of about ctx tokens: 3 characters a token for tiny-zh, 1 for SmolLM2.
    chars = ctx * (3 if "tiny" in m else 1)
    prompt = f"{tmp}/prompt.txt"
    open(prompt, "w", encoding="utf-8").write(text[:chars])
    run = j(["run", "-m", m, "-f", prompt, "-c", "8192", "-n", "2", "--temp", "0", "--no-mmap",
             "-t", threads, "--json"])
    tokens = run["prompt_tokens"] + 2
    mem = j(["plan", m, "-c", str(tokens), "--types", "Q8_0", "--json"])["rows"][0]["memwall"]["total_bytes"]
    rss = run["peak_rss_bytes"]
    name = m.split("/")[-1]
    print(f"{name:34} {speed:11.1f} {meas:11.1f} {speed/meas:7.2f}   {mem/2**20:11.1f} {rss/2**20:11.1f} {mem/rss:7.2f}")
PY
