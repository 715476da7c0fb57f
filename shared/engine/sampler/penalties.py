"""Repetition (HF/vLLM), frequency and presence (OpenAI) penalties, vectorized over the rows that use them."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from shared.engine.request import Request


def _padded(lists: Sequence[Sequence[int]], pad: int, device: torch.device) -> torch.Tensor:
    """[R, max_len] int64, padded with `pad` (an extra column that is dropped after the scatter)."""
    width = max((len(x) for x in lists), default=0) or 1
    out = torch.full((len(lists), width), pad, dtype=torch.int64)
    for i, x in enumerate(lists):
        if x:
            out[i, : len(x)] = torch.as_tensor(x, dtype=torch.int64)
    return out.to(device)


def apply_penalties(logits: torch.Tensor, reqs: Sequence[Request], rows: Sequence[int]) -> None:
    """Penalize logits[rows] in place ([B, V] float32). Repetition divides positive / multiplies negative
    logits of every token seen in prompt or output; frequency subtracts penalty * count and presence subtracts
    penalty once, over output tokens only."""
    if not rows:
        return
    V = logits.shape[1]
    dev = logits.device
    sub = [reqs[i] for i in rows]
    idx = torch.as_tensor(rows, dtype=torch.int64, device=dev)
    x = logits.index_select(0, idx)  # [R, V]
    out_tok = _padded([r.output_token_ids for r in sub], V, dev)
    counts = torch.zeros(len(sub), V + 1, device=dev).scatter_add_(
        1, out_tok, torch.ones_like(out_tok, dtype=torch.float32)
    )
    counts = counts[:, :V]  # [R, V] occurrences in the output
    rep = [r.params.repetition_penalty for r in sub]
    if any(v != 1.0 for v in rep):
        seen = torch.zeros(len(sub), V + 1, dtype=torch.bool, device=dev)
        seen.scatter_(1, _padded([r.prompt_token_ids for r in sub], V, dev), True)
        seen = seen[:, :V] | (counts > 0)
        rp = torch.tensor(rep, device=dev).unsqueeze(1)
        x = torch.where(seen, torch.where(x > 0, x / rp, x * rp), x)
    freq = torch.tensor([r.params.frequency_penalty for r in sub], device=dev).unsqueeze(1)
    pres = torch.tensor([r.params.presence_penalty for r in sub], device=dev).unsqueeze(1)
    x = x - freq * counts - pres * (counts > 0).float()
    logits.index_copy_(0, idx, x)
