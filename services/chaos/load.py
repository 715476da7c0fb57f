"""The chaos load: seeded prompts, greedy completions through the gateway, each answer judged against a baseline.

Every request asks for a fixed number of greedy tokens (temperature 0, ignore_eos), half of them streamed. An answer
is one of:

    correct   HTTP 200 (or a stream ending in [DONE]) with exactly the baseline's text
    clear     a clear refusal or failure: an OpenAI error body (4xx/5xx), an error event in the stream, or the
              connection refused / reset (the client knows the request failed and can retry it)
    hung      no answer within the request timeout
    wrong     any other answer: other text, a stream that ends without an error event or [DONE], a plain-text error
"""

from __future__ import annotations

import asyncio
import enum
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

_WORDS = (
    "river",
    "engine",
    "paper",
    "cloud",
    "seven",
    "garden",
    "signal",
    "quiet",
    "orange",
    "bridge",
    "market",
    "winter",
    "silver",
    "window",
    "planet",
    "letter",
    "forest",
    "number",
    "summer",
    "motion",
)


# A client pauses this long after a clear error before its next request (as one honouring Retry-After would),
# so an outage is measured, not hammered with thousands of instant refusals.
CLEAR_ERROR_PAUSE_S = 0.5


class Verdict(enum.StrEnum):
    CORRECT = "correct"
    CLEAR = "clear"
    HUNG = "hung"
    WRONG = "wrong"


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    started: float  # monotonic
    ended: float
    detail: str = ""  # the error, for the report
    prompt: str = ""
    text: str | None = None  # the answer's text (judged later when there was no baseline yet)


def seeded_prompts(seed: int, count: int, prefix: str = "Request") -> list[str]:
    rng = random.Random(seed)
    return [f"{prefix} {i}: " + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(8, 24))) for i in range(count)]


def _error_detail(status: int, body: bytes) -> tuple[bool, str]:
    """(is it a clear OpenAI-style error, a one-line description)."""
    try:
        err = json.loads(body)["error"]
        return True, f"{status} {err.get('code') or err.get('type')}: {str(err.get('message', ''))[:120]}"
    except (ValueError, KeyError, TypeError):
        return False, f"{status} without an OpenAI error body: {body[:80]!r}"


