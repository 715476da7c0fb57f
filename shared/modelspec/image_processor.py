"""A model's image preprocessing, as its preprocessor_config.json describes it (CLIP / SigLIP image processors).

Split in two on purpose:
  fit(image)        -> uint8 pixels [H, W, 3] at the vision tower's input size (convert to RGB, resize, center crop);
                       done once where the image is decoded (the gateway); these pixels travel to the encoder.
  normalize(pixels) -> float32 [3, H, W] (rescale, then (x - mean) / std), done next to the tower.
Each step follows transformers' PIL image-processor backend operation by operation (PIL resize on uint8, float64
rescale cast to float32, float32 normalize), so pixel values equal what `CLIPImageProcessor` /
`SiglipImageProcessor` produce. Only numpy and Pillow here: the gateway imports this module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
SIGLIP_MEAN = (0.5, 0.5, 0.5)
SIGLIP_STD = (0.5, 0.5, 0.5)
# mime type of MediaInput.data between services: the fitted uint8 pixels [H, W, 3] (ImageSpec.output_hw), row-major
RAW_RGB_MIME = "image/x-raw-rgb8"
_BICUBIC, _BILINEAR = 3, 2  # PIL.Image.Resampling values (as preprocessor_config.json stores them)


@dataclass(frozen=True)
class ImageSpec:
    """What one model does to an image before its vision tower."""

    shortest_edge: int | None  # resize so the shorter side has this length (CLIP) ...
    resize_hw: tuple[int, int] | None  # ... or to exactly (height, width) (SigLIP)
    crop_hw: tuple[int, int] | None  # center crop after resizing
    resample: int
    rescale_factor: float | None  # None: no rescale
    mean: tuple[float, ...] | None  # None: no normalization
    std: tuple[float, ...] | None

    @property
    def output_hw(self) -> tuple[int, int]:
        if self.crop_hw is not None:
            return self.crop_hw
        assert self.resize_hw is not None, "a shortest-edge resize needs a center crop to give a fixed size"
        return self.resize_hw

    @classmethod
    def from_dict(cls, cfg: dict[str, Any], *, vision_kind: str, image_size: int) -> ImageSpec:
        """From a preprocessor_config.json dict (missing keys take the CLIP / SigLIP processor defaults)."""
        clip = vision_kind == "clip"
        size = cfg.get("size") or (
            {"shortest_edge": image_size} if clip else {"height": image_size, "width": image_size}
        )
        if isinstance(size, int):
            size = {"shortest_edge": size} if clip else {"height": size, "width": size}
        do_resize = cfg.get("do_resize", True)
        shortest = int(size["shortest_edge"]) if do_resize and "shortest_edge" in size else None
        resize_hw = (int(size["height"]), int(size["width"])) if do_resize and "height" in size else None
        crop = cfg.get("crop_size") or ({"height": image_size, "width": image_size} if clip else None)
        if isinstance(crop, int):
            crop = {"height": crop, "width": crop}
        do_crop = cfg.get("do_center_crop", clip)
        crop_hw = (int(crop["height"]), int(crop["width"])) if do_crop and crop else None
        if shortest is None and resize_hw is None and crop_hw is None:
            crop_hw = (image_size, image_size)
        rescale = float(cfg.get("rescale_factor", 1 / 255)) if cfg.get("do_rescale", True) else None
        mean = cfg.get("image_mean") or (OPENAI_CLIP_MEAN if clip else SIGLIP_MEAN)
        std = cfg.get("image_std") or (OPENAI_CLIP_STD if clip else SIGLIP_STD)
        normalize = cfg.get("do_normalize", True)
        return cls(
            shortest,
            resize_hw,
            crop_hw,
            int(cfg.get("resample", _BICUBIC if clip else _BILINEAR)),
            rescale,
            tuple(float(m) for m in mean) if normalize else None,
            tuple(float(s) for s in std) if normalize else None,
        )

    @classmethod
    def for_model(cls, model_dir: str | Path, *, vision_kind: str, image_size: int) -> ImageSpec:
        path = Path(model_dir) / "preprocessor_config.json"
        cfg = json.loads(path.read_text()) if path.is_file() else {}
        return cls.from_dict(cfg, vision_kind=vision_kind, image_size=image_size)

    # ---- the two halves --------------------------------------------------------------------------------------
    def fit(self, image: Any) -> np.ndarray:
        """A PIL image -> uint8 [H, W, 3] at the tower's input size."""
        img = image if image.mode == "RGB" else image.convert("RGB")
        if self.shortest_edge is not None:
            w, h = img.size
            short, long = (w, h) if w <= h else (h, w)
            new_long = int(self.shortest_edge * long / short)  # transformers' rounding (truncation)
            new_w, new_h = (self.shortest_edge, new_long) if w <= h else (new_long, self.shortest_edge)
            img = img.resize((new_w, new_h), resample=self.resample)
        elif self.resize_hw is not None:
            img = img.resize((self.resize_hw[1], self.resize_hw[0]), resample=self.resample)
        pixels = np.asarray(img, dtype=np.uint8)
        if self.crop_hw is not None:
            pixels = _center_crop(pixels, self.crop_hw)
        return np.ascontiguousarray(pixels)

    def pixels_from_bytes(self, data: bytes) -> np.ndarray:
        """MediaInput.data (RAW_RGB_MIME) -> uint8 [H, W, 3]; ValueError when the size is not this model's."""
        h, w = self.output_hw
        if len(data) != h * w * 3:
            raise ValueError(f"raw image of {len(data)} bytes; this model takes {h}x{w} RGB ({h * w * 3} bytes)")
        return np.frombuffer(data, dtype=np.uint8).reshape(h, w, 3)

    def normalize(self, pixels: np.ndarray) -> np.ndarray:
        """uint8 [H, W, 3] -> float32 [3, H, W]."""
        x = pixels.transpose(2, 0, 1)
        if self.rescale_factor is not None:
            x = (x.astype(np.float64) * self.rescale_factor).astype(np.float32)
        else:
            x = x.astype(np.float32)
        if self.mean is not None and self.std is not None:
            mean = np.array(self.mean, dtype=np.float32)[:, None, None]
            std = np.array(self.std, dtype=np.float32)[:, None, None]
            x = (x - mean) / std
        return np.ascontiguousarray(x, dtype=np.float32)


def _center_crop(pixels: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """Center crop [H, W, C], zero-padding a side that is too short (as transformers does)."""
    h, w = pixels.shape[:2]
    ch, cw = hw
    if h < ch or w < cw:
        ph, pw = max(ch, h), max(cw, w)
        padded = np.zeros((ph, pw, pixels.shape[2]), dtype=pixels.dtype)
        top, left = -(-(ph - h) // 2), -(-(pw - w) // 2)
        padded[top : top + h, left : left + w] = pixels
        pixels, h, w = padded, ph, pw
    top, left = (h - ch) // 2, (w - cw) // 2
    return pixels[top : top + ch, left : left + cw]
