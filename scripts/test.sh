#!/usr/bin/env bash
# The whole test suite on a fresh machine: creates .venv, installs torch 2.13.0's CPU build before
# anything else so no resolver can pull a CUDA build, then the package with its test extras, then
# runs pytest.  Extra arguments go to pytest.  Network: torch (~200 MB, from a local wheelhouse if
# pip's find-links has one, else download.pytorch.org/whl/cpu; TORCH_INDEX_URL overrides) and the
# test extras from PyPI (~150 MB: numpy, moto, s3fs, paramiko, hypothesis, ...).
#
# PYTHON=python3.10 bash scripts/test.sh -m "not torch"   runs under another interpreter, in its own
# venv (.venv-<version>).  torch is installed only where its CPU wheel is on disk (Python 3.11);
# elsewhere the torch-marked tests skip, so pass -m "not torch" to run the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VER=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
VENV=.venv
[ "$VER" = "$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')" ] || VENV=".venv-$VER"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
if [ "$VER" = "3.11" ]; then
  # torch's CPU build (about 200 MB) before anything else: from a local wheelhouse when pip has one
  # (find-links), else from PyTorch's CPU index -- never PyPI's default, which is the CUDA build
  # (several GB of nvidia-* wheels)
  # (the wheel alone from find-links, then its dependencies from the usual indexes: torch is then
  # already satisfied, so no resolver can swap in another build)
  if "${PIP[@]}" --no-index --no-deps torch==2.13.0 2>/dev/null; then
    "${PIP[@]}" torch==2.13.0
  else
    "${PIP[@]}" --index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}" torch==2.13.0
  fi
  "${PIP[@]}" torchdata
fi
"${PIP[@]}" -e '.[test]'
# The whole suite (no arguments): two workers, each test file on one of them (its module fixtures,
# the Slurm cluster's included, built once).  Most of its time is spent waiting on subprocesses (the
# real loads over gloo, the daemons): 648 s against 966 s in one process, measured on 2 cores.
# With arguments, one process, as pytest's own options expect (-x, --pdb, -s).
[ $# -gt 0 ] || set -- -n 2 --dist loadfile
exec "$VENV/bin/python" -m pytest "$@"
