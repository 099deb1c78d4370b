#!/usr/bin/env bash
# Calibrated Q4_K_M of tiny-zh, side by side with llama.cpp:
#   llama-quantize without an imatrix; llama-imatrix on the calibration set's text, then
#   llama-quantize --imatrix; memwall calibrate quantize --method awq | gptq | awq+gptq.
# Each is evaluated on Chinese held-out text (fixtures/perplexity/heldout-24k.txt) and on
# English held-out man pages (documents of fixtures/tiny-zh/heldout.jsonl that no calibration
# set uses): KL divergence against the F16 model, perplexity (memwall perplexity, and
# llama-perplexity on the same file to show it loads and agrees), file size.
# Two calibration sets: Chinese (fixtures/calib-zh QA 30 % + Chinese held-out documents past
# the evaluation text 70 %) and English (fixtures/calib-zh/en-qa.jsonl 30 % + other English
# held-out man pages 70 %), both SAMPLES × SEQ tokens.
#
#   LLAMA_CPP=/path/to/llama.cpp bench/calibrate.sh            (SAMPLES=32 SEQ=256 by default)
#   SMOLLM2=1 also times awq+gptq on SmolLM2-135M-Instruct F16 (needs fixtures/cache).
set -euo pipefail
: "${LLAMA_CPP:?set LLAMA_CPP to a built llama.cpp tree}"
SAMPLES="${SAMPLES:-32}"
SEQ="${SEQ:-256}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
bin="$LLAMA_CPP/${LLAMA_BUILD:-build}/bin"
work="${WORK:-$(mktemp -d)}"
mkdir -p "$work"
cargo build -q --release --manifest-path "$root/Cargo.toml" -p memwall
mw="$root/target/release/memwall"
f16="$root/fixtures/tiny-zh/reference/tiny-zh-f16.gguf"
calib="$root/fixtures/calib-zh"
time_of() { /usr/bin/time -f "%e s, %M KB peak RSS" -o "$work/time" "$@" > "$work/log" 2>&1 || { tail "$work/log"; exit 1; }; cat "$work/time"; }

# Texts.
python3 - "$root" "$work" <<'PY'
import json, re, sys
root, work = sys.argv[1:]
docs = [json.loads(l) for l in open(f"{root}/fixtures/tiny-zh/heldout.jsonl", encoding="utf-8")]
def cjk(t):
    c = len(re.findall(r"[\u4e00-\u9fff]", t)); l = len(re.findall(r"[A-Za-z]", t)); return c / max(1, c + l)
# Documents 0..42 are the Chinese evaluation text (heldout-24k.txt).
later = list(enumerate(docs))[60:]
english = [(i, d) for i, d in later if cjk(d["text"]) < 0.05 and len(d["text"]) > 100]
eval_en = english[1::3] + english[2::3][:1]
eval_ids = {i for i, _ in eval_en}
with open(f"{work}/eval-en.txt", "w", encoding="utf-8") as f:
    f.write("\n\n".join(d["text"] for _, d in eval_en))
with open(f"{work}/long-en.jsonl", "w", encoding="utf-8") as f:
    for i, d in english:
        if i not in eval_ids:
            f.write(json.dumps({"text": d["text"]}, ensure_ascii=False) + "\n")
with open(f"{work}/long-zh.jsonl", "w", encoding="utf-8") as f:
    for i, d in later:
        if cjk(d["text"]) >= 0.3:
            f.write(json.dumps({"text": d["text"]}, ensure_ascii=False) + "\n")
PY
cp "$root/fixtures/perplexity/heldout-24k.txt" "$work/eval-zh.txt"

# Calibration sets, and their text for llama-imatrix.
"$mw" calibrate dataset -m "$f16" --source qa="$calib/cmrc.jsonl" --source qa="$calib/webqa.jsonl" \
  --source qa="$calib/alpaca.jsonl" --source qa="$calib/squad.json" --source qa="$calib/faq.parquet" \
  --source long="$work/long-zh.jsonl" --mix qa=0.3,long=0.7 -n "$SAMPLES" --seq-len "$SEQ" \
  -o "$work/zh.jsonl" > /dev/null
"$mw" calibrate dataset -m "$f16" --source qa="$calib/en-qa.jsonl" --source long="$work/long-en.jsonl" \
  --mix qa=0.3,long=0.7 -n "$SAMPLES" --seq-len "$SEQ" --repeat -o "$work/en.jsonl" > /dev/null
