"""Actuators behind one interface (base.Actuator): the local supervisor and Kubernetes."""

from __future__ import annotations

from services.planner.actuators.base import Actuator, DrainTarget, ScaleError

__all__ = ["Actuator", "DrainTarget", "ScaleError"]
