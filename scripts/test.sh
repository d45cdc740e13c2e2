#!/usr/bin/env bash
# Set up, then run the whole test suite: ruff, mypy, pytest (unit + distributed tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== ruff"; .venv/bin/ruff check src tests
echo "== mypy"; .venv/bin/mypy src
echo "== pytest"; exec .venv/bin/python -m pytest "$@"
