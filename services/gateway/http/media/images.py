"""Encoded bytes -> one validated, fully decoded Pillow image and its media hash.

Decoded once, here: the format must be PNG, JPEG or WebP (by content, not by what the client claims), the pixel
count is checked before decoding (decompression bombs), truncated or corrupt files are refused. The media hash is
xxh3-128 over the decoded RGB pixels and their size, so the same picture hashes the same whatever its encoding
metadata, and any pixel change gives another hash.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

import xxhash
from PIL import Image

from services.gateway.http.media.sources import MediaError

FORMATS = ("PNG", "JPEG", "WEBP")


@dataclass(frozen=True)
class DecodedImage:
    image: Image.Image  # RGB, loaded
    media_hash: str  # hex


def decode_image(data: bytes, *, max_pixels: int) -> DecodedImage:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data), formats=FORMATS)
            w, h = img.size
            if w * h > max_pixels:
                raise MediaError(f"image is {w}x{h} = {w * h} pixels, more than {max_pixels} (--max-image-pixels)")
            img.load()
    except MediaError:
        raise
    except Image.DecompressionBombError:
        raise MediaError(f"image has more than {max_pixels} pixels (--max-image-pixels)") from None
    except Image.UnidentifiedImageError:
        raise MediaError("the image is not a PNG, JPEG or WebP file (or is corrupt)") from None
    except (OSError, ValueError, SyntaxError, Warning) as e:
        raise MediaError(f"the image could not be decoded ({e}); send a valid PNG, JPEG or WebP file") from None
    if w < 1 or h < 1:
        raise MediaError(f"image has an empty size {w}x{h}")
    rgb = img if img.mode == "RGB" else img.convert("RGB")
    hasher = xxhash.xxh3_128()
    hasher.update(f"{w}x{h}:".encode())
    hasher.update(rgb.tobytes())
    return DecodedImage(rgb, hasher.hexdigest())
