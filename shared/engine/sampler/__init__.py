"""Token sampling and stop conditions: `Sampler` (logits -> token ids), `StopChecker` (when a request ends)."""

from shared.engine.sampler.sampler import Sampler, SamplerOutput
from shared.engine.sampler.stop import StopChecker, StopResult

__all__ = ["Sampler", "SamplerOutput", "StopChecker", "StopResult"]
