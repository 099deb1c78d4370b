#!/usr/bin/env bash
# The memory wall: decode speed when the model does not fit in the memory the process may
# use. Runs llama-bench (mmap, the OS page cache decides what stays) and memwall bench in
# streaming mode (--resident: the most reused weights locked, the rest read past the page
# cache into a ring of buffers ahead of use) inside the same cgroup memory cap, with the
# page cache dropped before each run. Prints decode tokens/s, the ratio, peak memory of the
# cgroup, and the bound set by the disk: bandwidth ÷ bytes that must be read per token.
# CAP_PERCENTS is one cap or several (30,60,90); at each, the two run ROUNDS times
# (default 1), alternated, and the best of each is compared. A mixture of experts streams
# one expert at a time into a cache of the most used ones: the lines for it give the
# cache's hit rate, the bytes it read per token, and those bytes against what the misses
# predict (routed experts per token × miss rate × an expert's bytes). MEMWALL_FLAGS adds
# flags to memwall bench (e.g. --expert-guess, --expert-profile IMATRIX).
#
#   LLAMA_CPP=/path/to/llama.cpp bench/memwall.sh [MODEL.gguf] [CAP_PERCENTS] [THREADS]
#   e.g. ROUNDS=2 PLAN=1 GEN=64 bench/memwall.sh moe.gguf 30,60,90
#
# Needs root and the cgroup-v1 memory controller at /sys/fs/cgroup/memory (or cgroup v2 at
# /sys/fs/cgroup). Default model: SmolLM2-135M-Instruct at F16 (270 MB), built by memwall;
# bench/wide-model.sh builds a 1 GB dense one (GEN=16 keeps llama.cpp's run short),
# bench/moe-model.sh a 1.5 GB mixture of experts at Qwen3-30B-A3B's widths.
set -euo pipefail
: "${LLAMA_CPP:?set LLAMA_CPP to a llama.cpp source tree built with cmake (build/bin)}"
model="${1:-}"
percents="${2:-60}"
threads="${3:-2}"
gen="${GEN:-32}"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build --release --quiet -p memwall
mw="$PWD/target/release/memwall"
lb="$LLAMA_CPP/${LLAMA_BUILD:-build}/bin/llama-bench"  # LLAMA_BUILD: see bench/runtime.sh
tmp="$(mktemp -d "${TMPDIR:-/tmp}/memwall-wall.XXXXXX")"
cg=""
cleanup() { [ -n "$cg" ] && rmdir "$cg" 2> /dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
if [ -z "$model" ]; then
  fixtures/fetch.sh > /dev/null
  "$mw" export fixtures/cache/SmolLM2-135M-Instruct.Q4_1.gguf "$tmp/smol" > /dev/null
  "$mw" convert "$tmp/smol" -o "$tmp/model.gguf" --outtype f16 > /dev/null
  model="$tmp/model.gguf"
fi
size=$(stat -c %s "$model")
# What the process needs besides weights (binary, KV cache, activation buffers; --resident
# covers the pinned weights, the read-ahead ring and the expert cache): OVERHEAD_MIB,
# default 40. PREFETCH: layers' worth read ahead (default 1).
overhead=$(( ${OVERHEAD_MIB:-40} << 20 ))
cg_make() {  # cg_make BYTES: a fresh cgroup capped at BYTES
  [ -n "$cg" ] && rmdir "$cg" 2> /dev/null
  if [ -d /sys/fs/cgroup/memory ]; then
    cg=/sys/fs/cgroup/memory/memwall-wall-$$-$1
    mkdir "$cg"
    echo "$1" > "$cg/memory.limit_in_bytes"
    peak() { cat "$cg/memory.max_usage_in_bytes"; }
    reset_peak() { echo 0 > "$cg/memory.max_usage_in_bytes"; }
    enter="echo \$\$ > $cg/tasks"
  else
    cg=/sys/fs/cgroup/memwall-wall-$$-$1
    mkdir "$cg"
    echo "$1" > "$cg/memory.max"
    peak() { cat "$cg/memory.peak" 2> /dev/null || echo 0; }
    reset_peak() { :; }
    enter="echo \$\$ > $cg/cgroup.procs"
  fi
}
capped() { sync; echo 3 > /proc/sys/vm/drop_caches; reset_peak; sh -c "$enter; exec \"\$@\"" sh "$@"; }
# Disk bandwidth: the model file read with O_DIRECT, best of three.
bw=0
for _ in 1 2 3; do
  sync; echo 3 > /proc/sys/vm/drop_caches
  start=$(date +%s.%N); dd if="$model" of=/dev/null bs=8M iflag=direct 2> /dev/null; end=$(date +%s.%N)
  bw=$(python3 -c "print(max($bw, $size / ($end - $start)))")
done
# PLAN=1: also what `memwall plan` predicts for memwall under each cap, from a profile of
# this machine (`plan --measure-host`) whose RAM is set to the cap.
if [ "${PLAN:-0}" = 1 ]; then
  "$mw" plan --measure-host --save "$tmp/host.toml" -t "$threads" > /dev/null 2>&1
fi
for percent in ${percents//,/ }; do
  cap=$(( size * percent / 100 ))
  resident_mib=$(( (cap - overhead) >> 20 ))
  [ "$resident_mib" -gt 0 ] || { echo "cap $percent % too small for this model" >&2; exit 1; }
  cg_make "$cap"
  lpeak=0; mpeak=0
  for round in $(seq "${ROUNDS:-1}"); do
    capped "$lb" -m "$model" -p 0 -n "$gen" -t "$threads" -r 2 -o json 2> /dev/null > "$tmp/l$round.json"
    lpeak=$(( $(peak) > lpeak ? $(peak) : lpeak ))
    capped "$mw" bench -m "$model" -p 0 -n "$gen" -t "$threads" -r 2 --resident "$resident_mib" \
      --prefetch "${PREFETCH:-1}" ${MEMWALL_FLAGS:-} --json > "$tmp/m$round.json"
    mpeak=$(( $(peak) > mpeak ? $(peak) : mpeak ))
  done
  if [ "${PLAN:-0}" = 1 ]; then
    sed -e "s/^ram_gb = .*/ram_gb = $(python3 -c "print($cap / 2**30)")/" \
        -e "s/^os_reserve_gb = .*/os_reserve_gb = 0/" "$tmp/host.toml" > "$tmp/cap.toml"
    "$mw" plan "$model" -d "$tmp/cap.toml" -c "$gen" --json > "$tmp/plan.json"
  fi
  python3 - "$tmp" "$size" "$cap" "$bw" "$lpeak" "$mpeak" "$model" <<'PY'
import glob, json, os, sys
tmp, size, cap, bw, lpeak, mpeak, model = sys.argv[1:]
size, cap, bw, lpeak, mpeak = int(size), int(cap), float(bw), int(lpeak), int(mpeak)
llama = max(json.load(open(f))[0]["avg_ts"] for f in glob.glob(f"{tmp}/l*.json"))
runs = [json.load(open(f)) for f in glob.glob(f"{tmp}/m*.json")]
ours = max(runs, key=lambda r: r["results"][0]["tokens_per_second"])
tg = ours["results"][0]
st = ours["streaming"]
streamed = st["streamed_bytes"]
measured = tg["storage_read_bytes_per_token"] or 0
mb = lambda b: f"{b / 2**20:.0f} MiB"
print(f"model {model}: {mb(size)}; cgroup cap {mb(cap)} ({100 * cap / size:.0f} %); disk {bw / 1e6:.0f} MB/s")
x = st.get("experts")
if x:
    e = tg["experts"]
    miss = 1 - e["hit_rate"]
    routed = e["requests_per_token"] * x["bundle_bytes"]
    # The dense matrices that did not fit stream whole each token (the ring).
    dense = max(0, streamed - int(round(e["requests_per_token"])) * x["bundle_bytes"])
    guessed = e.get("bytes_guessed_per_token", 0)
    predicted = routed * miss + dense + guessed
    print(f"memwall pins {mb(st['pinned_bytes'])}; experts: {x['slots']} of {x['experts']} cached "
          f"({mb(x['slots'] * x['bundle_bytes'])}), hit rate {100 * e['hit_rate']:.1f} %; routing: "
          f"90 % in {100 * x['routing']['experts_for_90_percent']:.0f} % of a layer's experts, "
          f"top expert {100 * x['routing']['top_expert_share']:.1f} %")
    print(f"read per token: {mb(measured)} measured, experts {mb(e['bytes_read_per_token'])}; routed "
          f"{mb(routed)} × miss rate {miss:.3f} + dense {mb(dense)} + guesses {mb(guessed)} = {mb(predicted)} "
          f"(measured ÷ predicted {measured / predicted if predicted else float('nan'):.2f})")
    need = predicted
else:
    print(f"memwall pins {mb(st['pinned_bytes'])}, streams {mb(streamed)} per token "
          f"(read {mb(measured)} per token measured)")
    need = streamed
bound = f"{bw / need:.1f} t/s" if need else "none (nothing read)"
print(f"decode bound by the disk: memwall {bound}, whole model {bw / size:.1f} t/s")
print(f"llama.cpp (mmap)      tg{tg['test'][2:]}: {llama:8.2f} t/s   peak {mb(lpeak)}")
print(f"memwall (--resident)  tg{tg['test'][2:]}: {tg['tokens_per_second']:8.2f} t/s   peak {mb(mpeak)}")
print(f"ratio memwall / llama.cpp: {tg['tokens_per_second'] / llama:.2f}x")
if os.path.exists(f"{tmp}/plan.json"):
    row = json.load(open(f"{tmp}/plan.json"))["rows"][0]
    d = row["decode"]
    print(f"memwall plan predicts {d['tokens_per_s']:.2f} t/s ({row['fits']}, reading "
          f"{mb(d['flash_bytes_per_token'])} per token from storage); "
          f"measured ÷ predicted {tg['tokens_per_second'] / d['tokens_per_s']:.2f}")
PY
  rm -f "$tmp"/l*.json "$tmp"/m*.json "$tmp/plan.json"
done
