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
# Debian's rustc carries the aarch64 standard library; the rustup one does not. Linked
# statically, as scripts/phone-build.sh links the phone's binary (sharing its build
# folder and dependencies): qemu runs the tests with no loader or library path.
RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc \
CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static" \
CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="env -u LD_LIBRARY_PATH qemu-aarch64 -cpu max" \
  /usr/bin/cargo test --locked --target aarch64-unknown-linux-gnu -p memwall-format -p memwall-runtime --release \
  --target-dir target/aarch64-static

step "phone build (aarch64 memwall under qemu)"
scripts/phone-smoke.sh
