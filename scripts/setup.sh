#!/usr/bin/env bash
# Create .venv (if needed) and install approxdist with its test tools into it.
# torch is installed first, as the CPU build that `pip install torch==2.13.0` gives on
# these machines; if a torch is already in .venv (e.g. a CUDA build a GPU user put there)
# it is kept. Override the torch requirement with APPROXDIST_TORCH="torch==2.13.0".
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  .venv/bin/python -m pip install -q "${APPROXDIST_TORCH:-torch==2.13.0}"
fi
.venv/bin/python -m pip install -q -e ".[test]" 2>&1 | grep -v "is ignored: it is neither" || true
.venv/bin/python -c "import approxdist, torch; print(f'approxdist {approxdist.__version__} with torch {torch.__version__}')"
