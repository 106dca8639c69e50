#!/usr/bin/env bash
# What `make test-gpu` needs beyond CUDA, nvcc, CMake and a Python with torch,
# carried to a GPU machine that has no package registry (an air-gapped node):
#
#   scripts/offline_deps.sh fetch DIR   # on a Debian 12 machine with apt and pip:
#                                       # Debian's .deb files and PyPI wheels into DIR
#   eval "$(scripts/offline_deps.sh env DIR)"
#                                       # on the GPU machine: unpacks them into
#                                       # DIR/root and DIR/site (once) and prints the
#                                       # exports that make CMake, the compilers,
#                                       # mpirun and Python find them
#
# The packages: nlohmann's JSON headers, zlib's headers, Open MPI (mpicc,
# mpirun, libmpi and the libraries it loads), and for Python cffi and
# pycparser (wheels for PYTHON_VERSION, default 3.12). `make test-gpu
# DEPS=DIR` runs the env step itself. Only what a machine lacks is used:
# the unpacked files come after the system's on every search path.
set -euo pipefail

debs=(nlohmann-json3-dev zlib1g-dev openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev
      libpmix2 libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7 libfabric1 libucx0
      libibverbs1 librdmacm1 libpsm2-2 libpsm-infinipath1 libnl-3-200 libnl-route-3-200
      libmunge2 libnuma1 libpciaccess0 libltdl7 libgfortran5)
wheels=(cffi pycparser)

usage() {
  echo "usage: scripts/offline_deps.sh fetch|env DIR" >&2
  exit 2
}

fetch() {
  local dir=$1
  mkdir -p "$dir/debs" "$dir/wheels"
  (cd "$dir/debs" && apt-get download "${debs[@]}" >/dev/null)
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$dir/wheels" \
    --python-version "${PYTHON_VERSION:-3.12}" --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 "${wheels[@]}"
  echo "offline deps: $(ls "$dir/debs" | wc -l) packages, $(ls "$dir/wheels" | wc -l) wheels," \
       "$(du -sh "$dir" | cut -f1) in $dir" >&2
}

unpack() {
  local dir=$1
  if [ ! -e "$dir/root/.unpacked" ]; then
    mkdir -p "$dir/root"
    for deb in "$dir"/debs/*.deb; do dpkg-deb -x "$deb" "$dir/root"; done
    # The names Debian's alternatives give on installation.
    local tool
    for tool in "$dir"/root/usr/bin/*.openmpi; do
      ln -sf "$(basename "$tool")" "${tool%.openmpi}"
    done
    ln -sf openmpi/lib/libmpi.so "$dir/root/usr/lib/x86_64-linux-gnu/libmpi.so"
    touch "$dir/root/.unpacked"
  fi
  if [ ! -e "$dir/site/.unpacked" ] && compgen -G "$dir/wheels/*.whl" >/dev/null; then
    mkdir -p "$dir/site"
    "${PYTHON:-python3}" -m pip install -q --no-index --no-deps --no-compile --target "$dir/site" \
      "$dir"/wheels/*.whl >&2
    touch "$dir/site/.unpacked"
  fi
}

print_env() {
  local dir root multiarch=x86_64-linux-gnu
  dir=$(cd "$1" && pwd)
  unpack "$dir" >&2
  root=$dir/root/usr
  local libs=$root/lib/$multiarch:$root/lib/$multiarch/openmpi/lib
  cat <<EOF
export PATH="\${PATH:+\$PATH:}$root/bin"
export LD_LIBRARY_PATH="\${LD_LIBRARY_PATH:+\$LD_LIBRARY_PATH:}$libs"
export CMAKE_PREFIX_PATH="\${CMAKE_PREFIX_PATH:+\$CMAKE_PREFIX_PATH:}$root:$root/share"
export CPATH="\${CPATH:+\$CPATH:}$root/include"
export LIBRARY_PATH="\${LIBRARY_PATH:+\$LIBRARY_PATH:}$root/lib/$multiarch"
export PYTHONPATH="\${PYTHONPATH:+\$PYTHONPATH:}$dir/site"
EOF
  # Open MPI relocated under root: its own prefix, unless the machine has one.
  if ! command -v mpirun >/dev/null 2>&1; then
    echo "export OPAL_PREFIX=\"$root\""
  fi
}

[ $# -eq 2 ] || usage
case $1 in
  fetch) fetch "$2" ;;
  env) print_env "$2" ;;
  *) usage ;;
esac
