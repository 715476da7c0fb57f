"""image_url -> encoded image bytes: `data:` URIs always; `file://` only under --allowed-local-media-path;
http(s) only from --allowed-media-domains, with size and time limits. Every refusal is a MediaError (a 400)."""

from __future__ import annotations

import base64
import binascii
import os
from pathlib import Path
from typing import Protocol
from urllib.parse import unquote, urlsplit

import httpx

ACCEPTED_MIME = ("image/png", "image/jpeg", "image/jpg", "image/webp")


class MediaLimits(Protocol):
    """The media fields of the gateway's http config group (shared/config/groups.py HttpConfig)."""

    # read-only members (properties), which a frozen dataclass satisfies
    @property
    def limit_mm_per_prompt(self) -> int: ...
    @property
    def allowed_local_media_path(self) -> str | None: ...
    @property
    def allowed_media_domains(self) -> tuple[str, ...]: ...
    @property
    def max_image_bytes(self) -> int: ...
    @property
    def max_image_pixels(self) -> int: ...
    @property
    def media_fetch_timeout_s(self) -> float: ...


class MediaError(ValueError):
    """An image the request cannot use; the message names what is wrong and the fix."""


async def load_bytes(url: str, cfg: MediaLimits, client: httpx.AsyncClient | None = None) -> bytes:
    if not isinstance(url, str) or not url:
        raise MediaError(
            "image_url.url must be a non-empty string (a data: URI, or an allowed file:// or https:// URL)"
        )
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        return _data_uri(url, cfg)
    if scheme == "file":
        return _local_file(url, cfg)
    if scheme in ("http", "https"):
        return await _fetch(url, cfg, client)
    raise MediaError(
        f"image_url scheme {scheme or url[:16]!r} is not supported; send a data: URI (data:image/png;base64,...)"
    )


def _data_uri(url: str, cfg: MediaLimits) -> bytes:
    head, sep, payload = url.partition(",")
    if not sep:
        raise MediaError("malformed data: URI; expected data:image/png;base64,<data>")
    params = head[5:].split(";")
    mime = params[0].lower() or "text/plain"
    if mime not in ACCEPTED_MIME:
        raise MediaError(f"data: URI of type {mime!r}; accepted image types: png, jpeg, webp")
    if "base64" not in (p.lower() for p in params[1:]):
        raise MediaError("data: URI images must be base64-encoded (data:image/png;base64,...)")
    if len(payload) > cfg.max_image_bytes * 4 // 3 + 4:
        raise MediaError(f"image is larger than {cfg.max_image_bytes} bytes (--max-image-bytes)")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise MediaError("data: URI payload is not valid base64") from None
    if len(data) > cfg.max_image_bytes:
        raise MediaError(f"image is {len(data)} bytes, more than {cfg.max_image_bytes} (--max-image-bytes)")
    return data


def _local_file(url: str, cfg: MediaLimits) -> bytes:
    if not cfg.allowed_local_media_path:
        raise MediaError(
            "file:// image URLs are refused; start the gateway with --allowed-local-media-path DIR "
            "to allow reading images from DIR, or send a data: URI"
        )
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise MediaError(f"file:// URL with host {parts.netloc!r}; use file:///absolute/path")
    root = Path(cfg.allowed_local_media_path).resolve()
    path = Path(unquote(parts.path)).resolve()  # symlinks and '..' resolved before the containment check
    if not path.is_relative_to(root):
        raise MediaError(f"{path} is outside the allowed media directory {root} (--allowed-local-media-path)")
    try:
        size = os.stat(path).st_size
        if size > cfg.max_image_bytes:
            raise MediaError(f"image file is {size} bytes, more than {cfg.max_image_bytes} (--max-image-bytes)")
        return path.read_bytes()
    except OSError as e:
        raise MediaError(f"cannot read image file {path}: {e.strerror or e}") from None


async def _fetch(url: str, cfg: MediaLimits, client: httpx.AsyncClient | None) -> bytes:
    host = (urlsplit(url).hostname or "").lower()
    allowed = {d.lower() for d in cfg.allowed_media_domains if d}
    if not allowed:
        raise MediaError(
            "http(s) image URLs are refused by this server; send the image as a data: URI, or start "
            "the gateway with --allowed-media-domains HOST[,HOST...]"
        )
    if host not in allowed:
        raise MediaError(f"image host {host!r} is not in the allowed media domains (--allowed-media-domains)")
    own = client is None
    c = client or httpx.AsyncClient(follow_redirects=False)
    try:
        async with c.stream("GET", url, timeout=cfg.media_fetch_timeout_s) as resp:
            if resp.status_code != 200:
                raise MediaError(f"fetching the image failed: HTTP {resp.status_code} from {host}")
            buf = bytearray()
            async for chunk in resp.aiter_bytes():
                buf.extend(chunk)
                if len(buf) > cfg.max_image_bytes:
                    raise MediaError(f"image at {host} is larger than {cfg.max_image_bytes} bytes (--max-image-bytes)")
            return bytes(buf)
    except httpx.TimeoutException:
        raise MediaError(f"fetching the image from {host} took longer than {cfg.media_fetch_timeout_s} s") from None
    except httpx.HTTPError as e:
        raise MediaError(f"fetching the image from {host} failed: {type(e).__name__}") from None
    finally:
        if own:
            await c.aclose()
