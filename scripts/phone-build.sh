#!/usr/bin/env bash
# The runtime for a stock phone: `memwall` for aarch64, linked statically (glibc's static
# libraries from Debian's libc6-dev-arm64-cross, `-C target-feature=+crt-static`), so it
# starts with no program loader and no shared libraries, as Android runs a program pushed
# to /data/local/tmp. Writes target/phone/memwall, which `memwall push --with-runtime`
# sends by default. Needs scripts/setup-aarch64.sh's packages.
#
#   scripts/phone-build.sh        then   memwall push MODEL.gguf --with-runtime
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static"
/usr/bin/cargo build --quiet --locked --release --target aarch64-unknown-linux-gnu -p memwall \
  --target-dir target/aarch64-static
mkdir -p target/phone
# Without the debug information the release profile keeps (a fifth of the size).
aarch64-linux-gnu-strip -o target/phone/memwall target/aarch64-static/aarch64-unknown-linux-gnu/release/memwall
# No program interpreter and no needed libraries: nothing for a phone to lack.
if aarch64-linux-gnu-readelf -ld target/phone/memwall | grep -E 'INTERP|NEEDED'; then
  echo "phone-build: target/phone/memwall still needs a loader or libraries" >&2
  exit 1
fi
echo "target/phone/memwall: static aarch64 memwall ($(stat -c %s target/phone/memwall) bytes)"
