#!/usr/bin/env bash
# The main job on a built-in example, on a fresh machine: creates .venv (no torch needed),
# installs ckptdoctor, and runs `ckptdoctor demo` (a run root with injected faults).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e .
exec .venv/bin/ckptdoctor demo "$@"
