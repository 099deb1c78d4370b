#!/usr/bin/env bash
# Conversion speed and memory, memwall vs llama.cpp's convert_hf_to_gguf.py side by side on
# the same synthetic checkpoint (default: Command-R-35B's widths, 2 layers, 7.5 GB BF16),
# page cache warm (caches dropped first when run as root, so both start alike; memwall runs
# before and after llama.cpp). Prints wall time, throughput (input GB/s) and peak RSS of
# each run, and whether the outputs are identical.
#
#   LLAMA_CPP=/path/to/llama.cpp PYTHON=/path/to/venv/bin/python bench/convert.sh [PRESET] [LAYERS] [OUTTYPE]
set -euo pipefail
: "${LLAMA_CPP:?set LLAMA_CPP to a llama.cpp source tree}"
PYTHON="${PYTHON:-python3}"
preset="${1:-command-r-35b}"
layers="${2:-2}"
outtype="${3:-f16}"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build --release --quiet -p memwall -p memwall-fixtures
tmp="$(mktemp -d "${TMPDIR:-/tmp}/memwall-bench.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
ckpt="$tmp/$preset"
target/release/memwall-synth --preset "$preset" --layers "$layers" --tokenizer fixtures/smollm2 --out "$ckpt" > /dev/null
size=$(du -sb "$ckpt" | cut -f1)
# The same page-cache state for both: only the input cached (dropping caches needs root;
# without it the runs share whatever the cache holds), the input read once to warm it.
settle() {
  sync
  if [ -w /proc/sys/vm/drop_caches ]; then echo 1 > /proc/sys/vm/drop_caches; fi
  cat "$ckpt"/*.safetensors > /dev/null
}
measure() { # label, command...: prints "label seconds peak_kb"
  local label=$1; shift
  settle
  /usr/bin/time -f "%e %M" -o "$tmp/time" "$@" > "$tmp/$label.log" 2>&1 || { tail "$tmp/$label.log"; exit 1; }
  echo "$label $(cat "$tmp/time")"
}
m=$(measure memwall target/release/memwall convert "$ckpt" --outtype "$outtype" -o "$tmp/memwall.gguf")
l=$(measure llama env PYTHONPATH="$LLAMA_CPP/gguf-py" "$PYTHON" "$LLAMA_CPP/convert_hf_to_gguf.py" "$ckpt" --outtype "$outtype" --outfile "$tmp/llama.gguf")
if cmp -s "$tmp/memwall.gguf" "$tmp/llama.gguf"; then same=identical; else same=DIFFERENT; fi
rm -f "$tmp/memwall.gguf"
m2=$(measure memwall target/release/memwall convert "$ckpt" --outtype "$outtype" -o "$tmp/memwall.gguf")
echo "input: $preset, $layers layers, $(python3 -c "print(f'{$size/1e9:.2f}')") GB BF16, outtype $outtype; outputs $same"
python3 - "$size" "$m" "$l" "$m2" <<'PY'
import sys
size = int(sys.argv[1])
rows = [a.split() for a in sys.argv[2:]]
for name, s, kb in rows:
    print(f"{name:8} {float(s):8.1f} s  {size / 1e9 / float(s):6.2f} GB/s  peak RSS {int(kb) / 1024:8.0f} MB")
# memwall ran before and after llama.cpp; the slower of its two runs is compared.
(_, ms1, mk1), (_, ls, lk), (_, ms2, mk2) = rows
ms, mk = max(float(ms1), float(ms2)), max(int(mk1), int(mk2))
print(f"memwall (slower run) is {float(ls) / ms:.2f}x faster, with {int(lk) / mk:.1f}x less peak RSS")
PY
