"""A described CPU host, so config tests do not depend on this machine's memory, GPUs or installed engines."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from shared.config import PassContext, StaticProbe

ALL_ENGINES = frozenset({"nixl_cu12._api", "mooncake.engine"})


def _make_ctx(**probe: object) -> PassContext:
    fields = {"modules": ALL_ENGINES, "libraries": frozenset({"ibverbs"}), "memory_bytes": 16 << 30, **probe}
    return PassContext(probe=StaticProbe(**fields))  # type: ignore[arg-type]


@pytest.fixture
def make_ctx() -> Callable[..., PassContext]:
    """make_ctx(cuda=True, gpus=1, memory_bytes=...) -> a PassContext over a StaticProbe with those facts."""
    return _make_ctx


@pytest.fixture
def ctx() -> PassContext:
    """A 2-core CPU host with 16 GiB available and both transfer engines installed."""
    return _make_ctx()
