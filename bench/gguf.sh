#!/usr/bin/env bash
# GGUF container speed, memwall vs llama.cpp side by side, on the SmolLM2 GGUF
# (98 MB, 49152-token vocabulary: the header alone is 1.7 MB of metadata).
#
#   LLAMA_CPP=/path/to/llama.cpp bench/gguf.sh
#
# open: map/read the file and parse the whole header (metadata + tensor infos)
#   memwall  GgufFile::open (mmap, every metadata value decoded)
#   llama.cpp gguf_init_from_file(no_alloc = true)
#   gguf-py  GGUFReader (numpy memmap), for reference
# copy: rewrite the file to a new GGUF on the same disk, fsynced
#   memwall  GgufWriter::create + commit (streams from the mapping)
#   llama.cpp llama-quantize --allow-requantize IN OUT COPY
set -euo pipefail
: "${LLAMA_CPP:?set LLAMA_CPP to a llama.cpp source tree built with cmake (build/bin)}"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
fixtures/fetch.sh > /dev/null
file=fixtures/cache/SmolLM2-135M-Instruct.Q4_1.gguf
tmp="$(mktemp -d "${TMPDIR:-/tmp}/memwall-bench.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

cargo build --release --quiet -p memwall-format --example gguf_bench
mw=target/release/examples/gguf_bench
bin="$LLAMA_CPP/${LLAMA_BUILD:-build}/bin"
cc -O2 -I"$LLAMA_CPP/ggml/include" bench/gguf_open.c -o "$tmp/gguf_open" \
  -L"$bin" -lggml-base -Wl,-rpath,"$bin"

# Warm the page cache so that both read from memory.
cat "$file" > /dev/null

ratio() { python3 -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.2f}')" "$@"; }

m_open=$("$mw" open "$file" 50)
l_open=$("$tmp/gguf_open" "$file" 50)
p_open=$(python3 - "$file" <<'PY'
import statistics, sys, time
import gguf
ts = []
for _ in range(10):
    t = time.perf_counter(); gguf.GGUFReader(sys.argv[1]); ts.append((time.perf_counter() - t) * 1e3)
print(f"{statistics.median(ts):.3f}")
PY
)
m_copy=$("$mw" copy "$file" "$tmp/m.gguf" 5)
l_copy=$(python3 - "$bin/llama-quantize" "$file" "$tmp/l.gguf" <<'PY'
import statistics, subprocess, sys, time
ts = []
for _ in range(5):
    t = time.perf_counter()
    subprocess.run([sys.argv[1], "--allow-requantize", sys.argv[2], sys.argv[3], "COPY"],
                   check=True, capture_output=True)
    ts.append((time.perf_counter() - t) * 1e3)
print(f"{statistics.median(ts):.3f}")
PY
)
cmp -s "$file" "$tmp/m.gguf" && same="byte-identical to the input" || same="DIFFERS from the input"

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "file:    $file ($(stat -c %s "$file") bytes)"
printf '%-6s %12s %12s %12s %18s\n' task memwall_ms llama.cpp_ms gguf-py_ms llama.cpp/memwall
printf '%-6s %12s %12s %12s %18s\n' open "$m_open" "$l_open" "$p_open" "$(ratio "$l_open" "$m_open")"
printf '%-6s %12s %12s %12s %18s\n' copy "$m_copy" "$l_copy" - "$(ratio "$l_copy" "$m_copy")"
echo "memwall's copy is $same"
