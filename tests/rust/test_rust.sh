#!/usr/bin/env bash
# Tests the Rust binding (bindings/rust: dsopt-sys layout tests, its
# pre-generated bindings against bindgen's output, its build from the
# repository's sources, the safe crate's tests, custom communicators over threads included) and runs the
# Rust examples (examples/rust: `train`, Adam, AdamW with ZeRO stage 2, then
# 1-bit Adam, each reloading its state with the resharding load; `threads`,
# data-parallel AdamW and 1-bit Adam on 4 threads through a custom
# communicator), offline, against <builddir>/libdsopt.so. Skips when cargo
# is absent.
#   tests/rust/test_rust.sh <builddir>
set -euo pipefail

build=$(cd "${1:?usage: test_rust.sh <builddir>}" && pwd)
repo=$(cd "$(dirname "$0")/../.." && pwd)

if ! command -v cargo >/dev/null 2>&1; then
  echo "test-rust: SKIPPED: cargo not found (install Rust: apt-get install cargo, or https://rustup.rs)"
  exit 0
fi
"$repo/scripts/ensure_rust_deps.sh"

export DSOPT_LIB_DIR=$build CARGO_TARGET_DIR=$build/cargo
echo "== bindings/rust: cargo test"
(cd "$repo/bindings/rust" && cargo test --offline --quiet)
echo "== dsopt-sys: the pre-generated bindings are bindgen's output for dsopt.h"
(cd "$repo/bindings/rust" && cargo test --offline --quiet -p dsopt-sys --features bindgen --test pregenerated)
echo "== dsopt-sys: no installed libdsopt: built from the repository's sources (CUDA off)"
(cd "$repo/bindings/rust" &&
 env -u DSOPT_LIB_DIR DSOPT_SYS_BUILD_FROM_SOURCE=1 DSOPT_WITH_CUDA=OFF CARGO_TARGET_DIR=$build/cargo-from-source \
   cargo test --offline --quiet -p dsopt --test optimizer 2>&1 | grep 'test result')
deps=$build/cargo-from-source/debug/deps
resolved=$(ldd "$(find "$deps" -name 'optimizer-*' -type f -executable | head -n1)" | awk '/libdsopt/ {print $3}')
case "$resolved" in
  "$build/cargo-from-source/"*) ;;
  *) echo "test-rust: the from-source test used libdsopt from '$resolved'" >&2; exit 1 ;;
esac
echo "== examples/rust: cargo run"
(cd "$repo/examples/rust" && cargo run --offline --release --quiet -- --steps 200)
echo "== examples/rust: cargo run --bin threads"
(cd "$repo/examples/rust" && cargo run --offline --release --quiet --bin threads -- --steps 200)
echo "test-rust: passed"
