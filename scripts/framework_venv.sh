#!/usr/bin/env bash
# Prints the python of a virtual environment with PyPI's torch, transformers
# (with accelerate), lightning and mpi4py, for the framework integration tests
# (`make test-frameworks`), creating it or adding what it lacks first.
# The venv lives outside the clone so that it is reused across clones and CI
# runs: $DSOPT_FRAMEWORK_VENV, default ~/.cache/dsopt/venv-frameworks.
# Progress goes to stderr; stdout is the python's path alone. The script
# holds a lock beside the venv ($venv.lock) while it runs, so a second call
# (tests/prebuild.sh's, started by `make test`, and the tests') waits for
# the first to finish instead of installing into a half-made venv.
#   py=$(scripts/framework_venv.sh)
set -euo pipefail

venv=${DSOPT_FRAMEWORK_VENV:-$HOME/.cache/dsopt/venv-frameworks}
python=${PYTHON:-python3}
packages=(torch transformers accelerate lightning numpy cffi pytest scikit-learn mpi4py)
modules=(torch transformers accelerate lightning numpy cffi pytest sklearn mpi4py)

mkdir -p "$(dirname "$venv")"
exec {lock}>"$venv.lock"
flock "$lock"
if [ ! -x "$venv/bin/python" ]; then
  echo "framework venv: creating $venv" >&2
  "$python" -m venv "$venv" >&2
fi
missing=()
for i in "${!modules[@]}"; do
  "$venv/bin/python" -c "import ${modules[$i]}" 2>/dev/null || missing+=("${packages[$i]}")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "framework venv: pip install ${missing[*]} (PyPI; torch is a large download)" >&2
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "${missing[@]}" >&2
fi
echo "$venv/bin/python"