class LoadClient:
    def __init__(
        self, base_url: str, model: str, *, max_tokens: int, timeout_s: float, api_key: str | None = None
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(max_connections=1024, max_keepalive_connections=64)
        self.http = httpx.AsyncClient(
            base_url=base_url, headers=headers, limits=limits, timeout=httpx.Timeout(timeout_s, connect=5.0)
        )
        self.model = model
        self.max_tokens = max_tokens
        self.timeout_s = timeout_s

    async def close(self) -> None:
        await self.http.aclose()

    def _body(self, prompt: str, stream: bool, max_tokens: int | None) -> dict[str, object]:
        return {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens or self.max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": stream,
        }

    async def text(self, prompt: str, max_tokens: int | None = None) -> str:
        """The answer's text (for the baseline); raises RuntimeError when there is none."""
        r = await self.http.post("/v1/completions", json=self._body(prompt, False, max_tokens))
        if r.status_code != 200:
            raise RuntimeError(f"baseline request failed: {_error_detail(r.status_code, r.content)[1]}")
        return str(r.json()["choices"][0]["text"])

    async def judge(self, prompt: str, want: str | None, *, stream: bool, max_tokens: int | None = None) -> Outcome:
        """One request. `want=None`: an answer is provisionally correct; `rejudge()` compares it later."""
        t0 = time.monotonic()
        text = None
        try:
            text, verdict, detail = await asyncio.wait_for(self._one(prompt, stream, max_tokens), self.timeout_s)
        except (TimeoutError, httpx.TimeoutException):
            verdict, detail = Verdict.HUNG, f"no answer within {self.timeout_s:.0f} s"
        except httpx.TransportError as e:
            verdict, detail = Verdict.CLEAR, f"connection: {type(e).__name__}: {e}"[:160]
        out = Outcome(verdict, t0, time.monotonic(), detail, prompt, text)
        return out if want is None else rejudge(out, want)

    async def _one(self, prompt: str, stream: bool, max_tokens: int | None) -> tuple[str | None, Verdict, str]:
        body = self._body(prompt, stream, max_tokens)
        if not stream:
            r = await self.http.post("/v1/completions", json=body)
            if r.status_code != 200:
                clear, detail = _error_detail(r.status_code, r.content)
                return None, (Verdict.CLEAR if clear else Verdict.WRONG), detail
            return str(r.json()["choices"][0]["text"]), Verdict.CORRECT, ""
        parts: list[str] = []
        async with self.http.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                clear, detail = _error_detail(r.status_code, await r.aread())
                return None, (Verdict.CLEAR if clear else Verdict.WRONG), detail
            async for line in r.aiter_lines():
                if line == "data: [DONE]":
                    return "".join(parts), Verdict.CORRECT, ""
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    return None, Verdict.CLEAR, f"stream error: {str(event['error'].get('message', ''))[:120]}"
                parts.extend(str(c.get("text", "")) for c in event.get("choices", ()))
        return None, Verdict.WRONG, "the stream ended without an error event or [DONE]"


def rejudge(o: Outcome, want: str) -> Outcome:
    """An answer against its baseline text."""
    if o.verdict != Verdict.CORRECT or o.text == want:
        return o
    return Outcome(
        Verdict.WRONG, o.started, o.ended, f"text differs from the baseline: {str(o.text)[:60]!r}", o.prompt, o.text
    )


async def run_load(
    client: LoadClient,
    prompts: Sequence[str],
    baseline: Sequence[str] | None,
    *,
    concurrency: int,
    duration_s: float,
    seed: int,
) -> list[Outcome]:
    """`concurrency` clients, each sending one request after the other until `duration_s` is over (requests in
    flight then are waited for). Prompt order and streaming are drawn from `seed`. Without a baseline, every
    prompt is used once, in order (no prefix cache anywhere holds it yet), and the answers are judged later."""
    end = time.monotonic() + duration_s
    outcomes: list[Outcome] = []
    fresh = iter(range(len(prompts)))

    async def worker(w: int) -> None:
        rng = random.Random(seed * 1000 + w)
        while time.monotonic() < end:
            i = rng.randrange(len(prompts)) if baseline is not None else next(fresh, None)
            if i is None:
                return
            want = baseline[i] if baseline is not None else None
            out = await client.judge(prompts[i], want, stream=rng.random() < 0.5)
            outcomes.append(out)
            if out.verdict == Verdict.CLEAR:
                await asyncio.sleep(CLEAR_ERROR_PAUSE_S)

    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return outcomes


# The poison scenario's requests: standard parameters that take the engine's less travelled paths (token ids are
# small enough for any vocabulary). Each must be answered with a 200.
POISON_BODIES: tuple[dict[str, object], ...] = (
    {"logit_bias": {"5": 8, "6": -100}},
    {"frequency_penalty": 1.2, "presence_penalty": 0.8},
    {"repetition_penalty": 1.6},
    {"min_tokens": 4, "stop_token_ids": [3]},
    {"temperature": 0.9, "top_k": 20, "top_p": 0.8, "min_p": 0.05, "seed": 11, "n": 2},
    {"structured_outputs": {"regex": "[a-z]{1,12}"}},
    {"logprobs": 3, "echo": True, "logit_bias": {"7": 2}, "frequency_penalty": 0.3},
)


async def poison_load(client: LoadClient, prompts: Sequence[str], *, duration_s: float, seed: int) -> list[Outcome]:
    """One client sending the POISON_BODIES in turn for `duration_s`, beside the ordinary load. An answer is
    correct when it is a 200 with one choice per sample; its text is not judged (the parameters change it)."""
    rng = random.Random(seed)
    end = time.monotonic() + duration_s
    outcomes: list[Outcome] = []
    i = 0
    while time.monotonic() < end:
        extra = POISON_BODIES[i % len(POISON_BODIES)]
        i += 1
        body = {**client._body(prompts[rng.randrange(len(prompts))], False, None), "ignore_eos": False, **extra}
        t0 = time.monotonic()
        tag = "poison " + ",".join(sorted(extra))
        try:
            r = await asyncio.wait_for(client.http.post("/v1/completions", json=body), client.timeout_s)
        except (TimeoutError, httpx.TimeoutException):
            outcomes.append(Outcome(Verdict.HUNG, t0, time.monotonic(), f"{tag}: no answer"))
            continue
        except httpx.TransportError as e:
            outcomes.append(Outcome(Verdict.CLEAR, t0, time.monotonic(), f"{tag}: {type(e).__name__}"))
            continue
        if r.status_code != 200:
            clear, detail = _error_detail(r.status_code, r.content)
            verdict = Verdict.CLEAR if clear else Verdict.WRONG
            outcomes.append(Outcome(verdict, t0, time.monotonic(), f"{tag}: {detail}"))
            continue
        n = int(extra.get("n", 1))  # type: ignore[call-overload]  # the bodies above hold ints there
        ok = len(r.json().get("choices", ())) == n
        outcomes.append(
            Outcome(Verdict.CORRECT if ok else Verdict.WRONG, t0, time.monotonic(), "" if ok else f"{tag}: choices")
        )
    return outcomes


async def burst(
    client: LoadClient, prompts: Sequence[str], baseline: Sequence[str], *, count: int, seed: int
) -> list[Outcome]:
    """`count` requests at once (the overload scenario)."""
    rng = random.Random(seed)
    picks = [rng.randrange(len(prompts)) for _ in range(count)]
    return list(await asyncio.gather(*(client.judge(prompts[i], baseline[i], stream=False) for i in picks)))
