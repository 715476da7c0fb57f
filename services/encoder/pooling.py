"""Sentence pooling of a sentence-transformers model (its `1_Pooling/config.json`), over padded batches.

    mean   average of the real tokens' hidden states (what all-MiniLM-L6-v2 uses)
    cls    the first token's state
    max    per-dimension maximum over the real tokens
"""

from __future__ import annotations

import enum
import json
from pathlib import Path

import torch


class Pooling(enum.StrEnum):
    MEAN = "mean"
    CLS = "cls"
    MAX = "max"

    @classmethod
    def of_dir(cls, model_dir: Path) -> Pooling:
        """The pooling a sentence-transformers directory declares (mean when it declares none, as their default)."""
        path = model_dir / "1_Pooling" / "config.json"
        if not path.is_file():
            return cls.MEAN
        d = json.loads(path.read_text())
        modes = [m for m, key in ((cls.MEAN, "pooling_mode_mean_tokens"), (cls.CLS, "pooling_mode_cls_token"),
                                  (cls.MAX, "pooling_mode_max_tokens")) if d.get(key)]
        unsupported = [k for k in ("pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens",
                                   "pooling_mode_lasttoken") if d.get(k)]
        if unsupported or len(modes) != 1:
            raise ValueError(f"{path}: pooling {', '.join(unsupported) or modes or 'none'} is not supported; the "
                             "encoder pools with exactly one of mean, cls or max")
        return modes[0]


def pool(hidden: torch.Tensor, mask: torch.Tensor, how: Pooling) -> torch.Tensor:
    """hidden [B, T, H], mask [B, T] (1 real, 0 padding) -> [B, H]."""
    if how is Pooling.CLS:
        return hidden[:, 0]
    m = mask.unsqueeze(-1).to(hidden.dtype)  # [B, T, 1]
    if how is Pooling.MAX:
        return hidden.masked_fill(m == 0, torch.finfo(hidden.dtype).min).amax(dim=1)
    # sentence-transformers: sum of masked states / number of real tokens (clamped like theirs)
    return (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)
