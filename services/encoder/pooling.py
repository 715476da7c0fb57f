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

from shared.engine.models.bert import PackedBatch


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
        modes = [
            m
            for m, key in (
                (cls.MEAN, "pooling_mode_mean_tokens"),
                (cls.CLS, "pooling_mode_cls_token"),
                (cls.MAX, "pooling_mode_max_tokens"),
            )
            if d.get(key)
        ]
        unsupported = [
            k
            for k in ("pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken")
            if d.get(k)
        ]
        if unsupported or len(modes) != 1:
            raise ValueError(
                f"{path}: pooling {', '.join(unsupported) or modes or 'none'} is not supported; the "
                "encoder pools with exactly one of mean, cls or max"
            )
        return modes[0]


def pool(hidden: torch.Tensor, batch: PackedBatch, how: Pooling) -> torch.Tensor:
    """hidden [N, H] of a packed batch -> [B, H], one vector per sequence."""
    B, H = batch.batch_size, hidden.shape[1]
    if how is Pooling.CLS:
        starts = torch.cumsum(batch.lengths, 0) - batch.lengths
        return hidden[starts]
    index = batch.seq_ids.unsqueeze(1).expand(-1, H)
    if how is Pooling.MAX:
        out = hidden.new_full((B, H), torch.finfo(hidden.dtype).min)
        return out.scatter_reduce(0, index, hidden, reduce="amax", include_self=True)
    # sentence-transformers: sum of the real tokens' states / their number (clamped like theirs)
    sums = hidden.new_zeros((B, H)).scatter_add_(0, index, hidden)
    return sums / batch.lengths.to(hidden.dtype).clamp(min=1e-9).unsqueeze(1)
