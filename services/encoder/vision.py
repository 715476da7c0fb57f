"""The encoder's vision path: the tower (+ projector) of a vision-language model behind the Encode RPC.

The service holds a `VisionEncoder` only when it was started with a vision-language model (`--model` names
one); without it, Encode answers UNIMPLEMENTED. `load_vision_encoder` is the single place that decides, at
warm-up, in a worker thread.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Protocol

from proto.pdrelay.v1 import worker_pb2
from shared.config.resolved import ResolvedConfig
from shared.modelspec.bundled import is_bundled

log = logging.getLogger(__name__)


class VisionEncoder(Protocol):
    """media -> embeddings for a vision-language model's prefill.

    `model` is the served name of the vision-language model (what the gateway routes image requests by).
    `encode` answers one EncodeRequest: one MediaEmbedding per media item, in order; it raises
    services.encoder.errors.EncoderError for input it refuses (bad media: INVALID_ARGUMENT) or work it cannot do
    now (OVERLOADED, TIMEOUT). It runs on the service's event loop; heavy work belongs in a thread.
    """

    model: str

    async def encode(self, request: worker_pb2.EncodeRequest) -> worker_pb2.EncodeResponse: ...

    async def close(self) -> None: ...


def is_vision_language_model(spec: str) -> bool:
    """Does `--model` name a vision-language model directory (its config.json has a vision_config)?"""
    if is_bundled(spec):
        return False  # the bundled LLM is text-only
    path = Path(spec).expanduser() / "config.json"
    try:
        return "vision_config" in json.loads(path.read_text())
    except (OSError, ValueError):
        return False


def load_vision_encoder(cfg: ResolvedConfig) -> VisionEncoder | None:
    """The VisionEncoder of `cfg.model` (a resolved encoder config), or None when it is not a vision-language
    model. Runs in a worker thread (loading weights takes seconds)."""
    if not is_vision_language_model(cfg.model.model):
        return None
    from services.encoder.vision_tower import TowerEncoder
    from shared.engine.encoder_cache import EncoderCache
    from shared.engine.vision_runner import VisionEncoderRunner

    enc = cfg.encoder
    runner = VisionEncoderRunner(cfg.model.model, dtype="float32" if cfg.model.dtype == "auto" else cfg.model.dtype)
    name = cfg.model.served_model_name or Path(cfg.model.model).name
    tower = TowerEncoder(
        name,
        runner,
        EncoderCache(enc.encoder_cache_items, enc.encoder_cache_bytes),
        name=cfg.discovery.instance_id or f"encoder-{id(runner):x}",
        host=cfg.grpc.host,
    )
    tower.prewarm("nixl")  # the default --transfer-backend of prefill
    return tower
