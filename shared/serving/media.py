"""A compute service's own vision tower: MediaInput messages (fitted pixels + media hash + placeholder span) ->
the engine's MediaInput with embeddings, through an encoder cache (a hit skips the tower).

The colocated worker always encodes here (the baseline); prefill does when a request comes without encoder
output. Encoding runs in a thread, off the event loop; the engine keeps stepping meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np

from proto.pdrelay.v1 import common_pb2
from shared.engine.encoder_cache import EncoderCache
from shared.engine.errors import InvalidRequest
from shared.engine.request import MediaInput
from shared.engine.vision_runner import VisionEncoderRunner
from shared.modelspec.image_processor import RAW_RGB_MIME


class LocalVision:
    def __init__(self, runner: VisionEncoderRunner, cache: EncoderCache) -> None:
        self.runner = runner
        self.cache = cache
        self._lock = asyncio.Lock()  # one tower forward at a time: concurrent ones would only share the cores

    def check(self, media: Sequence[common_pb2.MediaInput]) -> list[np.ndarray | None]:
        """Validate spans and pixel bytes; the decoded pixels of each item (None: cached, no data needed)."""
        n = self.runner.num_image_tokens
        out: list[np.ndarray | None] = []
        for i, m in enumerate(media):
            if not m.media_hash:
                raise InvalidRequest(f"media[{i}] has no media_hash", field="media")
            if m.num_tokens != n:
                raise InvalidRequest(
                    f"media[{i}] covers {m.num_tokens} placeholder tokens; this model's images take {n}", field="media"
                )
            if not m.data:
                if m.media_hash not in self.cache:
                    raise InvalidRequest(
                        f"media[{i}] ({m.media_hash}) has no data and is not cached here", field="media"
                    )
                out.append(None)
                continue
            if m.mime_type != RAW_RGB_MIME:
                raise InvalidRequest(
                    f"media[{i}] is {m.mime_type!r}; services exchange {RAW_RGB_MIME!r} (the gateway decodes images)",
                    field="media",
                )
            try:
                out.append(self.runner.image_spec.pixels_from_bytes(m.data))
            except ValueError as e:
                raise InvalidRequest(f"media[{i}]: {e}", field="media") from None
        return out

    async def embed(self, media: Sequence[common_pb2.MediaInput]) -> list[MediaInput]:
        """Embeddings for every item (cached or computed), as engine MediaInputs. Raises InvalidRequest."""
        pixels = self.check(media)
        embeds = {m.media_hash: e for m in media if (e := self.cache.get(m.media_hash)) is not None}
        todo = {
            m.media_hash: p for m, p in zip(media, pixels, strict=True) if m.media_hash not in embeds and p is not None
        }
        if todo:
            async with self._lock:
                computed = await asyncio.to_thread(self.runner.encode, list(todo.values()))
            for h, e in zip(todo, computed, strict=True):
                e = e.clone()  # own storage: a view would keep the whole batch alive in the cache
                self.cache.put(h, e)
                embeds[h] = e
        return [MediaInput(m.token_offset, m.num_tokens, m.media_hash, embeds[m.media_hash]) for m in media]
