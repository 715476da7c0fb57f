"""`pdrelay chaos`: run scenarios one after the other against a live local cluster and report each.

Per run: a baseline (each seeded prompt answered once by the healthy cluster: the greedy text every later answer
must equal). Per scenario:

    load       --concurrency clients send requests for --duration seconds (seeded prompts, half streamed)
    fault      --fault-after-s into the load (fault-* scenarios: the faulty prefill joins before the load starts)
    heal       stop-* scenarios continue the process after --hang-s; kills are restarted by `pdrelay up`
    recovery   seconds from the fault until every instance that was ready before is ready again (a killed one
               with a new epoch, a stopped one once continued) and a probe request gets the baseline answer
               (--recovery-timeout-s at most)
    leaks      once idle, every engine instance must report all its KV pages free (quarantines included, so this
               waits up to --leak-timeout-s); what is still taken then is leaked
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from services.chaos.cluster import LiveCluster
from services.chaos.embed_load import embed_baseline, embed_load
from services.chaos.load import LoadClient, Outcome, Verdict, burst, poison_load, rejudge, run_load, seeded_prompts
from services.chaos.report import ChaosReport, ScenarioResult, tally
from services.chaos.scenarios import HANG_SCENARIOS, STRICT_SCENARIOS, Injected, NotApplicable, Scenario, inject

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChaosOptions:
    run_dir: Path
    scenarios: tuple[Scenario, ...]
    duration_s: float = 30.0
    fault_after_s: float = 5.0
    hang_s: float = 12.0
    concurrency: int = 4
    max_tokens: int = 16
    prompts: int = 12
    seed: int = 0
    request_timeout_s: float = 60.0
    recovery_timeout_s: float = 180.0
    leak_timeout_s: float = 45.0
    overload_requests: int = 128
    answer_within_s: float = 10.0
    api_key: str | None = None


def _say(text: str) -> None:
    print(text, flush=True)


async def run_chaos(opts: ChaosOptions) -> ChaosReport:
    cluster = LiveCluster(opts.run_dir)
    state = cluster.state()
    client = LoadClient(
        cluster.gateway_url(), "", max_tokens=opts.max_tokens, timeout_s=opts.request_timeout_s, api_key=opts.api_key
    )
    await cluster.connect()
    try:
        models = (await client.http.get("/v1/models")).json()["data"]
        client.model = models[0]["id"]
        prompts = seeded_prompts(opts.seed, opts.prompts)
        baseline, took = [], []
        for p in prompts:
            t0 = time.monotonic()
            baseline.append(await client.text(p))
            took.append(time.monotonic() - t0)
        median_s = round(sorted(took)[len(took) // 2], 2)
        _say(
            f"pdrelay chaos: baseline of {len(prompts)} prompts from the healthy cluster ({client.model}), "
            f"median {median_s:.2f} s per request one at a time"
        )
        embeds = await embed_baseline(client, EMBED_TEXTS) if Scenario.KILL_ENCODER in opts.scenarios else None

        def side_load(sc: Scenario, seed: int) -> asyncio.Future[list[Outcome]] | None:
            """The kill-encoder scenario's embedding requests, beside the completions (when there are embeddings)."""
            if sc != Scenario.KILL_ENCODER or not embeds:
                return None
            return asyncio.ensure_future(embed_load(client, EMBED_TEXTS, embeds, duration_s=opts.duration_s, seed=seed))

        results = []
        for sc in opts.scenarios:
            _say(f"pdrelay chaos: {sc} ...")
            r = await _scenario(sc, opts, cluster, client, prompts, baseline, side_load)
            _say(
                f"pdrelay chaos: {sc}: {r.sent} sent, {r.correct} correct, {r.clear_errors} clear errors, "
                f"{r.hung} hung, {r.wrong} wrong, {r.leaked_pages} pages leaked"
                if not r.skipped
                else f"pdrelay chaos: {sc}: skipped ({r.skipped})"
            )
            results.append(r)
        return ChaosReport(
            cluster=state.cluster,
            seed=opts.seed,
            duration_s=opts.duration_s,
            concurrency=opts.concurrency,
            max_tokens=opts.max_tokens,
            baseline_median_s=median_s,
            scenarios=results,
        )
    finally:
        await client.close()
        await cluster.close()


