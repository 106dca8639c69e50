#!/usr/bin/env bash
# Installs dsopt from a build tree into a temporary prefix, then builds
# examples/c/train_logreg.c against the installed copy twice, through
# find_package(dsopt) in a separate CMake project and through pkg-config,
# and runs both (each must load the installed libdsopt and train). Then the
# bindings against the installed copy: the Rust crates (found through
# pkg-config; when cargo is there) and `pip install bindings/python`.
#   tests/install/test_install.sh <builddir>
set -euo pipefail

build=$(cd "${1:?usage: test_install.sh <builddir>}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
example=$repo/examples/c/train_logreg.c
steps=${DSOPT_INSTALL_TEST_STEPS:-60}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
fail() { echo "test_install: FAILED: $*" >&2; exit 1; }

echo "== cmake --install $build --prefix $prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null

libdir=$(dirname "$(find "$prefix" -name 'libdsopt.so' -print -quit)")
[ -n "$libdir" ] && [ "$libdir" != . ] || fail "no libdsopt.so under $prefix"
[ -f "$prefix/include/dsopt.h" ] || fail "include/dsopt.h not installed"
soname=$(objdump -p "$libdir/libdsopt.so" | awk '/SONAME/ {print $2}')
[ "$(readlink "$libdir/libdsopt.so")" = "$soname" ] || fail "libdsopt.so does not link to its SONAME $soname"
[ -f "$libdir/$(readlink "$libdir/$soname")" ] || fail "$soname does not link to the library file"
for f in cmake/dsopt/dsoptConfig.cmake cmake/dsopt/dsoptConfigVersion.cmake pkgconfig/dsopt.pc; do
  [ -f "$libdir/$f" ] || fail "$f not installed under $libdir"
done
echo "installed: include/dsopt.h, $(cd "$libdir" && ls libdsopt.so*| tr '\n' ' ')(SONAME $soname), CMake package, dsopt.pc"

# Each program must resolve libdsopt from the prefix, not from the build tree.
uses_installed_copy() {
  local resolved
  resolved=$(ldd "$1" | awk '/libdsopt/ {print $3}')
  [ "$(readlink -f "$resolved")" = "$(readlink -f "$libdir/$soname")" ] ||
    fail "$1 loads libdsopt from '$resolved', not from $libdir"
}

echo "== find_package(dsopt) in a separate CMake project"
cmake -S "$here/consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$prefix" \
      -DDSOPT_EXAMPLE_SOURCE="$example" -DCMAKE_BUILD_TYPE=Release | grep 'consumer:'
cmake --build "$work/consumer" >/dev/null
uses_installed_copy "$work/consumer/train_logreg"
"$work/consumer/train_logreg" --steps "$steps" --print-every "$steps"

if [ -n "$(find "$build" -maxdepth 1 -name 'libdsopt_mpi.so.*' -print -quit)" ]; then
  echo "== MPI on demand: the installed libdsopt loads the installed libdsopt_mpi"
  plugin=$(find "$libdir" -maxdepth 1 -name 'libdsopt_mpi.so.*' -print -quit)
  [ -n "$plugin" ] || fail "libdsopt_mpi.so.* not installed next to libdsopt"
  readelf -d "$libdir/$soname" | grep -q 'NEEDED.*libmpi' && fail "libdsopt itself needs libmpi"
  cat > "$work/mpi_probe.c" <<'PROBE'
#include <stdio.h>
#include <string.h>
#include "dsopt.h"
int main(void) {
  dsopt_comm *comm = NULL;
  int status = dsopt_comm_create_mpi(&comm, 0); /* MPI not initialised: the plugin says so */
  char line[4096];
  FILE *maps = fopen("/proc/self/maps", "r");
  while (maps && fgets(line, sizeof line, maps))
    if (strstr(line, "libdsopt_mpi")) { printf("plugin %s", strchr(line, '/')); break; }
  printf("status %d: %s\n%s\n", status, dsopt_last_error(), dsopt_build_info());
  return status == DSOPT_EINVAL ? 0 : 1;
}
PROBE
  ${CC:-cc} -std=c99 -o "$work/mpi_probe" "$work/mpi_probe.c" -I"$prefix/include" -L"$libdir" -ldsopt \
    -Wl,-rpath,"$libdir"
  uses_installed_copy "$work/mpi_probe"
  out=$("$work/mpi_probe") || fail "dsopt_comm_create_mpi through the installed copy: $out"
  grep -q "plugin $(readlink -f "$plugin")" <<<"$out" || fail "the plugin was not the installed one: $out"
  grep -q "MPI is not initialised" <<<"$out" || fail "unexpected: $out"
  echo "$out" | sed -n '1p;3p'
fi

echo "== pkg-config dsopt"
export PKG_CONFIG_PATH=$libdir/pkgconfig
[ "$(pkg-config --modversion dsopt)" = "$(awk '/^Version:/ {print $2}' "$libdir/pkgconfig/dsopt.pc")" ]
${CC:-cc} -std=c99 -O2 -o "$work/train_pc" "$example" $(pkg-config --cflags --libs dsopt) -lm \
  -Wl,-rpath,"$(pkg-config --variable=libdir dsopt)"
uses_installed_copy "$work/train_pc"
"$work/train_pc" --steps "$steps" --print-every "$steps"

if command -v cargo >/dev/null 2>&1 && compgen -G "/usr/share/cargo/registry/bindgen-0.*" >/dev/null; then
  echo "== Rust: dsopt-sys finds the installed copy through pkg-config"
  (cd "$repo/bindings/rust" &&
   env -u DSOPT_LIB_DIR -u DSOPT_INCLUDE_DIR CARGO_TARGET_DIR="$work/cargo" \
     cargo test --offline --quiet -p dsopt --test optimizer 2>&1 | grep 'test result')
  uses_installed_copy "$(find "$work/cargo/debug/deps" -name 'optimizer-*' -type f -executable | head -n1)"
else
  echo "== Rust: skipped (no cargo, or no Debian bindgen crate: see scripts/ensure_rust_deps.sh)"
fi

# pip without network: the build runs in this Python, which needs cffi,
# numpy, setuptools and bdist_wheel (the wheel package, or setuptools >= 70.1).
can_build_python() {
  python3 -c "import cffi, numpy, setuptools" 2>/dev/null || return 1
  python3 -c "import wheel" 2>/dev/null || python3 -c "import setuptools.command.bdist_wheel" 2>/dev/null
}
if can_build_python; then
  echo "== Python: pip install bindings/python against the installed copy"
  DSOPT_LIBRARY_DIR=$libdir DSOPT_INCLUDE_DIR=$prefix/include \
    python3 -m pip install -q --root-user-action=ignore --no-build-isolation --no-deps \
    --target "$work/python" "$repo/bindings/python"
  (cd "$work" && PYTHONPATH=$work/python python3 -c "
import numpy as np, dsopt
p = np.ones(8, np.float32)
with dsopt.Optimizer({'optimizer': {'type': 'Adam', 'params': {'lr': 0.1}}}, [p]) as opt:
    opt.step([np.ones(8, np.float32)])
assert np.allclose(p, 0.9), p
print('dsopt', dsopt.version(), 'from', dsopt.__file__)")
  uses_installed_copy "$(find "$work/python/dsopt" -name '_dsopt_cffi*.so' | head -n1)"
  # dsopt.torch is a subpackage (torch itself need not be installed here).
  for module in __init__ _optimizer _classes _live_state _torch_state _groups _rebuild; do
    [ -f "$work/python/dsopt/torch/$module.py" ] ||
      fail "pip install did not ship dsopt/torch/$module.py (setup.py packages)"
  done
else
  echo "== Python: skipped (python3 lacks cffi, numpy, setuptools or wheel: pip install wheel)"
fi

echo "== a version the package does not provide is refused"
if cmake -S "$here/consumer" -B "$work/too_new" -DCMAKE_PREFIX_PATH="$prefix" \
         -DDSOPT_EXAMPLE_SOURCE="$example" -DDSOPT_WANT_VERSION=99 >/dev/null 2>&1; then
  fail "find_package(dsopt 99) succeeded"
fi

echo "test_install: passed"
