#!/usr/bin/env bash
# Runs the test suite in the project venv (scripts/install.sh must have run). Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${PDRELAY_VENV:-.venv}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# The bundled model is prepared once up front, so the first test using it does not pay the conversion.
"$VENV/bin/pdrelay" model prepare >/dev/null
# One rerun of a failed test: the suite drives real etcd, NATS, transfer engines and model processes on a small
# shared box, where a timing assumption can break once under load. A rerun is printed in the summary ("R", "rerun")
# with the traceback of the failed try, since a passing rerun leaves no other trace of why: it is a bug to fix; a
# test that fails twice still fails the run. PDRELAY_TEST_RERUNS=0 turns this off.
set +e
"$VENV/bin/python" -m pytest --reruns "${PDRELAY_TEST_RERUNS:-1}" --reruns-delay 1 --rerun-show-tracebacks "$@"
rc=$?
set -e
# pytest exits 5 when nothing was collected: that is a failure of the suite, not a pass.
[ "$rc" -eq 5 ] && echo "no tests were collected" >&2
exit "$rc"
