#!/usr/bin/env bash
# What building the Rust binding offline needs besides cargo: the cmake
# crate, and bindgen (for the `bindgen` feature and its test) with its
# dependencies, as Debian-packaged crates in /usr/share/cargo/registry (the
# directory bindings/rust/.cargo/config.toml points cargo at), and libclang.
# As root it installs them with apt-get; otherwise it prints the command and
# fails.
set -euo pipefail

registry=/usr/share/cargo/registry
if compgen -G "$registry/bindgen-0.*" >/dev/null && compgen -G "$registry/clang-sys-*" >/dev/null &&
   compgen -G "$registry/cmake-0.*" >/dev/null; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "the dsopt Rust binding needs: sudo apt-get install -y bindgen librust-bindgen-dev librust-cmake-dev" >&2
  exit 1
fi
echo "installing: bindgen librust-bindgen-dev librust-cmake-dev"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bindgen librust-bindgen-dev librust-cmake-dev >/dev/null
