#!/usr/bin/env bash
# Calibration at scale, side by side with llama.cpp on the same tokens and threads:
#   llama-imatrix (-c SEQ -b SEQ) then llama-quantize --imatrix, against
#   memwall calibrate quantize --method awq | gptq | awq+gptq (Q4_K_M),
# on SmolLM2-135M-Instruct F16 (memwall's export of the wheel's model, converted back), and on
# synthetic models at real widths with few layers (memwall-synth presets, WIDE=...). For each run
# it prints the wall time, the ratio to llama.cpp's two steps, peak RSS, memwall's phases (layer
# passes, Hessians, AWQ search, GPTQ with its factorisations) and its estimate of peak memory;
# for SmolLM2 also the KL divergence from F16 on held-out Chinese text (16 windows of 256).
# From a wide model's per-layer phase times it prints the estimate for the whole model (the
# preset's layer count) with 128 × 512 calibration tokens on 16 cores, saying what it assumes.
#
#   LLAMA_CPP=/path/to/llama.cpp bench/calibrate-scale.sh
#     SAMPLES=32 SEQ=256 THREADS=2       calibration tokens and threads (both tools)
#     WIDE="llama-3.1-8b"                presets to run at LAYERS=2 (empty: SmolLM2 only)
#     METHODS="awq gptq awq+gptq"        memwall methods on SmolLM2 (wide models: awq+gptq)
#     MEMWALL=path/to/memwall            another build to measure (default: this tree's release)
#     LLAMA_BUILD=build512               llama.cpp's cmake build directory (default `build`)
set -euo pipefail
: "${LLAMA_CPP:?set LLAMA_CPP to a built llama.cpp tree}"
SAMPLES="${SAMPLES:-32}"
SEQ="${SEQ:-256}"
THREADS="${THREADS:-2}"
LAYERS="${LAYERS:-2}"
WIDE="${WIDE-llama-3.1-8b}"
METHODS="${METHODS:-awq gptq awq+gptq}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
bin="$LLAMA_CPP/${LLAMA_BUILD:-build}/bin"
work="${WORK:-$(mktemp -d)}"
mkdir -p "$work"
cargo build -q --release --manifest-path "$root/Cargo.toml" -p memwall -p memwall-fixtures
mw="${MEMWALL:-$root/target/release/memwall}"
synth="$root/target/release/memwall-synth"
calib="$root/fixtures/calib-zh"

# seconds and peak RSS (MiB) of a command, its stdout kept in $work/out.
timed() {
  /usr/bin/time -f "%e %M" -o "$work/time" "$@" > "$work/out" 2> "$work/err" || { tail "$work/err"; exit 1; }
  read -r secs kb < "$work/time"
  echo "$secs $((kb / 1024))"
}

# The calibration set (Chinese QA 30 %, Chinese documents 70 %) for a model, and its text.
make_set() {
  local model="$1" name="$2"
  "$mw" calibrate dataset -m "$model" --source qa="$calib/en-qa.jsonl" --source qa="$calib/webqa.jsonl" \
    --source long="$work/long-zh.jsonl" --mix qa=0.3,long=0.7 -n "$SAMPLES" --seq-len "$SEQ" \
    -o "$work/$name.jsonl" > /dev/null
  python3 -c "import json,sys; rows=[json.loads(l) for l in open(sys.argv[1])][1:]; open(sys.argv[2],'w').write(''.join(r['text'] for r in rows))" \
    "$work/$name.jsonl" "$work/$name.txt"
}

# llama-imatrix + llama-quantize --imatrix: "seconds peak_MiB".
llama_side() {
  local model="$1" name="$2"
  read -r s1 m1 < <(timed "$bin/llama-imatrix" -m "$model" -f "$work/$name.txt" -c "$SEQ" -b "$SEQ" -t "$THREADS" -o "$work/$name-imatrix.gguf")
  read -r s2 m2 < <(timed "$bin/llama-quantize" --imatrix "$work/$name-imatrix.gguf" "$model" "$work/$name-llama.gguf" Q4_K_M "$THREADS")
  python3 -c "print(f'{$s1 + $s2:.1f}', max($m1, $m2), f'{$s1:.1f}', f'{$s2:.1f}')"
}

python3 - "$root" "$work" <<'PY'
import json, re, sys
root, work = sys.argv[1:]
docs = [json.loads(l) for l in open(f"{root}/fixtures/tiny-zh/heldout.jsonl", encoding="utf-8")]
def cjk(t):
    c = len(re.findall(r"[\u4e00-\u9fff]", t)); l = len(re.findall(r"[A-Za-z]", t)); return c / max(1, c + l)
with open(f"{work}/long-zh.jsonl", "w", encoding="utf-8") as f:
    for i, d in list(enumerate(docs))[60:]:
        if cjk(d["text"]) >= 0.3:
            f.write(json.dumps({"text": d["text"]}, ensure_ascii=False) + "\n")
PY

phases() {
  python3 - "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
m = d["memory"]["total"] / 2**20
kept = d["memory"].get("kept", 0) / 2**20
fwd = d["forward_seconds"] - d["hessian_seconds"]
print(f"layers {fwd:.1f} s, Hessians {d['hessian_seconds']:.1f} s, AWQ {d['awq_seconds']:.1f} s, "
      f"GPTQ/encoding {d['quantize_seconds']:.1f} s (factorisations {d.get('factor_seconds', 0):.1f} s); "
      f"estimated peak {m:.0f} MiB "
      f"(of which {kept:.0f} MiB results kept between passes)")
PY
}

