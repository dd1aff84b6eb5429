#!/usr/bin/env bash
# The GPU check for a machine with one GPU (benchmarks/gpu_check.py says what it asserts). Usage:
#   benchmarks/gpu_check.sh [MODEL] [OUT.json] [more gpu_check.py options]
# MODEL: default (the default model), or a local checkpoint directory (an 8B model in bf16 fits 8 minutes on an
# H100-class GPU at the default size). The hf half runs under $PYTHON (default .venv/bin/python); the vLLM half
# under .venv-vllm/bin/python when that imports vllm, else the check says so and ends after the hf half.
# Exits 1 when an assertion fails; the figures are in OUT.json.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="${1:-default}"
OUT="${2:-bench_out/gpu_check.json}"
shift $(( $# < 2 ? $# : 2 ))
PY="${PYTHON:-.venv/bin/python}"
if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L; fi
uptime
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" timeout "${GPU_CHECK_TIMEOUT:-480}" \
  "$PY" benchmarks/gpu_check.py --model "$MODEL" --out "$OUT" --hf-python "$PY" "$@"
