#!/bin/sh
# Entrypoint of the pdrelay image: fill in what only the running container knows, then exec the command
# (`pdrelay serve <role>`), so the service is PID 1's child under `init: true` and gets SIGTERM directly.
set -eu

# The KV transfer engine advertises PDRELAY_TRANSFER_HOST to peers (default 127.0.0.1, right on one host).
# In a container or pod that address must be the container's own IP, which exists only at run time: take the
# address our hostname resolves to (Docker and Kubernetes both map it to the container/pod IP in /etc/hosts).
# A value set by the operator always wins.
if [ -z "${PDRELAY_TRANSFER_HOST:-}" ]; then
  if addr=$(python3 -c 'import socket; print(socket.gethostbyname(socket.gethostname()))' 2>/dev/null); then
    PDRELAY_TRANSFER_HOST=$addr
    export PDRELAY_TRANSFER_HOST
  fi
fi

exec "$@"
