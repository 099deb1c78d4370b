#!/usr/bin/env bash
# Runs a fuzz target for a given time, starting from the committed seeds.
#
#   fuzz/run.sh gguf_reader 900        # 15 minutes
#   fuzz/run.sh chat_template 900 -only_ascii=1   # extra libFuzzer flags after the time
#
# Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`).
# New inputs go to fuzz/corpus/<target>/ (git-ignored); crashes to fuzz/artifacts/.
set -euo pipefail
target="${1:?usage: fuzz/run.sh TARGET SECONDS}"
seconds="${2:-600}"
shift 2 || shift $#
cd "$(dirname "${BASH_SOURCE[0]}")"
mkdir -p "corpus/$target"
cp -n seeds/"$target"/* "corpus/$target/" 2>/dev/null || true
cargo +nightly fuzz run "$target" "corpus/$target" -- \
  -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
  -print_final_stats=1 "$@"
