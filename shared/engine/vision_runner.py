"""VisionEncoderRunner: the vision half of a LLaVA checkpoint (tower + projector) on one device.

pixels (uint8 [H, W, 3] at the tower's size, as ImageSpec.fit makes them) -> one embedding per image placeholder
token, [num_image_tokens, text_hidden]. The encoder service, the colocated worker and in-process tests use it; the
decoder half is a ModelRunner over the same directory.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from shared.engine.kv_pool import torch_dtype
from shared.engine.models import load_model_config
from shared.engine.models.llava import (
    LlavaVisionEncoder,
    LlavaWeights,
    canonical_name,
    load_llava_config,
)
from shared.engine.weights import load_weights
from shared.modelspec.image_processor import ImageSpec


class VisionEncoderRunner:
    """Attributes: cfg (LlavaConfig), image_spec, num_image_tokens, image_token_id, hidden_size, dtype, device."""

    def __init__(
        self, model_dir: str | Path, *, dtype: str = "float32", device: str = "cpu", max_batch_images: int = 8
    ) -> None:
        cfg = load_llava_config(model_dir)
        if cfg is None:
            raise ValueError(f"{model_dir} is not a vision-language (LLaVA) model; it has no vision tower")
        if max_batch_images < 1:
            raise ValueError(f"max_batch_images must be >= 1 (got {max_batch_images})")
        self.cfg = cfg
        self.dtype = torch_dtype(dtype)
        self.device = torch.device(device)
        self.max_batch_images = max_batch_images
        self.image_spec = ImageSpec.for_model(model_dir, vision_kind=cfg.vision.kind, image_size=cfg.vision.image_size)
        self.model = LlavaVisionEncoder(cfg, self.dtype)
        both = LlavaWeights(None, self.model)
        load_weights(
            both,
            both.hf_weight_map(),
            model_dir,
            rename=canonical_name,
            skip_prefixes=both.skipped_prefixes(load_model_config(model_dir)),
        )
        self.model.eval()
        self.model.to(self.device)

    @property
    def num_image_tokens(self) -> int:
        return self.cfg.num_image_tokens

    @property
    def image_token_id(self) -> int:
        return self.cfg.image_token_id

    @property
    def hidden_size(self) -> int:
        return self.cfg.text_hidden_size

    def pixel_values(self, pixels: Sequence[np.ndarray]) -> torch.Tensor:
        """uint8 [H, W, 3] images -> normalized float32 [B, 3, H, W] on the device."""
        want = self.image_spec.output_hw
        for p in pixels:
            if p.dtype != np.uint8 or p.ndim != 3 or p.shape[2] != 3 or tuple(p.shape[:2]) != want:
                raise ValueError(
                    f"image pixels must be uint8 [{want[0]}, {want[1]}, 3] (got {p.dtype} "
                    f"{list(p.shape)}); fit them with the model's ImageSpec first"
                )
        arr = np.stack([self.image_spec.normalize(p) for p in pixels])
        return torch.from_numpy(arr).to(self.device)

    @torch.inference_mode()
    def encode(self, pixels: Sequence[np.ndarray]) -> list[torch.Tensor]:
        """One [num_image_tokens, hidden] tensor per image, in order (batched max_batch_images at a time)."""
        out: list[torch.Tensor] = []
        for i in range(0, len(pixels), self.max_batch_images):
            emb = self.model(self.pixel_values(pixels[i : i + self.max_batch_images]))
            out.extend(emb.unbind(0))
        return out
