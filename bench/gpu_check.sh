#!/usr/bin/env bash
# GPU check, one prepared run (~5 minutes on one H200): the `gpu` tests (Triton kernels at real sizes vs their
# torch references, CUDA-graph replay == eager), then bench/gpu_check.py (kernel timings vs torch/cuBLAS/SDPA and
# the copy-bandwidth roofline, decode steps with and without CUDA graphs at batch 1/16/64). Run from anywhere:
#
#     bench/gpu_check.sh [OUT_DIR]          (default OUT_DIR: $OUT if set, else .run/gpu_check, git-ignored)
#
# PYTHON picks the interpreter (default: the repo's .venv if present, else python3); it needs CUDA torch, triton,
# transformers and the repo installed (pip install -e .). Writes OUT_DIR/gpu-tests.log, gpu_check.txt,
# gpu_check.json and exits non-zero if a test failed or a target was missed. Paste the tables into bench/RESULTS.md.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-.run/gpu_check}}"
mkdir -p "$out"
py="${PYTHON:-}"
if [ -z "$py" ]; then
    if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

echo "== machine"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader \
    || echo "nvidia-smi not found"
"$py" - <<'PY' || { echo "no usable CUDA torch under $py; set PYTHON"; exit 2; }
import torch, triton
assert torch.cuda.is_available(), "torch sees no CUDA device"
print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
PY

echo "== gpu tests"
timeout 240 "$py" -m pytest -q -m gpu -p no:cacheprovider -o addopts="--strict-markers -ra" \
    tests/shared/kernels tests/shared/engine/test_cuda_graph.py 2>&1 | tee "$out/gpu-tests.log"
tests_rc=${PIPESTATUS[0]}

echo "== kernel and decode-step timings"
timeout 300 "$py" -m bench.gpu_check --json-out "$out/gpu_check.json" 2>&1 | tee "$out/gpu_check.txt"
bench_rc=${PIPESTATUS[0]}

echo "== summary: gpu tests rc=$tests_rc, timings rc=$bench_rc (1: a target missed; 124: timed out)"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
