#!/usr/bin/env bash
# Budget-fitted files (`memwall calibrate fit`) against llama.cpp's mixes of the same size.
# For each model and each of llama.cpp's Q2_K, Q3_K_M and Q4_K_M (as llama-quantize --imatrix
# writes them with an importance matrix that has the output head's statistics too, as
# llama-imatrix --process-output makes it): a recipe fitted to that file's size, the
# file it makes (memwall quantize --recipe --imatrix), and with CALIBRATED=1 the awq+gptq
# files of the uniform type and of the recipe. Each is scored by its KL divergence from the
# F16 on held-out Chinese text (fixtures/perplexity/heldout-24k.txt), with the KLD the fit
# predicted. The importance matrix, the probes and the calibration use other Chinese text
# (documents 60 on of fixtures/tiny-zh/heldout.jsonl, as bench/calibrate.sh).
# Models: tiny-zh F16; SmolLM2-135M-Instruct F16 from fixtures/cache (skipped when absent).
#
#   bench/fit.sh
#   LLAMA_CPP=/path/to/llama.cpp LLAMA_BUILD=build512 CALIBRATED=1 bench/fit.sh
#       also runs llama-perplexity on each fitted file (it loads; same perplexity).
#   MODELS=tiny-zh bench/fit.sh      only the models named (tiny-zh, smollm2)
set -euo pipefail
THREADS="${THREADS:-2}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
work="${WORK:-$(mktemp -d)}"
mkdir -p "$work"
cargo build -q --release --manifest-path "$root/Cargo.toml" -p memwall
mw="$root/target/release/memwall"
heldout="$root/fixtures/perplexity/heldout-24k.txt"

python3 "$here/calib_zh_text.py" "$root" "$work/calib-zh.txt"

kld() {
  "$mw" perplexity -m "$1" --kl-divergence "$2" -t "$THREADS" --json 2>/dev/null |
    python3 -c 'import json, sys; print("%.6f" % json.load(sys.stdin)["kld"]["mean"])'
}

one_model() {
  local name="$1" f16="$2" ctx="$3"
  echo "== $name (windows of $ctx)"
  "$mw" calibrate imatrix -m "$f16" -f "$work/calib-zh.txt" -c "$ctx" -t "$THREADS" --process-output \
    -o "$work/$name-imatrix.gguf" > /dev/null 2>&1
  "$mw" perplexity -m "$f16" -f "$heldout" -c "$ctx" -t "$THREADS" --save-logits "$work/$name-base.kld" > /dev/null 2>&1
  printf '%-8s %10s %10s | %10s %10s %10s %7s %6s' size "llama B" "llama KLD" "fit B" "fit KLD" predicted "fit/ll" secs
  [ -n "${CALIBRATED:-}" ] && printf ' | %10s %10s %7s' "cal. type" "cal. fit" "c.fit/ll"
  echo
  for ty in Q2_K Q3_K_M Q4_K_M; do
    local ll="$work/$name-$ty.gguf" fit="$work/$name-fit-$ty"
    "$mw" quantize "$f16" "$ll" "$ty" --imatrix "$work/$name-imatrix.gguf" > /dev/null 2>&1
    local size start end
    size=$(stat -c %s "$ll")
    start=$(date +%s.%N)
    "$mw" calibrate fit -m "$f16" --imatrix "$work/$name-imatrix.gguf" -f "$work/calib-zh.txt" --probe-ctx "$ctx" \
      --chunks 16 -t "$THREADS" --budget "$size" -o "$fit.toml" --json > "$fit.json"
    end=$(date +%s.%N)
    "$mw" quantize "$f16" "$fit.gguf" --recipe "$fit.toml" --imatrix "$work/$name-imatrix.gguf" > /dev/null 2>&1
    local lk fk pred
    lk=$(kld "$ll" "$work/$name-base.kld")
    fk=$(kld "$fit.gguf" "$work/$name-base.kld")
    pred=$(python3 -c "import json; print('%.6f' % json.load(open('$fit.json'))['predicted_kld'])")
    printf '%-8s %10d %10s | %10d %10s %10s %7.2f %6.1f' "$ty" "$size" "$lk" "$(stat -c %s "$fit.gguf")" "$fk" "$pred" \
      "$(python3 -c "print($fk / $lk)")" "$(python3 -c "print($end - $start)")"
    if [ -n "${CALIBRATED:-}" ]; then
      "$mw" calibrate quantize -m "$f16" -f "$work/calib-zh.txt" --samples 32 --seq-len 256 -t "$THREADS" \
        --method awq+gptq --type "$ty" -o "$work/$name-cal-$ty.gguf" > /dev/null 2>&1
      "$mw" calibrate quantize -m "$f16" -f "$work/calib-zh.txt" --samples 32 --seq-len 256 -t "$THREADS" \
        --method awq+gptq --recipe "$fit.toml" -o "$fit-cal.gguf" > /dev/null 2>&1
      local ck cfk
      ck=$(kld "$work/$name-cal-$ty.gguf" "$work/$name-base.kld")
      cfk=$(kld "$fit-cal.gguf" "$work/$name-base.kld")
      printf ' | %10s %10s %7.2f' "$ck" "$cfk" "$(python3 -c "print($cfk / $lk)")"
    fi
    echo
    if [ -n "${LLAMA_CPP:-}" ]; then
      local bin="$LLAMA_CPP/${LLAMA_BUILD:-build}/bin"
      printf '         llama-perplexity on the fitted file: %s; memwall: %s\n' \
        "$("$bin/llama-perplexity" -m "$fit.gguf" -f "$heldout" -c "$ctx" -t "$THREADS" 2>&1 |
            grep -o 'Final estimate: PPL = [0-9.]*' | grep -o '[0-9.]*$')" \
        "$("$mw" perplexity -m "$fit.gguf" -f "$heldout" -c "$ctx" -t "$THREADS" |
            grep -o 'Final estimate: PPL = [0-9.]*' | grep -o '[0-9.]*$')"
    fi
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
