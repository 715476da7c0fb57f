"""The encoder service: sentence embeddings (Embed) and, with a vision-language --model, its vision tower (Encode).

warm up   the embedding model (--encoder-model; a bundled one is prepared once into the model cache), its
          dynamic batcher and one warm-up forward; the vision tower when --model is a vision-language model;
          then the registration says model, modalities and capacity, and the instance turns "ready"
load      in-flight RPCs and inputs waiting for a forward, over NATS like every role
drain     the lifecycle's: refuse new RPCs, let the running ones finish, then stop the batcher
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import torch

from proto.pdrelay.v1 import worker_pb2_grpc
from services.encoder.batcher import EmbedBatcher
from services.encoder.embedding import SentenceEmbedder
from services.encoder.metrics import EncoderMetrics
from services.encoder.servicer import EncoderServicer
from services.encoder.vision import VisionEncoder, load_vision_encoder
from shared.cluster.bus.load import LoadSnapshot
from shared.cluster.errors import StartupError
from shared.cluster.instance import Capacity, EncoderInfo, Modality
from shared.config.devices import torch_device
from shared.config.resolved import ResolvedConfig
from shared.config.roles import Role
from shared.engine.models.bert import BertConfig
from shared.modelspec.bundled import BUNDLED_PREFIX, resolve_model_path
from shared.service import Service, ServiceConfig, ServiceOptions
from shared.service.faults import Faults

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
NO_EMBEDDING_MODEL = "none"


def embedding_model_name(spec: str) -> str:
    """Served name of --encoder-model: the bundled name without 'bundled:', else the directory's name."""
    if spec.startswith(BUNDLED_PREFIX):
        return spec[len(BUNDLED_PREFIX) :]
    return os.path.basename(os.path.normpath(spec))


class EncoderService(Service):
    role = Role.ENCODER

    def __init__(self, cfg: ResolvedConfig, options: ServiceOptions = ServiceOptions()) -> None:
        super().__init__(ServiceConfig.of(cfg), options)
        self.cfg = cfg
        enc = cfg.encoder
        if enc.encoder_model == NO_EMBEDDING_MODEL and not _vision_requested(cfg):
            raise ValueError(
                f"--encoder-model {NO_EMBEDDING_MODEL} and a text-only --model {cfg.model.model}: "
                "this encoder would serve nothing; give it an embedding model or a vision-language "
                "--model"
            )
        # Checked before anything starts, so a wrong --encoder-model is one line and exit 2, not a failed warm-up.
        self.embedding_dir: Path | None = None
        if enc.encoder_model != NO_EMBEDDING_MODEL:
            try:
                self.embedding_dir = resolve_model_path(enc.encoder_model, cfg.model.model_cache_dir)
                BertConfig.load(self.embedding_dir)
            except ValueError as e:
                raise ValueError(f"--encoder-model {enc.encoder_model}: {e}") from None
            except OSError as e:
                raise ValueError(
                    f"--encoder-model {enc.encoder_model}: cannot read {e.filename}: {e.strerror}; "
                    "point it at a sentence-transformers model directory (or 'none')"
                ) from None
        self.faults = Faults(enc.encoder_fault_injection, self.instance_id)
        self.metrics = EncoderMetrics(self.telemetry.metrics.registry)
        self.embedder: SentenceEmbedder | None = None
        self.batcher: EmbedBatcher | None = None
        self.vision: VisionEncoder | None = None

    # ---- lifecycle hooks ---------------------------------------------------------------------------------------
    def add_servicers(self, server: grpc.aio.Server) -> Sequence[str]:
        worker_pb2_grpc.add_EncoderServicer_to_server(EncoderServicer(self), server)
        return ("pdrelay.v1.Encoder",)

    async def warm_up(self) -> None:
        t0 = time.monotonic()
        cfg, enc = self.cfg, self.cfg.encoder
        threads = cfg.device.threads or 1
        torch.set_num_threads(threads)  # loading (and the vision tower's own thread, if any) use this process's
        if enc.encoder_model != NO_EMBEDDING_MODEL:
            self.embedder = await asyncio.to_thread(self._load_embedder)
            self.batcher = EmbedBatcher(
                self.embedder.embed,
                threads=threads,
                max_batch_size=enc.encoder_max_batch_size,
                max_batch_tokens=enc.encoder_max_batch_tokens,
                wait_s=enc.encoder_batch_wait_ms / 1e3,
                on_batch=self.metrics.observe_batch,
            ).start()
            await self.batcher.submit([[0, 1, 2, 3]])  # first forward: lazy initialisation off the request path
        self.vision = await asyncio.to_thread(load_vision_encoder, cfg)
        assert self.registrar is not None
        await self.registrar.update(**self.describe())
        spec = self.embedder.spec if self.embedder is not None else None
        log.info(
            "%s: ready in %.1f s: embeddings %s, vision %s",
            self.instance_id,
            time.monotonic() - t0,
            f"{spec.name} ({spec.dim}-d, {spec.max_seq_len} tokens)" if spec else "off",
            self.vision.model if self.vision is not None else "off",
        )

    def _load_embedder(self) -> SentenceEmbedder:
        cfg = self.cfg
        assert self.embedding_dir is not None
        try:
            return SentenceEmbedder(
                self.embedding_dir,
                embedding_model_name(cfg.encoder.encoder_model),
                _DTYPES.get(cfg.model.dtype, torch.float32),
                device=torch_device(cfg.device.device, cfg.device.base_gpu_id, os.environ),
            )
        except ValueError as e:  # weights that do not fit the config, an unsupported pooling, no tokenizer
            raise StartupError(f"--encoder-model {cfg.encoder.encoder_model}: {e}") from None

    def describe(self) -> dict[str, Any]:
        modalities: list[Modality] = []
        info: dict[str, Any] = {}
        if self.embedder is not None:
            s = self.embedder.spec
            modalities.append(Modality.EMBEDDING)
            info.update(embedding_model=s.name, embedding_dim=s.dim, max_seq_len=s.max_seq_len)
        if self.vision is not None:
            modalities.append(Modality.IMAGE)
            info["vision_model"] = self.vision.model
        d: dict[str, Any] = {
            "encoder": EncoderInfo(modalities=tuple(modalities), **info),
            "capacity": Capacity(max_running_requests=self.cfg.encoder.encoder_max_batch_size),
        }
        # The registration's model: what this instance serves first (the embedding model, else the VLM).
        model = info.get("embedding_model") or info.get("vision_model")
        if model:
            d["model"] = model
        return d

    def load_snapshot(self) -> LoadSnapshot | None:
        queued = self.batcher.queued_inputs if self.batcher is not None else 0
        return LoadSnapshot(running=self.gate.inflight, queued=queued)

    async def on_stop(self) -> None:
        if self.batcher is not None:
            await self.batcher.close()
        if self.vision is not None:
            await self.vision.close()


def _vision_requested(cfg: ResolvedConfig) -> bool:
    from services.encoder.vision import is_vision_language_model

    return is_vision_language_model(cfg.model.model)
