#!/usr/bin/env bash
# What `make test-gpu` needs beyond CUDA, nvcc, CMake and a Python with torch,
# carried to a GPU machine that has no package registry (an air-gapped node):
#
#   scripts/offline_deps.sh fetch DIR   # on a Debian 12 machine with apt and pip:
#                                       # Debian's .deb files and PyPI wheels into DIR
#   eval "$(scripts/offline_deps.sh env DIR)"
#                                       # on the GPU machine: unpacks them into
#                                       # DIR/root, DIR/mpi and DIR/site (once) and prints the
#                                       # exports that make CMake, the compilers,
#                                       # mpirun and Python find them
#
# The packages: nlohmann's JSON headers, zlib's headers, Open MPI (mpicc,
# mpirun, libmpi and the libraries it loads), and for Python cffi and
# pycparser (wheels for PYTHON_VERSION, default 3.12). `make test-gpu
# DEPS=DIR` runs the env step itself. Only what a machine lacks is used:
# the headers come after the system's on every search path; the carried
# Open MPI (unpacked apart, in DIR/mpi) only where the machine has no whole
# one (mpicc and mpirun), and then whole: first on every path, with its own
# prefix and plugin folders, since the libraries and plugins of two Open
# MPIs do not mix.
set -euo pipefail

debs=(nlohmann-json3-dev zlib1g-dev)
mpi_debs=(openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev
          libpmix2 libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7 libfabric1 libucx0
          libibverbs1 librdmacm1 libpsm2-2 libpsm-infinipath1 libnl-3-200 libnl-route-3-200
          libmunge2 libnuma1 libpciaccess0 libltdl7 libgfortran5)
wheels=(cffi pycparser)
multiarch=x86_64-linux-gnu

usage() {
  echo "usage: scripts/offline_deps.sh fetch|env DIR" >&2
  exit 2
}

fetch() {
  local dir=$1
  mkdir -p "$dir/debs" "$dir/mpi-debs" "$dir/wheels"
  (cd "$dir/debs" && apt-get download "${debs[@]}" >/dev/null)
  (cd "$dir/mpi-debs" && apt-get download "${mpi_debs[@]}" >/dev/null)
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$dir/wheels" \
    --python-version "${PYTHON_VERSION:-3.12}" --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 "${wheels[@]}"
  echo "offline deps: $(ls "$dir/debs" "$dir/mpi-debs" | grep -c '\.deb$') packages," \
       "$(ls "$dir/wheels" | wc -l) wheels, $(du -sh "$dir" | cut -f1) in $dir" >&2
}

# unpack_debs FROM TO: every .deb of FROM into TO (once).
unpack_debs() {
  [ -e "$2/.unpacked" ] && return
  mkdir -p "$2"
  local deb
  for deb in "$1"/*.deb; do dpkg-deb -x "$deb" "$2"; done
  touch "$2/.unpacked"
}

unpack() {
  local dir=$1
  unpack_debs "$dir/debs" "$dir/root"
  if [ ! -e "$dir/mpi/.unpacked" ]; then
    unpack_debs "$dir/mpi-debs" "$dir/mpi"
    # The names Debian's alternatives give on installation.
    local tool
    for tool in "$dir"/mpi/usr/bin/*.openmpi; do
      ln -sf "$(basename "$tool")" "${tool%.openmpi}"
    done
    ln -sf openmpi/lib/libmpi.so "$dir/mpi/usr/lib/$multiarch/libmpi.so"
  fi
  if [ ! -e "$dir/site/.unpacked" ] && compgen -G "$dir/wheels/*.whl" >/dev/null; then
    mkdir -p "$dir/site"
    "${PYTHON:-python3}" -m pip install -q --no-index --no-deps --no-compile --target "$dir/site" \
      "$dir"/wheels/*.whl >&2
    touch "$dir/site/.unpacked"
  fi
}

print_env() {
  local dir root mpi lib
  dir=$(cd "$1" && pwd)
  unpack "$dir" >&2
  root=$dir/root/usr
  cat <<EOF
export CMAKE_PREFIX_PATH="\${CMAKE_PREFIX_PATH:+\$CMAKE_PREFIX_PATH:}$root:$root/share"
export CPATH="\${CPATH:+\$CPATH:}$root/include"
export LIBRARY_PATH="\${LIBRARY_PATH:+\$LIBRARY_PATH:}$root/lib/$multiarch"
export PYTHONPATH="\${PYTHONPATH:+\$PYTHONPATH:}$dir/site"
EOF
  command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1 && return
  mpi=$dir/mpi/usr
  lib=$mpi/lib/$multiarch
  cat <<EOF
export PATH="$mpi/bin\${PATH:+:\$PATH}"
export LD_LIBRARY_PATH="$lib:$lib/openmpi/lib:$lib/pmix2/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export CMAKE_PREFIX_PATH="$mpi\${CMAKE_PREFIX_PATH:+:\$CMAKE_PREFIX_PATH}"
export OPAL_PREFIX="$mpi"
export OMPI_MCA_mca_base_component_path="$lib/openmpi/lib/openmpi3"
export PMIX_PREFIX="$lib/pmix2"
export PMIX_PKGLIBDIR="$lib/pmix2/lib/pmix"
EOF
}

[ $# -eq 2 ] || usage
case $1 in
  fetch) fetch "$2" ;;
  env) print_env "$2" ;;
  *) usage ;;
esac