async def _scenario(
    sc: Scenario,
    opts: ChaosOptions,
    cluster: LiveCluster,
    client: LoadClient,
    prompts: list[str],
    baseline: list[str],
    side_load: SideLoad,
) -> ScenarioResult:
    result = ScenarioResult(
        scenario=str(sc),
        answer_within_s=opts.answer_within_s if sc in HANG_SCENARIOS else None,
        strict=sc in STRICT_SCENARIOS,
    )
    before = await cluster.ready_epochs()
    if before is None:
        result.skipped = "etcd does not answer before the scenario"
        return result
    seed = opts.seed * 100 + list(Scenario).index(sc)
    injected = None
    try:
        if sc.value.startswith("fault-"):
            injected = await inject(sc, cluster)
        # With a faulty prefill in the tier, prompts no cache has seen yet: cache-aware routing would otherwise keep
        # the baseline's prompts on the prefills that cached them, and the faulty one would get no work.
        fresh = seeded_prompts(seed + 1, 4096, prefix="Fresh") if injected is not None else None
        load = asyncio.ensure_future(
            run_load(
                client,
                fresh or prompts,
                None if fresh else baseline,
                concurrency=opts.concurrency,
                duration_s=opts.duration_s,
                seed=seed,
            )
        )
        side = side_load(sc, seed)
        if injected is None:
            await asyncio.sleep(opts.fault_after_s)
        fault_at = time.monotonic()
        extra = []
        if injected is None:
            try:
                injected = await inject(sc, cluster)
            except NotApplicable as e:
                result.skipped = str(e)
                for task in (load, side):
                    if task is not None:
                        task.cancel()
                await asyncio.gather(*(t for t in (load, side) if t is not None), return_exceptions=True)
                return result
        result.target = injected.target
        recovery, healed = _watch_recovery(
            sc, injected, cluster, client, before, (prompts[0], baseline[0]), fault_at, opts
        )
        if sc == Scenario.OVERLOAD:
            extra = await burst(client, prompts, baseline, count=opts.overload_requests, seed=seed)
        if sc == Scenario.POISON:
            extra = await poison_load(client, prompts, duration_s=opts.duration_s - opts.fault_after_s, seed=seed)
        if injected.heal is not None:
            await asyncio.sleep(opts.hang_s)
            await injected.heal()
            healed.set()
        outcomes = await load
        if side is not None:
            extra = [*extra, *await side]
    except NotApplicable as e:
        result.skipped = str(e)
        return result
    finally:
        if injected is not None and injected.cleanup is not None:
            await injected.cleanup()
    if fresh is not None:  # judged against the healthy cluster's answers, now that the faulty prefill is gone
        outcomes = await _judge_later(client, outcomes, opts.concurrency)
    tally(result, [*outcomes, *extra], fault_at)
    result.recovery_s = await recovery
    result.leaked_pages = await _leaked(cluster, opts.leak_timeout_s)
    return result


def _watch_recovery(
    sc: Scenario,
    injected: Injected,
    cluster: LiveCluster,
    client: LoadClient,
    before: dict[str, int],
    probe: tuple[str, str],
    fault_at: float,
    opts: ChaosOptions,
) -> tuple[asyncio.Future[float | None], asyncio.Event]:
    """The recovery measurement, running from the fault on, and the event the caller sets once it healed the fault.

    A killed instance is back only once it registered again (a new epoch). A stopped one is back once it runs again
    (healed) and is ready: with a new epoch if its lease ran out while it hung, with the same one if the hang was
    shorter than the lease (nothing then declared it gone; demanding a new epoch would wait forever). A partition's
    recovery is the cluster routing around it, so it is not gated on the heal.
    """
    renewed = {injected.target} if sc.value.startswith("kill-") else set()
    healed = asyncio.Event()
    if injected.heal is None or not sc.value.startswith("stop-"):
        healed.set()
    prompt, want = probe
    recovery = asyncio.ensure_future(
        _recovered(cluster, client, before, renewed, healed, prompt, want, fault_at, opts.recovery_timeout_s)
    )
    return recovery, healed


EMBED_TEXTS = ("Embed 0: the river crosses the bridge", "Embed 1: a signal in the forest", "Embed 2: paper at market")
SideLoad = Callable[[Scenario, int], "asyncio.Future[list[Outcome]] | None"]


async def _judge_later(client: LoadClient, outcomes: list[Outcome], concurrency: int) -> list[Outcome]:
    answered = sorted({o.prompt for o in outcomes if o.verdict == Verdict.CORRECT})
    sem = asyncio.Semaphore(concurrency)

    async def base(p: str) -> str:
        async with sem:
            return await client.text(p)

    want = dict(zip(answered, await asyncio.gather(*(base(p) for p in answered)), strict=True))
    return [rejudge(o, want[o.prompt]) if o.prompt in want else o for o in outcomes]


async def _recovered(
    cluster: LiveCluster,
    client: LoadClient,
    before: dict[str, int],
    renewed: set[str],
    healed: asyncio.Event,
    prompt: str,
    want: str,
    fault_at: float,
    timeout_s: float,
) -> float | None:
    """Seconds from the fault until it is healed (a stopped process runs again), every instance ready before is ready
    again (those in `renewed` with a new epoch) and a probe gets the baseline answer; None after `timeout_s`."""
    deadline = fault_at + timeout_s
    while time.monotonic() < deadline:
        ready = await cluster.ready_epochs() if healed.is_set() else None
        if ready is not None and set(before) <= set(ready) and all(ready[i] != before[i] for i in renewed):
            probe = await client.judge(prompt, want, stream=False)
            if probe.verdict == Verdict.CORRECT:
                return round(time.monotonic() - fault_at, 1)
        await asyncio.sleep(0.5)
    return None


async def _leaked(cluster: LiveCluster, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    last: dict[str, int] | None = None
    while time.monotonic() < deadline:
        used = cluster.pages_in_use()
        if used is not None:
            last = used
            if not any(used.values()):
                return 0
        await asyncio.sleep(0.5)
    if last is None:
        log.warning("no load reports from every engine instance within %.0f s", timeout_s)
        return 0
    return sum(last.values())
