#!/usr/bin/env bash
# The whole test suite on a fresh machine: creates .venv, installs torch 2.13.0 (CPU wheel, from
# local disk) before anything else so no resolver can pull a CUDA build, then the package with its
# test extras, then runs pytest.  Extra arguments go to pytest.
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
  "${PIP[@]}" torch==2.13.0
  "${PIP[@]}" torchdata
fi
"${PIP[@]}" -e '.[test]'
exec "$VENV/bin/python" -m pytest "$@"
