#!/usr/bin/env bash
# `make up`: run the local cluster on the bundled model in the foreground and answer one chat request through it.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${PDRELAY_VENV:-.venv}
exec "$VENV/bin/pdrelay" up --demo "$@"
