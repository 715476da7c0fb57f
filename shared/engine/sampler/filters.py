"""Truncation of the sampling distribution: top-k, top-p (nucleus) and min-p, on [R, V] float32 logits."""

from __future__ import annotations

import torch


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """Keep each row's top_k[r] tokens (top_k: [R] int64, V for off), then the smallest most-likely set whose
    probability reaches top_p[r] (top_p: [R] float32, > 1 for off). Returns new logits, -inf where removed."""
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)  # [R, V]
    V = logits.shape[1]
    mask = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if top_k is not None:
        mask |= torch.arange(V, device=logits.device).unsqueeze(0) >= top_k.unsqueeze(1)
    if top_p is not None:
        probs = sorted_logits.masked_fill(mask, float("-inf")).softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # probability of the more likely tokens
        mask |= mass_before >= top_p.unsqueeze(1)  # the first token always stays (mass_before = 0 < top_p)
    sorted_logits = sorted_logits.masked_fill(mask, float("-inf"))
    return torch.empty_like(logits).scatter_(1, sorted_idx, sorted_logits)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens less likely than min_p[r] times the row's most likely token (min_p: [R] float32)."""
    probs = logits.softmax(dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    return logits.masked_fill(probs < threshold, float("-inf"))
