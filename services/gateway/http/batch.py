"""Several prompts in one /v1/completions request: one Generation per prompt, run concurrently, seen as one.

Choice indices follow OpenAI / vLLM: prompt p, sample s of n -> index p * n + s. Usage adds up over the prompts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from services.gateway.text.generation import Delta, Generation


class BatchGeneration:
    """The Generation interface over several Generations (next / finished / aclose / token counts)."""

    def __init__(self, gens: Sequence[Generation], n: int) -> None:
        self.gens = list(gens)
        self.n = n
        self._tasks: dict[int, asyncio.Task[Delta]] = {}
        self.first_token_at: float | None = None

    @property
    def finished(self) -> bool:
        return all(g.finished for g in self.gens)

    @property
    def num_prompt_tokens(self) -> int:
        return sum(g.num_prompt_tokens for g in self.gens)

    @property
    def num_cached_tokens(self) -> int:
        return sum(g.num_cached_tokens for g in self.gens)

    @property
    def num_generated(self) -> int:
        return sum(g.num_generated for g in self.gens)

    async def next(self) -> Delta:
        for p, g in enumerate(self.gens):
            if not g.finished and p not in self._tasks:
                self._tasks[p] = asyncio.ensure_future(g.next())
        done, _ = await asyncio.wait(self._tasks.values(), return_when=asyncio.FIRST_COMPLETED)
        p = min(q for q, t in self._tasks.items() if t in done)  # deterministic order among ready ones
        delta = self._tasks.pop(p).result()
        firsts = [g.first_token_at for g in self.gens if g.first_token_at is not None]
        self.first_token_at = min(firsts) if firsts else None
        delta.index = p * self.n + delta.index
        return delta

    async def aclose(self) -> None:
        for t in self._tasks.values():
            t.cancel()
        for t in self._tasks.values():
            with contextlib.suppress(BaseException):  # cancelled or failed: the stream is being closed anyway
                await t
        self._tasks.clear()
        for g in self.gens:
            await g.aclose()
