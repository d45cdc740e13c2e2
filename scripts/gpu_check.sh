#!/usr/bin/env bash
# Run every test and benchmark that exercises CUDA on this machine's GPUs (docs/training.md,
# "The GPU check"): one line per check, then a total. Needs the setup of scripts/setup.sh;
# it installs nothing and reports the torch it finds. Without a GPU it says so, exit 0.
# Exit 1 if a check failed. Each check's full output: runs/gpu-check/<check>.log.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
if [ ! -x "$PY" ]; then
  echo "gpu check: $PY not found; run bash scripts/setup.sh first"; exit 2
fi
read -r GPUS TORCH CUDA <<<"$("$PY" -c 'import torch
n = torch.cuda.device_count() if torch.cuda.is_available() else 0
print(n, torch.__version__, torch.version.cuda or "none")')"
echo "gpu check: torch $TORCH (CUDA build: $CUDA), $GPUS GPU(s) visible"
if [ "$GPUS" = 0 ]; then
  echo "gpu check: no GPU here (torch.cuda.is_available() is False): nothing to run, exit 0"
  exit 0
fi
"$PY" -c 'import torch
for i in range(torch.cuda.device_count()):
    print(f"  cuda:{i} {torch.cuda.get_device_name(i)}")
from approxdist.kernels import kernel_status
s = kernel_status()
side = "C kernels" if s.available else "torch ops"
print(f"  CPU side of the codec checks: {side} ({s.detail})")'
LOGS=runs/gpu-check
mkdir -p "$LOGS"
PASSED=0 FAILED=0 SKIPPED=0

# check NAME WHAT COMMAND...: run it, print one line (status, seconds, the last line of output)
check() {
  local name=$1 what=$2 start status last
  shift 2
  start=$(date +%s)
  if "$@" >"$LOGS/$name.log" 2>&1; then status=ok; else status=FAILED; fi
  last=$(grep -v '^\s*$' "$LOGS/$name.log" | tail -n 1)
  if [ "$status" = ok ] && grep -Eq '^[0-9]+ skipped|^=* ?[0-9]+ skipped' <<<"$last"; then
    status=skipped
  fi
  case $status in ok) PASSED=$((PASSED + 1));; FAILED) FAILED=$((FAILED + 1));;
    *) SKIPPED=$((SKIPPED + 1));; esac
  printf '%-8s %-52s %4ss  %s\n' "$status" "$what" "$(($(date +%s) - start))" "$last"
}

PYTEST=("$PY" -m pytest -m gpu -p no:cacheprovider)
check codecs "codecs on CUDA tensors == the CPU kernels, bit for bit" \
  "${PYTEST[@]}" tests/gpu/test_cuda_codecs.py
check link "link layer + all-reduces on CUDA buffers over NCCL" \
  "${PYTEST[@]}" tests/gpu/test_cuda_link.py
check train "train --device cuda (single; dp, pipeline on NCCL)" \
  "${PYTEST[@]}" tests/gpu/test_cuda_train.py
check bench-codec "bench codec --device cuda (throughput, GB/s)" \
  "$PY" -m approxdist bench codec --device cuda --size 16M --repeats 3
echo "gpu check: $PASSED passed, $SKIPPED skipped (too few GPUs), $FAILED failed; logs in $LOGS/"
[ "$FAILED" = 0 ]
