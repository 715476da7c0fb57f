"""A local cluster of mock engines (`pdrelay up --engine mock --detach`) for the planner's tests and the scale ramp
benchmark, and a streaming load generator with rate ramps against its gateway (the serving benchmark's client)."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import msgspec

from bench.serve.client import send_request
from bench.serve.http_client import make_http
from bench.serve.metrics import RequestResult
from shared.cluster.localcluster.rundir import RunState, read_state
from shared.cluster.localcluster.servers import free_port

MODEL = "smollm2-135m-instruct"

T = TypeVar("T")


def pdrelay(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args], capture_output=True, text=True, timeout=timeout
    )


class MockCluster:
    def __init__(self, run_dir: Path, *args: str, engine: str = "mock") -> None:
        self.run_dir = run_dir
        self.http_port = free_port()
        up = pdrelay(
            "up",
            "--detach",
            "--quiet",
            "--run-dir",
            str(run_dir),
            "--lease-ttl-s",
            "2",
            "--port",
            str(self.http_port),
            "--etcd-port",
            str(free_port()),
            "--nats-port",
            str(free_port()),
            "--engine",
            engine,
            "--load-report-interval-s",
            "0.1",
            *args,
            timeout=300,
        )
        if up.returncode != 0:
            self.down()
            raise RuntimeError(f"pdrelay up failed ({up.returncode}):\n{up.stdout}\n{up.stderr}")
        self.url = f"http://127.0.0.1:{self.http_port}"

    @property
    def state(self) -> RunState:
        state = read_state(self.run_dir)
        assert state is not None, "the cluster is gone"
        return state

    def children(self, role: str, *, live: bool = True) -> list[str]:
        return [c.instance_id for c in self.state.children if c.role == role and (not live or c.state == "ready")]

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return pdrelay(*args, "--run-dir", str(self.run_dir), timeout=timeout)

    def wait(self, what: str, predicate: Callable[[], T], timeout: float = 60, every: float = 0.5) -> T:
        """The first truthy value of `predicate()`, polled every `every` s; AssertionError (with the logs) after
        `timeout` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = predicate()
            if got:
                return got
            time.sleep(every)
        raise AssertionError(f"not within {timeout:.0f} s: {what}\n{self.logs()}")

    def logs(self, tail: int = 15) -> str:
        out = []
        for p in sorted((self.run_dir / "logs").glob("*.log")):
            lines = p.read_text(errors="replace").splitlines()[-tail:]
            out.append(f"--- {p.name}\n" + "\n".join(lines))
        return "\n".join(out)

    def down(self) -> None:
        pdrelay("down", "--run-dir", str(self.run_dir), timeout=120)


def completion_body(isl: int, osl: int, rng: random.Random) -> bytes:
    # token-id prompts: an exact prompt length, and ids random enough that prefixes do not repeat
    return msgspec.json.encode(
        {
            "model": MODEL,
            "prompt": [rng.randrange(1000, 20000) for _ in range(isl)],
            "max_tokens": osl,
            "stream": True,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        }
    )


class Phase(msgspec.Struct, frozen=True):
    """`seconds` of Poisson arrivals whose rate goes linearly from `rate` to `rate_end` (req/s)."""

    seconds: float
    rate: float
    isl: int  # prompt tokens
    osl: int  # output tokens
    rate_end: float | None = None


def arrival_schedule(
    phases: Sequence[tuple[float, float, int, int] | Phase],
    seed: int = 0,
) -> list[tuple[float, int, int]]:
    """(offset s, prompt tokens, output tokens) of every arrival, fixed by the seed alone: every run of the same
    phases and seed sends the same requests at the same offsets, however busy the machine is."""
    rng = random.Random(seed)
    out: list[tuple[float, int, int]] = []
    begin = 0.0
    for ph in phases:
        p = ph if isinstance(ph, Phase) else Phase(*ph)
        end, t = begin + p.seconds, begin
        while t < end:
            out.append((t, p.isl, p.osl))
            frac = (t - begin) / p.seconds
            rate = p.rate + ((p.rate_end if p.rate_end is not None else p.rate) - p.rate) * frac
            t += rng.expovariate(max(rate, 0.01))
        begin = end
    return out


async def poisson_load(
    url: str, phases: Sequence[tuple[float, float, int, int] | Phase], *, seed: int = 0, prompt_seed: int | None = None
) -> list[tuple[float, RequestResult]]:
    """phases: Phase, or (seconds, requests/s, prompt tokens, output tokens). Returns (scheduled offset, result)
    per request, in arrival order (the schedule: arrival_schedule). prompt_seed: the prompts' token ids (default
    from seed); runs on one cluster that must not hit each other's prefix caches give each its own."""
    http = make_http("httpx", url, max_connections=1024)
    rng = random.Random(seed + 1 if prompt_seed is None else prompt_seed)
    t0 = time.monotonic()
    tasks: list[tuple[float, asyncio.Task[RequestResult]]] = []
    for at, isl, osl in arrival_schedule(phases, seed):
        wait = at - (time.monotonic() - t0)
        if wait > 0:
            await asyncio.sleep(wait)
        body = completion_body(isl, osl, rng)
        tasks.append(
            (at, asyncio.create_task(send_request(http, "/v1/completions", body, prompt_len=isl, count_tokens=len)))
        )
    results = [(at, await t) for at, t in tasks]
    await http.aclose()
    return results
