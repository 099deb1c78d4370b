#!/usr/bin/env bash
# The phone build: `memwall` cross-built for aarch64 and linked statically
# (scripts/phone-build.sh, target/phone/memwall: what `push --with-runtime` sends), then run
# under `qemu-aarch64 -cpu max` (NEON with dot products) with no library path and no
# loader, as a stock phone would run it, for run (also streaming), bench, perplexity and
# validate on tiny-zh. The generated text and the perplexity must equal the x86-64 build's
# bit for bit (the kernels and the forward pass's math are the same on every CPU).
# Called by scripts/test.sh after scripts/setup-aarch64.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/phone-build.sh
# The x86-64 side: the binary `cargo test` built (same code, same bits; no second build).
[ -x target/debug/memwall ] || cargo build --quiet --locked -p memwall
arm=(env -u LD_LIBRARY_PATH -u QEMU_LD_PREFIX qemu-aarch64 -cpu max target/phone/memwall)
x86=(target/debug/memwall)
model=fixtures/tiny-zh/reference/tiny-zh-f16.gguf
text=fixtures/perplexity/heldout-24k.txt
field() { python3 -c "import json, sys; print(json.load(sys.stdin)$1)"; }
for tool in arm x86; do
  declare -n cmd="$tool"
  "${cmd[@]}" run -m "$model" -p "北京是" -n 12 --temp 0 --json | field "['text']" > "target/phone-run-$tool.txt"
  "${cmd[@]}" perplexity -m "$model" -f "$text" -c 64 --chunks 2 --json | field "['ppl']" > "target/phone-ppl-$tool.txt"
  "${cmd[@]}" run -m "$model" -p "北京是" -n 12 --temp 0 --json --resident 2 | field "['text']" > "target/phone-stream-$tool.txt"
done
cmp target/phone-stream-arm.txt target/phone-run-x86.txt
cmp target/phone-run-arm.txt target/phone-run-x86.txt
cmp target/phone-ppl-arm.txt target/phone-ppl-x86.txt
"${arm[@]}" validate "$model" > /dev/null
"${arm[@]}" bench -m "$model" -p 16 -n 4 -r 1 --json | field "['kernels']" | grep -q neon
echo "phone build (static, no loader): run, streaming run, perplexity ($(cat target/phone-ppl-arm.txt)), validate and bench agree with x86-64 under qemu"
