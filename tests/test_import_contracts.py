"""The import contracts of .importlinter hold (layers, leaves, independent roles, no cycles).

`make lint` runs the same check; here it also fails the suite, with import-linter's report naming each import
that breaks a contract.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_RUN = (
    "import sys; from importlinter.cli import lint_imports; "
    "sys.exit(lint_imports(config_filename='.importlinter', no_cache=True, no_logo=True))"
)


def test_import_contracts_are_kept() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", _RUN], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout, r.stdout
