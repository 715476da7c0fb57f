# Quick start: `make up` (install, prepare the bundled model, run the local cluster and answer a request)
#              `make test` (install, run the static checks and the test suite)
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: install model up down status lint format test test-fast proto bench-engine clean

install:
	@bash scripts/install.sh

model: install
	@$(VENV)/bin/pdrelay model prepare

up: model
	@bash scripts/up.sh

down:
	@$(VENV)/bin/pdrelay down

status:
	@$(VENV)/bin/pdrelay status

# ruff (lint + format), mypy, import-linter's contracts and deptry (settings in pyproject.toml); the native kernels'
# C layout (clang-format) and warnings (scripts/check_native.py); no product file over 500 lines or function over 80
# (scripts/size_report.py).
lint: install
	@bash scripts/lint.sh

# Applies ruff's safe fixes (import order, modern annotations) and its formatter: what `make lint` then expects.
format: install
	@$(VENV)/bin/ruff check --fix --quiet . ; $(VENV)/bin/ruff format --quiet .

test: install lint
	@bash scripts/test.sh $(PYTEST_ARGS)

# Skip the tests marked slow (bundled model, real clusters): a quick loop while editing.
test-fast: install
	@bash scripts/test.sh -m "not slow" $(PYTEST_ARGS)

proto: install
	@bash scripts/gen_proto.sh

bench-engine: model
	@$(VENV)/bin/pdrelay bench engine

clean:
	rm -rf $(VENV) .run .pytest_cache .mypy_cache .ruff_cache
