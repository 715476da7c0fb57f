#!/usr/bin/env bash
# The static checks `make test` runs before the suite (scripts/install.sh must have run; the tools are pinned in
# pyproject's test extra, their settings live in pyproject.toml). Every checker runs even when an earlier one
# fails, so one run lists everything to fix; the exit status is non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${PDRELAY_VENV:-.venv}
bin="$VENV/bin"
failed=()
check() {
  local name=$1; shift
  local t0=$SECONDS
  if "$@"; then echo "[lint] $name ok ($((SECONDS - t0))s)"; else echo "[lint] $name FAILED ($((SECONDS - t0))s)" >&2; failed+=("$name"); fi
}
check "ruff check" "$bin/ruff" check --quiet --output-format concise .
check "ruff format" "$bin/ruff" format --check --quiet .
check "mypy" "$bin/mypy"
check "lint-imports" "$bin/lint-imports"  # the contracts in .importlinter
check "deptry" "$bin/deptry" .
check "native C" "$bin/python" scripts/check_native.py  # clang-format, and -Werror builds for AVX-512 / AVX2 / x86-64
# No product file over 500 lines, no function over 80 (tests and Triton kernels excepted): fails lint otherwise.
check "size report" "$bin/python" scripts/size_report.py --top 0 --max-function-lines 80 --max-file-lines 500
if [ ${#failed[@]} -gt 0 ]; then
  echo "[lint] failed: ${failed[*]}" >&2
  exit 1
fi
