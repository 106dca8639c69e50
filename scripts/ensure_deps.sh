#!/usr/bin/env bash
# Installs what building and testing dsopt needs, when it is missing: Debian
# packages through apt-get and Python packages through pip, if run as root;
# otherwise it prints the commands to run and fails.
set -euo pipefail

apt_missing=()
have_header() { printf '#include <%s>\n' "$1" | ${CXX:-c++} -x c++ -E - >/dev/null 2>&1; }
command -v cmake >/dev/null || apt_missing+=(cmake)
command -v c++ >/dev/null || apt_missing+=(g++)
command -v mpirun >/dev/null || apt_missing+=(openmpi-bin)
[ -e /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h ] || have_header mpi.h || apt_missing+=(libopenmpi-dev)
have_header nlohmann/json.hpp || apt_missing+=(nlohmann-json3-dev)
have_header zlib.h || apt_missing+=(zlib1g-dev)
# Optional: `make test-fuzz` (clang's libFuzzer and OpenMP runtime) skips
# without them; installed as root, only named otherwise.
apt_optional=()
if ! command -v clang++ >/dev/null; then
  apt_optional+=(clang libomp-dev)
elif ! printf 'int main() { return 0; }\n' | clang++ -fopenmp -x c++ - -o /dev/null >/dev/null 2>&1; then
  apt_optional+=(libomp-dev)
fi

pip_missing=()
# "pip package:module" where the two differ
for pkg in numpy cffi pytest mpi4py ml_dtypes matplotlib wheel scikit-learn:sklearn; do
  python3 -c "import ${pkg#*:}" 2>/dev/null || pip_missing+=("${pkg%%:*}")
done

if [ "$(id -u)" != 0 ] && [ ${#apt_optional[@]} -gt 0 ]; then
  echo "optional, for make test-fuzz: sudo apt-get install -y ${apt_optional[*]}" >&2
fi
if [ "$(id -u)" = 0 ]; then apt_missing+=("${apt_optional[@]}"); fi
if [ ${#apt_missing[@]} -eq 0 ] && [ ${#pip_missing[@]} -eq 0 ]; then exit 0; fi

if [ "$(id -u)" != 0 ]; then
  echo "dsopt needs:" >&2
  [ ${#apt_missing[@]} -gt 0 ] && echo "  sudo apt-get install -y ${apt_missing[*]}" >&2
  [ ${#pip_missing[@]} -gt 0 ] && echo "  python3 -m pip install ${pip_missing[*]}" >&2
  exit 1
fi
if [ ${#apt_missing[@]} -gt 0 ]; then
  echo "installing: ${apt_missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_missing[@]}" >/dev/null
fi
if [ ${#pip_missing[@]} -gt 0 ]; then
  echo "installing (pip): ${pip_missing[*]}"
  python3 -m pip install -q --root-user-action=ignore "${pip_missing[@]}"
fi
