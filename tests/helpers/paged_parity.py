"""What the per-family parity tests share: seeded prompts, page ids handed out in a scrambled order, transformers'
logits, and the largest difference seen per model (printed at the end of a module run with -s)."""

from __future__ import annotations

from typing import Any

import torch


def hf_logits(hf: Any, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].float()


def prompt(seed: int, n: int, vocab: int) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


class Pages:
    """Page ids in a scrambled order, so contiguity is never assumed."""

    def __init__(self, n: int) -> None:
        self.free = torch.randperm(n, generator=torch.Generator().manual_seed(5)).tolist()

    def take(self, n: int) -> tuple[int, ...]:
        got, self.free = self.free[:n], self.free[n:]
        assert len(got) == n
        return tuple(got)


class Worst:
    """The largest absolute logit difference per key, each checked against the tolerance as it comes."""

    def __init__(self, tol: float) -> None:
        self.tol = tol
        self.by_key: dict[str, float] = {}

    def check(self, key: str, ours: torch.Tensor, ref: torch.Tensor) -> None:
        assert not ours.isnan().any()
        diff = (ours - ref).abs().max().item()
        self.by_key[key] = max(self.by_key.get(key, 0.0), diff)
        assert diff <= self.tol, f"{key}: max abs diff {diff:.2e} > {self.tol}"

    def print(self) -> None:
        for key, diff in sorted(self.by_key.items()):
            print(f"max abs logit diff {key}: {diff:.2e}")
