"""Picks one token per row of logits: greedy rows in one argmax, random rows with temperature, top-k/top-p/min-p
and the exponential-race trick (argmax(p / q), q ~ Exp(1), is a draw from p) so a whole batch samples at once.

A request with a seed draws its noise from its own torch.Generator, so its tokens do not depend on what else is
in the batch. Logprobs are taken from the raw logits (before penalties, temperature and truncation), as the
OpenAI API reports them.

A request fails alone: when the batch's sampling raises (one request's bias, penalty or grammar mask), each row is
sampled again by itself from the step's logits, and the rows that fail again are reported in
`SamplerOutput.failed` for the engine to abort; the other rows get the same tokens the batch would have given them
(greedy rows exactly; a seeded row draws from its own generator, whose draws come last in a row's sampling).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch

from shared.engine.request import Request, TokenLogprobs
from shared.engine.sampler.filters import apply_min_p, apply_top_k_top_p
from shared.engine.sampler.penalties import apply_penalties

# Fault injection (--fault-injection request_poison): a request with this stop string fails in its logits
# processing, so the isolation of one failing request can be rehearsed with the real code path; with a suffix,
# "pdrelay:poison@N", from its N-th output token on (0 is the first: the prefill role's; 1 fails mid-stream).
POISON_STOP = "pdrelay:poison"


def poison_marks(stop: Sequence[str]) -> tuple[str, ...]:
    """The poison markers among a request's stop strings (the prefill role keeps them, though not the others)."""
    return tuple(s for s in stop if s.startswith(POISON_STOP))


def _poisoned(req: Request) -> bool:
    for mark in poison_marks(req.params.stop):
        at = mark.removeprefix(POISON_STOP).removeprefix("@")
        if req.num_output_tokens >= (int(at) if at.isdigit() else 0):
            return True
    return False


@dataclass(frozen=True)
class SamplerOutput:
    token_ids: list[int]  # one per row (a failed row's entry is a placeholder)
    logprobs: list[TokenLogprobs | None] | None = None  # None when no row asked for logprobs
    failed: dict[int, str] = field(default_factory=dict)  # row -> why its sampling failed: abort its request


