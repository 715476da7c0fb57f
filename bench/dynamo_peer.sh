#!/usr/bin/env bash
# Dynamo's frontend + mocker engine as the serving benchmark's peer (`pdrelay bench serve --peer-cmd`).
#
#   usage: bench/dynamo_peer.sh PORT PID_FILE [MODEL_DIR]
#
# Starts `python -m dynamo.mocker` (one mock engine, no simulated delay worth measuring) and
# `python -m dynamo.frontend` on 127.0.0.1:PORT, with file discovery, the TCP request plane and the ZMQ event
# plane (no etcd, no NATS). Writes `front PID` (the frontend: tokenizer, detokenizer, router, HTTP) and
# `worker PID` (the mocker) to PID_FILE, then waits; SIGTERM stops both. MODEL_DIR (default: the bundled
# model, `pdrelay model prepare`) must hold tokenizer.json, tokenizer_config.json and config.json.
#
# Dynamo's ZMQ publishers bind 0.0.0.0, so this refuses to run in a network namespace that has any interface
# besides loopback: run the whole benchmark inside its own one, e.g.
#
#   unshare -n bash -c 'ip link set lo up && .venv/bin/pdrelay bench serve --mock-workers \
#       --peer-cmd "bench/dynamo_peer.sh {port} {pid_file}" --peer-label dynamo \
#       --random-output-len 8 --max-concurrency 1 --throughput-concurrency 32'
#
# Dynamo is never a dependency of pdrelay. Install it into a separate virtualenv (no torch; the small
# packages its frontend and mocker import), and point DYNAMO_PYTHON at that venv's python:
#
#   python3 -m venv /tmp/dynamo-venv
#   /tmp/dynamo-venv/bin/pip download --no-deps ai-dynamo ai-dynamo-runtime -d /tmp/dynamo-wheels
#   /tmp/dynamo-venv/bin/pip install --no-deps /tmp/dynamo-wheels/*.whl
#   /tmp/dynamo-venv/bin/pip install pydantic uvloop pyzmq msgspec prometheus-client aiohttp \
#       typing-extensions packaging pyyaml
#   export DYNAMO_PYTHON=/tmp/dynamo-venv/bin/python
#
# Environment: DYNAMO_PYTHON (default: python3), DYNAMO_MOCKER_SPEEDUP (the mocker's --speedup-ratio,
# default 10000: its simulated step times shrink to microseconds, like pdrelay's mock with no delay),
# DYNAMO_ROUTER_MODE (default round-robin; pdrelay's mock gateway does no KV routing either),
# DYNAMO_PEER_ALLOW_HOST_NETWORK=1 to skip the namespace check (the ZMQ ports are then open on every interface).
set -euo pipefail

# shellcheck source=bench/peer_setup.sh
source "$(dirname "$0")/peer_setup.sh"
peer_args "$@"
peer_model_has tokenizer.json
peer_python DYNAMO_PYTHON dynamo.frontend,dynamo.mocker

if [[ ${DYNAMO_PEER_ALLOW_HOST_NETWORK:-0} != 1 ]]; then
    others=$(ip -o link show | awk -F': ' '{print $2}' | grep -v '^lo$' || true)
    if [[ -n $others ]]; then
        echo "$0: this network namespace has interfaces besides lo ($(echo $others | tr '\n' ' '));" \
             "Dynamo's ZMQ publishers bind 0.0.0.0: run the benchmark under 'unshare -n' (see the top of" \
             "this script) or set DYNAMO_PEER_ALLOW_HOST_NETWORK=1" >&2
        exit 2
    fi
    ip link set lo up
fi

state=$(mktemp -d -t pdrelay-dynamo-peer.XXXXXX)
pids=()
cleanup() {
    trap - TERM INT EXIT
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$state"
}
trap cleanup TERM INT EXIT

export DYN_FILE_KV=$state/kv HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
name=$(basename "$model_dir")
planes=(--discovery-backend file --request-plane tcp --event-plane zmq)

"$py" -m dynamo.mocker --model-path "$model_dir" --model-name "$name" "${planes[@]}" \
    --speedup-ratio "${DYNAMO_MOCKER_SPEEDUP:-10000}" &
pids+=($!)
echo "worker $!" >>"$pid_file"
"$py" -m dynamo.frontend --http-host 127.0.0.1 --http-port "$port" "${planes[@]}" \
    --router-mode "${DYNAMO_ROUTER_MODE:-round-robin}" &
pids+=($!)
echo "front $!" >>"$pid_file"

# Either process dying ends the peer (the benchmark then reports the log tail).
wait -n "${pids[@]}"
echo "$0: a Dynamo process exited; stopping the peer" >&2
exit 1