echo "== SmolLM2-135M-Instruct F16, Q4_K_M, $SAMPLES × $SEQ tokens, $THREADS threads"
"$mw" export "$root/fixtures/cache/SmolLM2-135M-Instruct.Q4_1.gguf" "$work/smol" > /dev/null
"$mw" convert "$work/smol" -o "$work/smol-f16.gguf" --outtype f16 > /dev/null
make_set "$work/smol-f16.gguf" smol
read -r lsecs lmib limat lquant < <(llama_side "$work/smol-f16.gguf" smol)
echo "llama-imatrix + llama-quantize: $lsecs s ($limat + $lquant), peak $lmib MiB"
"$mw" perplexity -m "$work/smol-f16.gguf" -f "$root/fixtures/perplexity/heldout-24k.txt" -c 256 --chunks 16 \
  --save-logits "$work/smol-base.kld" > /dev/null 2>&1
kld() { "$mw" perplexity -m "$1" --kl-divergence "$work/smol-base.kld" --json 2>/dev/null |
  python3 -c "import json,sys; print('%.5f' % json.load(sys.stdin)['kld']['mean'])"; }
lkld=$(kld "$work/smol-llama.gguf")
echo "  KLD vs F16 $lkld"
for m in $METHODS; do
  read -r secs mib < <(timed "$mw" calibrate quantize -m "$work/smol-f16.gguf" --dataset "$work/smol.jsonl" \
    --method "$m" --type Q4_K_M -t "$THREADS" --json -o "$work/smol-$m.gguf")
  cp "$work/out" "$work/smol-$m.json"
  k=$(kld "$work/smol-$m.gguf")
  python3 -c "print(f'memwall $m: {$secs} s = {$secs / $lsecs:.2f}× llama.cpp, peak $mib MiB, KLD $k = {$k / $lkld:.2f}× llama.cpp')"
  echo "  $(phases "$work/smol-$m.json")"
done

for preset in $WIDE; do
  echo
  echo "== $preset widths, $LAYERS layers, vocabulary 49152, Q4_K_M, $SAMPLES × $SEQ tokens, $THREADS threads"
  rm -rf "$work/$preset"
  "$synth" --preset "$preset" --layers "$LAYERS" --vocab 49152 --tokenizer "$root/fixtures/smollm2" --out "$work/$preset" > /dev/null
  "$mw" convert "$work/$preset" -o "$work/$preset-f16.gguf" --outtype f16 > /dev/null
  rm -rf "$work/${preset:?}"
  make_set "$work/$preset-f16.gguf" "$preset"
  read -r lsecs lmib limat lquant < <(llama_side "$work/$preset-f16.gguf" "$preset")
  echo "llama-imatrix + llama-quantize: $lsecs s ($limat + $lquant), peak $lmib MiB"
  read -r secs mib < <(timed "$mw" calibrate quantize -m "$work/$preset-f16.gguf" --dataset "$work/$preset.jsonl" \
    --type Q4_K_M -t "$THREADS" --json -o "$work/$preset-mw.gguf")
  cp "$work/out" "$work/$preset.json"
  python3 -c "print(f'memwall awq+gptq: {$secs} s = {$secs / $lsecs:.2f}× llama.cpp, peak $mib MiB')"
  echo "  $(phases "$work/$preset.json")"
  full=$("$synth" --list | awk -v p="$preset" '$1 == p { for (i = 1; i <= NF; i++) if ($i == "layers") print $(i + 1) }')
  python3 - "$work/$preset.json" "$full" "$SAMPLES" "$SEQ" "$THREADS" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
full, samples, seq, threads = map(int, sys.argv[2:])
n = len(d["layer_seconds"])
tokens, target = samples * seq, 128 * 512
per = lambda k: d[k] / n
fwd, hess = per("forward_seconds") - per("hessian_seconds"), per("hessian_seconds")
awq, gptq = per("awq_seconds"), per("quantize_seconds")
scale = threads / 16
layer = ((fwd + hess) * target / tokens + awq + gptq) * scale
print(f"  per layer: passes {fwd:.1f} s, Hessians {hess:.1f} s, AWQ {awq:.1f} s, GPTQ {gptq:.1f} s "
      f"(factorisations {per('factor_seconds'):.1f} s; layers {[round(s, 1) for s in d['layer_seconds']]})")
print(f"  estimate, {full} layers, 128 × 512 tokens, 16 cores: {layer * full / 3600:.1f} h "
      f"(passes and Hessians scale with the tokens, AWQ and GPTQ do not; every phase 8× faster on "
      f"16 cores than on {threads}, which is optimistic)")
mem = d["memory"]
grow = lambda k: mem.get(k, 0) * target / max(1, tokens)
other = mem["total"] - mem["hidden"] - mem.get("kept", 0)
print(f"  memory with 128 × 512 tokens: about {(other + grow('hidden')) / 2**30:.1f} GiB "
      f"(hidden states {grow('hidden') / 2**30:.1f} GiB), {grow('kept') / 2**30:.1f} GiB more for the results "
      f"kept between passes (left out, and recomputed, when over the limit)")
PY
done
echo "(files in $work)"