class Sampler:
    def __init__(self, *, eos_token_ids: Iterable[int] = (), poison: bool = False) -> None:
        """poison: the request_poison fault is injected (see POISON_STOP)."""
        self.eos_token_ids = tuple(eos_token_ids)
        self.poison = poison

    @torch.inference_mode()  # logits come out of the forward pass as inference tensors, updated in place here
    def sample(
        self,
        logits: torch.Tensor,
        reqs: Sequence[Request],
        constrain: Callable[[torch.Tensor], None] | None = None,
        constrain_row: Callable[[torch.Tensor, int], None] | None = None,
    ) -> SamplerOutput:
        """logits: [B, V], row i belongs to reqs[i]; left unchanged. constrain: masks the logits of
        grammar-constrained rows in place (after logprobs are taken: they stay the model's own); constrain_row(x,
        i): the same for row i alone ([1, V]), when rows are sampled one by one after the batch failed."""
        B = len(reqs)
        assert logits.dim() == 2 and logits.shape[0] == B, f"logits {tuple(logits.shape)} for {B} requests"
        if B == 0:
            return SamplerOutput([])
        logits = logits.float()
        # Bias, penalties and masks write into the logits: keep the step's own for a row-by-row retry. Greedy
        # rows without them (the common decode step) write nothing, and pay no copy.
        edits = constrain is not None or any(r.params.logit_bias or r.params.min_tokens for r in reqs)
        edits = edits or any(r.params.has_penalties for r in reqs)
        try:
            return self._sample(logits.clone() if edits else logits, reqs, constrain)
        except Exception:  # noqa: BLE001 - one request's processing: find it, the others keep their tokens
            return self._row_by_row(logits, reqs, constrain_row)

    def _row_by_row(
        self, logits: torch.Tensor, reqs: Sequence[Request], constrain_row: Callable[[torch.Tensor, int], None] | None
    ) -> SamplerOutput:
        tokens: list[int] = []
        logprobs: list[TokenLogprobs | None] = []
        failed: dict[int, str] = {}
        for i, r in enumerate(reqs):
            x = logits[i : i + 1].clone()  # [1, V]
            mask = None
            if constrain_row is not None and r.grammar is not None:
                mask = functools.partial(_constrain_row, constrain_row, i)
            try:
                out = self._sample(x, [r], mask)
            except Exception as e:  # noqa: BLE001 - reported per row; the engine aborts that request
                failed[i] = f"sampling failed: {e!r}"
                tokens.append(0)
                logprobs.append(None)
                continue
            tokens.append(out.token_ids[0])
            logprobs.append(out.logprobs[0] if out.logprobs is not None else None)
        any_lp = any(r.params.logprobs is not None for r in reqs)
        return SamplerOutput(tokens, logprobs if any_lp else None, failed)

    def _sample(
        self, logits: torch.Tensor, reqs: Sequence[Request], constrain: Callable[[torch.Tensor], None] | None
    ) -> SamplerOutput:
        """The batch's sampling; modifies logits ([B, V] float32) in place."""
        B = len(reqs)
        params = [r.params for r in reqs]
        if self.poison and any(_poisoned(r) for r in reqs):
            raise RuntimeError("fault injection request_poison: this request's logits processing fails")

        lp_rows = [i for i, p in enumerate(params) if p.logprobs is not None]
        raw_logprobs = torch.log_softmax(logits[lp_rows], dim=-1) if lp_rows else None  # [L, V]

        if constrain is not None:
            constrain(logits)
        _apply_logit_bias(logits, reqs)
        self._mask_early_stops(logits, reqs)
        apply_penalties(logits, reqs, [i for i, p in enumerate(params) if p.has_penalties])

        greedy = [i for i, p in enumerate(params) if p.greedy]
        if len(greedy) == B:
            tokens = logits.argmax(dim=-1)
        else:
            tokens = torch.empty(B, dtype=torch.int64, device=logits.device)
            if greedy:
                g = torch.as_tensor(greedy, device=logits.device)
                tokens[g] = logits[g].argmax(dim=-1)
            rand = [i for i, p in enumerate(params) if not p.greedy]
            r = torch.as_tensor(rand, device=logits.device)
            tokens[r] = self._sample_random(logits[r], [reqs[i] for i in rand])
        token_list = tokens.tolist()

        if raw_logprobs is None:
            return SamplerOutput(token_list)
        return SamplerOutput(token_list, _logprobs(raw_logprobs, lp_rows, token_list, params, B))

    def _mask_early_stops(self, logits: torch.Tensor, reqs: Sequence[Request]) -> None:
        """Before min_tokens are out, EOS and stop token ids cannot be drawn."""
        for i, r in enumerate(reqs):
            p = r.params
            if p.min_tokens and r.num_output_tokens < p.min_tokens:
                banned = list(p.stop_token_ids) + ([] if p.ignore_eos else list(self.eos_token_ids))
                if banned:
                    logits[i, banned] = float("-inf")

    def _sample_random(self, logits: torch.Tensor, reqs: Sequence[Request]) -> torch.Tensor:
        """logits: [R, V] of the non-greedy rows -> [R] sampled token ids."""
        dev = logits.device
        params = [r.params for r in reqs]
        x = logits / torch.tensor([p.temperature for p in params], device=dev).unsqueeze(1)
        V = x.shape[1]
        use_k = any(p.top_k > 0 for p in params)
        use_p = any(p.top_p < 1.0 for p in params)
        if use_k or use_p:
            k = torch.tensor([p.top_k if p.top_k > 0 else V for p in params], device=dev) if use_k else None
            tp = torch.tensor([p.top_p if p.top_p < 1.0 else 2.0 for p in params], device=dev) if use_p else None
            x = apply_top_k_top_p(x, k, tp)
        if any(p.min_p > 0.0 for p in params):
            x = apply_min_p(x, torch.tensor([p.min_p for p in params], device=dev))
        probs = x.softmax(dim=-1)  # [R, V]
        q = torch.empty_like(probs)
        seeded = [j for j, p in enumerate(params) if p.seed is not None]
        if len(seeded) < len(params):
            q.exponential_()
        for j in seeded:
            r = reqs[j]
            if r.generator is None:
                r.generator = torch.Generator(device=dev)
                r.generator.manual_seed(r.params.seed)  # type: ignore[arg-type]  # seeded: seed is set
                for _ in range(r.generator_skip):
                    torch.empty_like(q[j]).exponential_(generator=r.generator)
            q[j].exponential_(generator=r.generator)
        # q == 0 would turn a removed token (p = 0) into 0/0 = NaN, which argmax prefers
        return (probs / q.clamp_min_(1e-30)).argmax(dim=-1)


def _constrain_row(constrain_row: Callable[[torch.Tensor, int], None], row: int, x: torch.Tensor) -> None:
    constrain_row(x, row)


def _apply_logit_bias(logits: torch.Tensor, reqs: Sequence[Request]) -> None:
    """OpenAI logit_bias: add each request's bias to its listed token ids ([B, V] in place)."""
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    for i, r in enumerate(reqs):
        for t, b in r.params.logit_bias:
            rows.append(i)
            cols.append(t)
            vals.append(b)
    if rows:
        dev = logits.device
        logits.index_put_(
            (torch.tensor(rows, device=dev), torch.tensor(cols, device=dev)),
            torch.tensor(vals, device=dev, dtype=logits.dtype),
            accumulate=True,
        )


def _logprobs(
    raw: torch.Tensor, rows: list[int], tokens: list[int], params: Sequence, B: int
) -> list[TokenLogprobs | None]:
    """raw: [L, V] log_softmax of the rows that asked; returns one entry per batch row (None if not asked)."""
    chosen_ids = torch.tensor([tokens[i] for i in rows], device=raw.device).unsqueeze(1)
    chosen = raw.gather(1, chosen_ids).squeeze(1).tolist()
    n_top = max(params[i].logprobs for i in rows)
    top_v: list[list[float]] = []
    top_i: list[list[int]] = []
    if n_top > 0:
        v, ix = raw.topk(n_top, dim=-1)
        top_v, top_i = v.tolist(), ix.tolist()
    out: list[TokenLogprobs | None] = [None] * B
    for j, i in enumerate(rows):
        n = params[i].logprobs
        top = tuple(zip(top_i[j][:n], top_v[j][:n])) if n else ()
        out[i] = TokenLogprobs(tokens[i], chosen[j], top)
    return out
