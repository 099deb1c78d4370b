#!/usr/bin/env bash
# The one test command (README, CI). Run from anywhere inside the repository.
#
#   scripts/test.sh                       everything, including the aarch64 lane
#   MEMWALL_SKIP_AARCH64=1 scripts/test.sh   skip the aarch64 lane (local use only)
#   MEMWALL_PRUNE_TARGET=1 scripts/test.sh   remove target/debug once the x86-64 tests
#                                            passed, to save disk (CI)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n==> %s\n' "$*"; }

step "fixtures"
fixtures/fetch.sh

step "format"
cargo fmt --all -- --check

step "clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "tests (x86-64)"
cargo test --workspace --locked

if [ "${MEMWALL_PRUNE_TARGET:-0}" = 1 ]; then
  step "removing target/debug (MEMWALL_PRUNE_TARGET=1)"
  rm -rf target/debug
  df -h . || true
fi

if [ "${MEMWALL_SKIP_AARCH64:-0}" = 1 ]; then
  step "aarch64 lane skipped (MEMWALL_SKIP_AARCH64=1)"
  exit 0
fi

step "tests (aarch64 under qemu)"
scripts/setup-aarch64.sh
# Debian's rustc carries the aarch64 standard library; the rustup one does not.
# LD_LIBRARY_PATH pins libc to the cross package that matches its ld.so: with
# libc6:arm64 also installed (libstd-rust-web-dev:arm64 pulls it in), the loader
# would otherwise mix two glibc builds and every thread spawn hangs under qemu.
RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc \
CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -cpu max -L /usr/aarch64-linux-gnu -E LD_LIBRARY_PATH=/usr/aarch64-linux-gnu/lib" \
  /usr/bin/cargo test --locked --target aarch64-unknown-linux-gnu -p memwall-format -p memwall-runtime --release \
  --target-dir target/aarch64

step "phone build (aarch64 memwall under qemu)"
scripts/phone-smoke.sh
