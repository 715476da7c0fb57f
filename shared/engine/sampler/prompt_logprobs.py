"""Prompt logprobs (echo + logprobs): the log-probability of each prompt token given the tokens before it.

The model runner returns, after the sampling rows, the logits of every row of each chunk whose seq has
prompt_logits (ForwardBatch.logits_indices); row p predicts prompt token p + 1. The first prompt token has no
logprob (nothing precedes it), so a request collects entries for prompt tokens 1 .. n-1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from shared.engine.request import Request, TokenLogprobs
from shared.engine.types import ScheduledSeq


def split_logits(logits: torch.Tensor, seqs: Sequence[ScheduledSeq]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(sampling rows, prompt rows or None) of a step's logits."""
    if not any(s.prompt_logits for s in seqs):
        return logits, None
    n = sum(1 for s in seqs if s.need_logits)
    return logits[:n], logits[n:]


def record(prompt_rows: torch.Tensor, seqs: Sequence[ScheduledSeq], requests: Mapping[str, Request]) -> None:
    """Append to each request's prompt_logprobs the entries its chunk's rows give (those not yet recorded)."""
    raw = torch.log_softmax(prompt_rows.float(), dim=-1)  # [R, V]
    r = 0
    for s in seqs:
        if not s.prompt_logits:
            continue
        rows = len(s.token_ids) - int(s.need_logits)
        req = requests.get(s.req_id)
        if req is not None:
            _append(req, raw[r : r + rows], s.start_pos)
        r += rows


def _append(req: Request, raw: torch.Tensor, start: int) -> None:
    n_prompt, k = req.num_prompt_tokens, req.params.prompt_logprobs or 0
    # row j predicts token start + j + 1; keep the prompt tokens not recorded yet (a recompute repeats rows)
    first = len(req.prompt_logprobs) + 1 - (start + 1)
    last = min(raw.shape[0], n_prompt - 1 - start)
    if first < 0 or first >= last:
        return
    rows = raw[first:last]
    targets = torch.tensor(req.prompt_token_ids[start + 1 + first : start + 1 + last], device=raw.device)
    chosen_col = rows.gather(1, targets.unsqueeze(1))  # [R, 1]
    chosen = chosen_col.squeeze(1).tolist()
    # vLLM's rank: how many tokens are at least as likely as the prompt token (ties count against it)
    ranks = (rows >= chosen_col).sum(dim=1).tolist()
    top_v: list[list[float]] = []
    top_i: list[list[int]] = []
    if k > 0:
        v, ix = rows.topk(k, dim=-1)
        top_v, top_i = v.tolist(), ix.tolist()
    for j, (t, lp, rank) in enumerate(zip(targets.tolist(), chosen, ranks, strict=True)):
        req.prompt_logprobs.append(TokenLogprobs(t, lp, tuple(zip(top_i[j], top_v[j])) if k else (), rank))
