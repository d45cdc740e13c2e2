#!/usr/bin/env bash
# Run every test and benchmark that exercises CUDA on this machine's GPUs (docs/training.md,
# "The GPU check"): one line per check, then a total. Needs the setup of scripts/setup.sh;
# it installs nothing and reports the torch it finds. Without a GPU it says so, exit 0.
# Exit 1 if a check failed or ran past its time limit (every check has one; all of them
# together stay under 9 minutes). Each check's full output: runs/gpu-check/<check>.log; this
# summary: runs/gpu-check/summary.txt. NCCL runs one rank per GPU, so the 2-rank checks
# (link layer, all-reduces, dp / pipeline / ps / tensor over NCCL) need 2 GPUs and the
# hybrid 4; with one GPU the codec checks, one-process training and the benchmark run.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
if [ ! -x "$PY" ]; then
  echo "gpu check: $PY not found; run bash scripts/setup.sh first"; exit 2
fi
LOGS=runs/gpu-check
mkdir -p "$LOGS"
exec > >(tee "$LOGS/summary.txt") 2>&1
TEE=$!
trap 'exec >&- 2>&-; wait "$TEE"' EXIT  # the summary is whole when the script returns
read -r GPUS TORCH CUDA <<<"$("$PY" -c 'import torch
n = torch.cuda.device_count() if torch.cuda.is_available() else 0
print(n, torch.__version__, torch.version.cuda or "none")')"
echo "gpu check: torch $TORCH (CUDA build: $CUDA), $GPUS GPU(s) visible"
if [ "$GPUS" = 0 ]; then
  # a GPU that this torch cannot see (a CPU-only build, a driver it does not support) must
  # not pass as "no GPU here"
  SEEN=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  if [ "${SEEN:-0}" -gt 0 ]; then
    echo "gpu check: FAILED: nvidia-smi lists $SEEN GPU(s) but torch $TORCH (CUDA build: $CUDA)" \
      "sees none; install a CUDA build of torch into $PY's environment" \
      "(APPROXDIST_TORCH=... bash scripts/setup.sh in a fresh .venv) or check the driver"
    exit 1
  fi
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
PASSED=0 FAILED=0 SKIPPED=0
if [ "$GPUS" -lt 2 ]; then
  echo "  one GPU: the NCCL checks skip (NCCL refuses two ranks of a group on one GPU)"
fi

# check NAME LIMIT_S WHAT COMMAND...: run it under a time limit, print one line (status,
# seconds, the last line of output); a failure also prints the end of its log
check() {
  local name=$1 limit=$2 what=$3 start status last rc
  shift 3
  start=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$LOGS/$name.log" 2>&1
  rc=$?
  case $rc in 0) status=ok;; 124|137) status=TIMEOUT;; *) status=FAILED;; esac
  last=$(grep -v '^\s*$' "$LOGS/$name.log" | tail -n 1)
  [ "$status" = TIMEOUT ] && last="ran past its ${limit} s limit; $last"
  if [ "$status" = ok ] && grep -Eq '^[0-9]+ skipped|^=* ?[0-9]+ skipped' <<<"$last"; then
    status=skipped
  fi
  case $status in ok) PASSED=$((PASSED + 1));; skipped) SKIPPED=$((SKIPPED + 1));;
    *) FAILED=$((FAILED + 1));; esac
  printf '%-8s %-60s %4ss  %s\n' "$status" "$what" "$(($(date +%s) - start))" "$last"
  if [ "$status" = FAILED ] || [ "$status" = TIMEOUT ]; then
    tail -n 25 "$LOGS/$name.log" | sed 's/^/    | /'
  fi
}

PYTEST=("$PY" -m pytest -m gpu -p no:cacheprovider)
check codecs 90 "codecs on CUDA tensors == the CPU kernels, bit for bit" \
  "${PYTEST[@]}" tests/gpu/test_cuda_codecs.py
check compressors 60 "top-k, random-k, TernGrad, signSGD on CUDA == CPU, bitwise" \
  "${PYTEST[@]}" tests/gpu/test_cuda_compressors.py
check link 90 "link layer + all-reduces on CUDA buffers over NCCL" \
  "${PYTEST[@]}" tests/gpu/test_cuda_link.py
check train 240 "train --device cuda: step 1 vs float64, an epoch vs CPU" \
  "${PYTEST[@]}" tests/gpu/test_cuda_train.py
check bench-codec 60 "bench codec --device cuda (throughput, GB/s)" \
  "$PY" -m approxdist bench codec --device cuda --size 16M --repeats 3
echo "gpu check: $PASSED passed, $SKIPPED skipped (too few GPUs), $FAILED failed or timed out; logs in $LOGS/"
[ "$FAILED" = 0 ]
