#!/usr/bin/env bash
# The whole test suite on a fresh machine: creates .venv, installs torch 2.13.0 (CPU wheel, from
# local disk) before anything else so no resolver can pull a CUDA build, then the package with its
# test extras, then runs pytest.  Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
exec .venv/bin/python -m pytest "$@"
