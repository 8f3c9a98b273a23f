#!/usr/bin/env bash
# One command from nothing: a virtual environment in .venv with tuner and its tests' tools.
# torch is pinned first so pip does not pull a newer multi-GB build: on CPU-only machines
# of this project it resolves to the local CPU wheel; on a GPU machine it is PyPI's CUDA build.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
"$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install --quiet "torch==2.13.0"
.venv/bin/python -m pip install --quiet -e ".[dev]"
echo "installed: $(.venv/bin/tuner --help >/dev/null && echo 'tuner ok') — activate with: . .venv/bin/activate"
