#!/usr/bin/env bash
# Installs what the aarch64 (phone CPU) test lane needs, from Debian's packages:
# Debian's rustc/cargo with the aarch64 standard library, the aarch64 linker and
# qemu-user to run the test binaries. See shared notes in docs/ARCHITECTURE.md.
# Does nothing when everything is already there.
set -euo pipefail
have() {
  [ -x /usr/bin/rustc ] && [ -x /usr/bin/cargo ] \
    && ls /usr/lib/rustlib/aarch64-unknown-linux-gnu/lib/libstd-*.rlib > /dev/null 2>&1 \
    && command -v aarch64-linux-gnu-gcc > /dev/null \
    && command -v qemu-aarch64 > /dev/null \
    && [ -d /usr/aarch64-linux-gnu/lib ]
}
if have; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "setup-aarch64: missing packages and not root; run as root or install:" >&2
  echo "  rustc-web libstd-rust-web-dev:arm64 gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
dpkg --add-architecture arm64
apt-get update -qq
apt-get install -y -qq rustc-web libstd-rust-web-dev:arm64 gcc-aarch64-linux-gnu \
  libc6-dev-arm64-cross qemu-user > /dev/null
have || { echo "setup-aarch64: packages installed but the toolchain is incomplete" >&2; exit 1; }
