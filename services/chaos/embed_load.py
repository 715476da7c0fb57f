"""The encoder's share of the chaos load: embedding requests beside the completions, judged against the vectors the
healthy cluster returned (the encoder-1 scenario kills the instance that computes them)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence

import httpx

from services.chaos.load import CLEAR_ERROR_PAUSE_S, LoadClient, Outcome, Verdict, _error_detail

TOLERANCE = 1e-4  # the same text on the same model: the same vector, up to float noise of batching


async def embed_baseline(client: LoadClient, texts: Sequence[str]) -> list[list[float]] | None:
    """The healthy cluster's vectors, or None when it serves no embeddings (no encoder)."""
    out = []
    for t in texts:
        r = await client.http.post("/v1/embeddings", json={"input": [t]})
        if r.status_code != 200:
            return None
        out.append([float(x) for x in r.json()["data"][0]["embedding"]])
    return out


async def _one(client: LoadClient, text: str, want: list[float]) -> Outcome:
    t0 = time.monotonic()
    try:
        r = await asyncio.wait_for(client.http.post("/v1/embeddings", json={"input": [text]}), client.timeout_s)
    except (TimeoutError, httpx.TimeoutException):
        return Outcome(Verdict.HUNG, t0, time.monotonic(), "embedding: no answer", text)
    except httpx.TransportError as e:
        return Outcome(Verdict.CLEAR, t0, time.monotonic(), f"embedding: {type(e).__name__}", text)
    if r.status_code != 200:
        clear, detail = _error_detail(r.status_code, r.content)
        return Outcome(Verdict.CLEAR if clear else Verdict.WRONG, t0, time.monotonic(), f"embedding: {detail}", text)
    got = r.json()["data"][0]["embedding"]
    ok = len(got) == len(want) and max(abs(float(a) - b) for a, b in zip(got, want, strict=True)) <= TOLERANCE
    detail = "" if ok else "embedding: the vector differs from the baseline"
    return Outcome(Verdict.CORRECT if ok else Verdict.WRONG, t0, time.monotonic(), detail, text)


async def embed_load(
    client: LoadClient, texts: Sequence[str], baseline: Sequence[list[float]], *, duration_s: float, seed: int
) -> list[Outcome]:
    """One client sending embedding requests back to back for `duration_s`."""
    rng = random.Random(seed)
    end = time.monotonic() + duration_s
    outcomes: list[Outcome] = []
    while time.monotonic() < end:
        i = rng.randrange(len(texts))
        out = await _one(client, texts[i], baseline[i])
        outcomes.append(out)
        if out.verdict == Verdict.CLEAR:
            await asyncio.sleep(CLEAR_ERROR_PAUSE_S)
    return outcomes
