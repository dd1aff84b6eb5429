#!/usr/bin/env bash
# The GPU check of the machine this project borrows (benchmarks/gpu_check.py says what it asserts). Usage:
#   bash benchmarks/gpu_check.sh [--out OUT.json] [more gpu_check.py options]
# Runs under $PYTHON (default: python3, the borrowed machine's), from the repository root; the model is built
# there from benchmarks/gpu_check_model/ (random weights, the default model's shape). Exits 1 when an assertion
# fails; the figures are in OUT.json (default bench_out/gpu_check.json).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L || true; fi
uptime
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" timeout "${GPU_CHECK_TIMEOUT:-400}" \
  "$PY" benchmarks/gpu_check.py --hf-python "$PY" "$@"
