#!/usr/bin/env bash
# Regenerates the Python stubs of proto/pdrelay/v1/*.proto (checked in; tests/proto catches stale ones).
#
#   scripts/gen_proto.sh            # writes next to the .proto files
#   scripts/gen_proto.sh OUT_DIR    # writes OUT_DIR/pdrelay/v1/... (the staleness test compares against it)
#
# protoc runs with `-I proto`, so the descriptors are named "pdrelay/v1/x.proto" (what other languages expect);
# the generated `from pdrelay.v1 import x_pb2` lines are then rewritten to `from proto.pdrelay.v1 import x_pb2`,
# the import path of the checked-in package. Output is deterministic for a given grpcio-tools version.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${PDRELAY_VENV:-.venv}
PY=${PYTHON:-$VENV/bin/python}
[ -x "$PY" ] || PY=python3
PY=$(command -v "$PY" || true); PY=${PY:-python3}
case "$PY" in /*) ;; *) PY="$PWD/$PY" ;; esac
OUT=${1:-proto}

mkdir -p "$OUT/pdrelay/v1"
# Sorted file list: the same command line, byte for byte, on every machine.
mapfile -t protos < <(cd proto && LC_ALL=C ls pdrelay/v1/*.proto)
out_abs=$(cd "$OUT" && pwd)
(cd proto && "$PY" -m grpc_tools.protoc -I . \
  --python_out="$out_abs" --pyi_out="$out_abs" --grpc_python_out="$out_abs" "${protos[@]}")
for p in "${protos[@]}"; do
  base=$(basename "$p" .proto)
  for f in "$OUT/pdrelay/v1/${base}_pb2.py" "$OUT/pdrelay/v1/${base}_pb2.pyi" "$OUT/pdrelay/v1/${base}_pb2_grpc.py"; do
    [ -f "$f" ] || { echo "[gen_proto] protoc did not write $f" >&2; exit 1; }
    sed -i -E 's/^from pdrelay\.v1 import /from proto.pdrelay.v1 import /' "$f"
  done
done
# Package markers so `from proto.pdrelay.v1 import worker_pb2` works.
for d in "$OUT/pdrelay" "$OUT/pdrelay/v1"; do
  [ -f "$d/__init__.py" ] || : >"$d/__init__.py"
done
echo "[gen_proto] wrote ${#protos[@]} protos into $OUT/pdrelay/v1"
