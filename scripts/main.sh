#!/usr/bin/env bash
# Set up, then run the main job: `approxdist train` (digits, ResNet-20, 2 workers, dp).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/approxdist train "$@"
