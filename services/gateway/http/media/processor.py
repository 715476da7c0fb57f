"""What the served model makes of images: its placeholder token, how many positions each image takes, and the
fitted pixels that travel to whoever runs the vision tower (MediaInput: raw RGB at the tower's input size).

Built from the model directory at start-up; None for a text-only model (then any image is a 400).
"""

from __future__ import annotations

from pathlib import Path

from services.gateway.backend import PromptImage
from services.gateway.http.media.images import DecodedImage
from shared.modelspec.image_processor import ImageSpec
from shared.modelspec.vlm_config import load_llava_config


class MediaProcessor:
    def __init__(self, *, image_token_id: int, placeholder: str, num_image_tokens: int, spec: ImageSpec) -> None:
        self.image_token_id = image_token_id
        self.placeholder = placeholder  # the text the chat content gets per image, e.g. "<image>"
        self.num_image_tokens = num_image_tokens
        self.spec = spec

    @classmethod
    def for_model(cls, model_dir: str | Path, tokenizer) -> MediaProcessor | None:
        """`tokenizer`: anything with convert_ids_to_tokens (the gateway's HF tokenizer). None: text-only."""
        cfg = load_llava_config(model_dir)
        if cfg is None:
            return None
        placeholder = tokenizer.convert_ids_to_tokens(cfg.image_token_id)
        if not isinstance(placeholder, str):
            raise ValueError(f"{model_dir}: image token id {cfg.image_token_id} is not in the tokenizer")
        spec = ImageSpec.for_model(model_dir, vision_kind=cfg.vision.kind, image_size=cfg.vision.image_size)
        return cls(
            image_token_id=cfg.image_token_id, placeholder=placeholder, num_image_tokens=cfg.num_image_tokens, spec=spec
        )

    def expand(
        self, token_ids: tuple[int, ...], images: list[DecodedImage]
    ) -> tuple[tuple[int, ...], list[PromptImage]]:
        """Each placeholder token -> num_image_tokens of them, paired with the images in order. ValueError when
        the prompt's placeholders and the request's images do not pair up."""
        count = sum(1 for t in token_ids if t == self.image_token_id)
        if count != len(images):
            raise ValueError(
                f"the prompt holds {count} image placeholder(s) ({self.placeholder!r}) but the request "
                f"has {len(images)} image(s); do not type {self.placeholder!r} in text parts"
            )
        out: list[int] = []
        items: list[PromptImage] = []
        for t in token_ids:
            if t == self.image_token_id:
                img = images[len(items)]
                items.append(
                    PromptImage(img.media_hash, self.spec.fit(img.image).tobytes(), len(out), self.num_image_tokens)
                )
                out.extend([t] * self.num_image_tokens)
            else:
                out.append(t)
        return tuple(out), items
