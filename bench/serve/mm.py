"""`random-mm`: random text prompts with images (chat only), for EPD vs colocated and repeated vs unique images.

Each request carries --mm-images-per-request PNG images (data: URIs) of --mm-image-size pixels, noise so that no
two differ by accident. A share --mm-repeat-ratio of the image slots draws from a small pool (--mm-pool-size
images reused across requests: encoder-cache and prefix-cache hits), the rest are fresh images never sent before.
"""

from __future__ import annotations

import base64
import io
import random

from bench.serve.datasets import BenchRequest, BenchTokenizer, exact_text


def png_data_uri(rng: random.Random, size: int) -> str:
    import numpy as np
    from PIL import Image

    arr = np.random.default_rng(rng.getrandbits(63)).integers(0, 256, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr, "RGB").save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def random_mm_dataset(
    tok: BenchTokenizer,
    *,
    num_prompts: int,
    input_len: int,
    output_len: int,
    seed: int,
    images_per_request: int,
    repeat_ratio: float,
    pool_size: int,
    image_size: int,
) -> list[BenchRequest]:
    if images_per_request < 1:
        raise ValueError(f"--mm-images-per-request must be >= 1 (got {images_per_request})")
    if not 0.0 <= repeat_ratio <= 1.0:
        raise ValueError(f"--mm-repeat-ratio must be in [0, 1] (got {repeat_ratio})")
    if pool_size < 1 or image_size < 8:
        raise ValueError(f"--mm-pool-size must be >= 1 and --mm-image-size >= 8 (got {pool_size}, {image_size})")
    rng = random.Random(seed)
    pool = [png_data_uri(rng, image_size) for _ in range(pool_size)]
    out: list[BenchRequest] = []
    for _ in range(num_prompts):
        text, n = exact_text(tok, rng, input_len)
        images = tuple(
            rng.choice(pool) if rng.random() < repeat_ratio else png_data_uri(rng, image_size)
            for _ in range(images_per_request)
        )
        out.append(BenchRequest(text, n, output_len, images=images))
    return out
