"""A chat request's images, end to end at the gateway: count limit -> bytes (sources) -> one decode + media hash
(images) -> placeholder expansion and fitted pixels (processor). Every refusal is a 400 naming the part."""

from __future__ import annotations

import asyncio

import httpx

from services.gateway.backend import PromptImage
from services.gateway.http.media.images import DecodedImage, decode_image
from services.gateway.http.media.processor import MediaProcessor
from services.gateway.http.media.sources import MediaError, MediaLimits, load_bytes
from services.gateway.openai.errors import bad_request
from services.gateway.openai.media_parts import too_many


class MediaInputs:
    def __init__(self, processor: MediaProcessor | None, cfg: MediaLimits) -> None:
        self.processor = processor
        self.cfg = cfg
        self._client: httpx.AsyncClient | None = None

    @property
    def placeholder(self) -> str | None:
        """What an image part becomes in the chat text; None: the model is text-only (images are refused)."""
        return self.processor.placeholder if self.processor is not None else None

    async def attach(
        self, urls: tuple[tuple[str, str], ...], prompt: tuple[int, ...]
    ) -> tuple[tuple[int, ...], tuple[PromptImage, ...]]:
        """(param, url) of each image part + the tokenized prompt -> (expanded prompt, its images)."""
        if not urls:
            return prompt, ()
        assert self.processor is not None  # plan_chat refused image parts for a text-only model
        if len(urls) > self.cfg.limit_mm_per_prompt:
            raise too_many(len(urls), self.cfg.limit_mm_per_prompt)
        decoded: list[DecodedImage] = []
        for param, url in urls:
            try:
                data = await load_bytes(url, self.cfg, self._http())
                # Decoding a large image takes milliseconds of CPU: off the event loop.
                decoded.append(await asyncio.to_thread(decode_image, data, max_pixels=self.cfg.max_image_pixels))
            except MediaError as e:
                raise bad_request(f"{param}: {e}", param, "invalid_image") from None
        try:
            expanded, items = await asyncio.to_thread(self.processor.expand, prompt, decoded)
        except ValueError as e:
            raise bad_request(str(e), "messages", "invalid_image") from None
        return expanded, tuple(items)

    def _http(self) -> httpx.AsyncClient | None:
        if not self.cfg.allowed_media_domains:
            return None
        if self._client is None:
            self._client = httpx.AsyncClient(follow_redirects=False)
        return self._client