for set in zh en; do
  python3 -c "import json,sys; rows=[json.loads(l) for l in open(sys.argv[1])][1:]; open(sys.argv[2],'w').write(''.join(r['text'] for r in rows))" \
    "$work/$set.jsonl" "$work/$set.txt"
done

# Quantizations.
echo "== making the quantizations ($SAMPLES × $SEQ tokens per set)"
"$bin/llama-quantize" "$f16" "$work/llama-plain.gguf" Q4_K_M > "$work/log" 2>&1
for set in zh en; do
  "$bin/llama-imatrix" -m "$f16" -f "$work/$set.txt" -c "$SEQ" -b "$SEQ" -t 2 -o "$work/imatrix-$set.gguf" > "$work/log" 2>&1
  "$bin/llama-quantize" --imatrix "$work/imatrix-$set.gguf" "$f16" "$work/llama-imatrix-$set.gguf" Q4_K_M > "$work/log" 2>&1
  for m in awq gptq awq+gptq; do
    printf "memwall %-9s %s: " "$m" "$set"
    time_of "$mw" calibrate quantize -m "$f16" --dataset "$work/$set.jsonl" --method "$m" --type Q4_K_M \
      -o "$work/memwall-$m-$set.gguf"
  done
done

# Evaluation.
for lang in zh en; do
  "$mw" perplexity -m "$f16" -f "$work/eval-$lang.txt" -c 256 --save-logits "$work/base-$lang.kld" > /dev/null 2>&1
done
echo
echo "| model | calibration | size (bytes) | KLD zh | PPL zh (memwall / llama.cpp) | KLD en | PPL en (memwall / llama.cpp) |"
echo "|---|---|---|---|---|---|---|"
row() {
  local name="$1" file="$2" set="$3" line="| $1 | $3 | $(stat -c %s "$2") |"
  for lang in zh en; do
    read -r kld ppl < <("$mw" perplexity -m "$file" --kl-divergence "$work/base-$lang.kld" --json 2>/dev/null |
      python3 -c "import json,sys; d=json.load(sys.stdin); print(d['kld']['mean'], d['ppl']['value'])")
    lppl=$("$bin/llama-perplexity" -m "$file" -f "$work/eval-$lang.txt" -c 256 -t 2 2>&1 | sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p')
    line="$line $(printf '%.6f' "$kld") | $(printf '%.4f' "$ppl") / $lppl |"
  done
  echo "$line"
}
row "F16" "$f16" "-"
row "llama-quantize" "$work/llama-plain.gguf" "none"
for set in zh en; do
  row "llama-imatrix + llama-quantize" "$work/llama-imatrix-$set.gguf" "$set"
  for m in awq gptq awq+gptq; do row "memwall $m" "$work/memwall-$m-$set.gguf" "$set"; done
done

if [ "${SMOLLM2:-0}" = 1 ]; then
  echo
  echo "== SmolLM2-135M-Instruct F16, awq+gptq Q4_K_M, $SAMPLES × $SEQ tokens"
  "$mw" export "$root/fixtures/cache/SmolLM2-135M-Instruct.Q4_1.gguf" "$work/smol" > /dev/null
  "$mw" convert "$work/smol" -o "$work/smol-f16.gguf" --outtype f16 > /dev/null
  "$mw" calibrate dataset -m "$work/smol-f16.gguf" --source qa="$calib/en-qa.jsonl" --source qa="$calib/webqa.jsonl" \
    --source long="$work/long-zh.jsonl" --mix qa=0.3,long=0.7 -n "$SAMPLES" --seq-len "$SEQ" -o "$work/smol.jsonl" > /dev/null
  printf "memwall awq+gptq smollm2: "
  time_of "$mw" calibrate quantize -m "$work/smol-f16.gguf" --dataset "$work/smol.jsonl" --type Q4_K_M -o "$work/smol-awq-gptq.gguf"
  "$mw" perplexity -m "$work/smol-f16.gguf" -f "$work/eval-zh.txt" -c 256 --chunks 8 --save-logits "$work/smol-base.kld" > /dev/null 2>&1
  "$bin/llama-quantize" "$work/smol-f16.gguf" "$work/smol-plain.gguf" Q4_K_M > "$work/log" 2>&1
  for f in smol-plain smol-awq-gptq; do
    printf "%s: " "$f"
    "$mw" perplexity -m "$work/$f.gguf" --kl-divergence "$work/smol-base.kld" --json 2>/dev/null |
      python3 -c "import json,sys; d=json.load(sys.stdin); print('KLD %.5f, PPL %.4f' % (d['kld']['mean'], d['ppl']['value']))"
  done
fi
echo "(files in $work)"
