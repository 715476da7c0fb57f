"""What resolution passes get besides the config: a probe of the host and what the caller knows about the
processes it starts (PassContext), and the type of a pass."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from shared.config.probe import HostProbe
from shared.config.resolved import ResolvedConfig

ModelLocator = Callable[[str, "str | None"], "str | None"]


def local_model_dir(model: str, cache_dir: str | None = None) -> str | None:
    """--model as a directory whose checkpoint the memory plan can read now, or None (e.g. a bundled model: the
    callers that know where bundled models are prepared pass shared.modelspec.bundled.prepared_model_dir)."""
    path = os.path.expanduser(model)
    return path if os.path.isfile(os.path.join(path, "config.json")) else None


@dataclass(frozen=True)
class PassContext:
    """What passes need besides the config.

    check_transfer_backends: verify the chosen KV transfer engine is installed (tests of other parts turn it off).
    exclusive_host: the caller owns the machine (a benchmark), so --threads 0 means every core instead of 1.
    engines_on_host: how many LLM engine processes (prefill, decode, worker) the caller (`pdrelay up`) starts on
        this host; 0: unknown. With it, --threads 0 splits the cores among them instead of taking 1.
    encoders_on_host: how many encoder processes it starts beside them (they are not in engines_on_host: see
        resolve_threads).
    locate_model: --model (and --model-cache-dir) -> a directory the memory plan reads config.json and the
        safetensors headers from, or None when the weights are not on disk yet (the engine then plans at start).
    reserved_gpu_bytes: memory another process of the caller's will hold on this process's GPU (an encoder sharing
        it), subtracted from the free memory the plan sees.
    """

    probe: HostProbe = field(default_factory=HostProbe)
    check_transfer_backends: bool = True
    exclusive_host: bool = False
    engines_on_host: int = 0
    encoders_on_host: int = 0
    locate_model: ModelLocator = local_model_dir
    reserved_gpu_bytes: int = 0


Pass = Callable[[ResolvedConfig, PassContext], ResolvedConfig]
