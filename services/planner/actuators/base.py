"""What carries out the planner's decisions: one interface, a local and a Kubernetes implementation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class ScaleError(Exception):
    """The platform refused or failed to change a role's size (the planner retries with backoff)."""


@dataclass(frozen=True)
class DrainTarget:
    """An instance chosen to go on a scale-down; `host` is its pod name on Kubernetes."""

    instance_id: str
    host: str = ""


class Actuator(Protocol):
    name: str

    async def start(self) -> None:
        """Connect and learn the current sizes."""

    async def scale(self, role: str, target: int, drain: Sequence[DrainTarget] = ()) -> str:
        """Make `role` have `target` instances, draining `drain` first on a scale-down; returns what was done.
        Raises ScaleError when the platform refuses."""

    def desired(self, role: str) -> int | None:
        """The size the platform is working towards (None: unknown)."""

    async def refresh(self) -> None:
        """Re-read the platform's sizes (noticing changes made by someone else)."""

    def take_manual(self) -> dict[str, int]:
        """Sizes set by someone other than the planner since the last call (role -> count): pins."""

    async def close(self) -> None: ...
