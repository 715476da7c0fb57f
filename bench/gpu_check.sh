#!/usr/bin/env bash
# GPU check, one prepared run (<= 8 minutes on one H100 with Python 3.12, torch with CUDA, triton and transformers;
# no NIXL, Mooncake, etcd or NATS needed):
#   1. the `gpu` tests: Triton kernels at real sizes vs their torch references, CUDA-graph replay == eager, the
#      device checksum == the host one, weights loaded straight to the GPU, the VRAM hand-off (skipped without a
#      transfer wheel), the real probe;
#   2. bench/gpu_check.py: kernel timings vs torch/cuBLAS/SDPA and the copy-bandwidth roofline, decode steps with
#      and without CUDA graphs at batch 1/16/64;
#   3. bench/gpu_e2e.py: bf16 logits and greedy tokens vs transformers (bundled model, a 1B-class random config),
#      engine tok/s vs HF generate at c=16, and two engine processes on one GPU handing KV off VRAM -> VRAM with
#      device checksums.
#
#     bench/gpu_check.sh [OUT_DIR]                       (default OUT_DIR: $OUT if set, else .run/gpu_check)
#     bench/gpu_check.sh --device cpu --quick [OUT_DIR]  (smoke run on any machine: tiny sizes, no targets; CI)
#
# PYTHON picks the interpreter (default: the repo's .venv if present, else python3); it needs torch, triton,
# transformers and the repo installed (pip install -e .). Writes OUT_DIR/gpu-tests.log, gpu_check.txt/.json and
# gpu_e2e.txt/.json, and exits non-zero if a test failed, a target was missed or a step timed out (124); 2 when a
# GPU run finds no CUDA. Paste the tables into bench/RESULTS.md.
set -uo pipefail
cd "$(dirname "$0")/.."
device=cuda
quick=()
out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --device) device="$2"; shift 2 ;;
        --device=*) device="${1#*=}"; shift ;;
        --quick) quick=(--quick); shift ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) out="$1"; shift ;;
    esac
done
out="${out:-${OUT:-.run/gpu_check}}"
mkdir -p "$out"
py="${PYTHON:-}"
if [ -z "$py" ]; then
    if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

echo "== machine"
if [ "$device" = cuda ]; then
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader \
        || echo "nvidia-smi not found"
    "$py" - <<'PY' || { echo "no usable CUDA torch under $py; set PYTHON"; exit 2; }
import torch, triton
assert torch.cuda.is_available(), "torch sees no CUDA device"
print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
PY
    echo "== gpu tests"
    timeout 150 "$py" -m pytest -q -m gpu -p no:cacheprovider -o addopts="--strict-markers -ra" \
        tests/shared/kernels tests/shared/engine/test_cuda_graph.py tests/shared/engine/test_model_loading.py \
        tests/shared/transfer/test_checksum.py tests/shared/transfer/test_vram_transfer.py \
        tests/shared/config/test_config_passes.py 2>&1 | tee "$out/gpu-tests.log"
    tests_rc=${PIPESTATUS[0]}
else
    "$py" -c "import torch; print(f'torch {torch.__version__} on cpu (smoke run)')"
    tests_rc=0
fi

echo "== kernel and decode-step timings"
timeout 180 "$py" -m bench.gpu_check --device "$device" "${quick[@]}" --json-out "$out/gpu_check.json" 2>&1 \
    | tee "$out/gpu_check.txt"
bench_rc=${PIPESTATUS[0]}

echo "== engine vs transformers, hand-off between two processes"
timeout 150 "$py" -m bench.gpu_e2e --device "$device" "${quick[@]}" --json-out "$out/gpu_e2e.json" 2>&1 \
    | grep -v "it/s]" | tee "$out/gpu_e2e.txt"
e2e_rc=${PIPESTATUS[0]}

echo "== summary: gpu tests rc=$tests_rc, timings rc=$bench_rc, e2e rc=$e2e_rc (1: a target missed; 124: timed out)"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ] && [ "$e2e_rc" -eq 0 ]
