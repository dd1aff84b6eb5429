#!/usr/bin/env bash
# One command on a GPU machine: vLLM vs hf on an 8B-class model in bf16 (generation, capture, edits, 4-strength
# sweep), each backend in its own process. Usage:
#   benchmarks/gpu_vllm.sh /path/to/Llama-3.1-8B-Instruct [out.json]
# Needs: `make setup vllm` on the GPU box (the Makefile picks the CUDA vllm wheel when nvidia-smi sees a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="${1:?give a local model directory (8B-class, safetensors)}"
OUT="${2:-bench_out/gpu_vllm.json}"
mkdir -p "$(dirname "$OUT")"
nvidia-smi -L
uptime
.venv/bin/python benchmarks/bench_vllm.py --model "$MODEL" --device cuda --dtype bfloat16 \
  --n 256 --max-new-tokens 128 --batch-size 32 --rounds 3 --out "$OUT"
uptime
