"""The gateway's routing cost and KV index memory with 8 to 1024 simulated instances (`python -m bench.routing_scale`).

No processes: the gateway's own Discovery, Router and KVIndex over a static membership, a load table fed synthetic
reports, and synthetic KV events, in simulated time. Per instance count N (half prefill, half decode, 16-token pages):

    fill     every instance's cache is filled to --pages pages (the KV index then holds N x --pages entries, less
             what instances share); memory measured with tracemalloc around the fill, next to the index's estimate
    run      --requests requests at max(--min-rate, N x --rate-per-instance) req/s, interleaved in simulated time with
             KV events: each instance stores and evicts --pages-per-s pages a second in --batches-per-s batches (a
             prefill at ~3k prompt tokens/s), its load report every 200 ms; the prefill and decode a request is
             routed to store its prompt's pages (evicting their oldest) in their next batch, as real ones do
    measure  per request the wall time of pools() + plan() + the attempt's bookkeeping (begin, first token,
             release): p50 / p99; per event batch the time to apply it, and the share of one core the events take
             at their simulated rate; the share of requests whose prompt prefix (a shared document) was held by the
             chosen prefill while one held it

Prompts: a document from a Zipf(1.1) population of max(64, 4 N) documents of 32 pages, then 8 pages of its own.
Rounds: --repeat rounds over the counts, in alternating order (the box is shared: other processes slow some rounds);
each count's row is its round with the lowest p50, and the p50 of every round is listed beside it.
Finally the memory bound: the index at N = max(--counts), filled past a bound of half its demand, must stay within it.
"""

from __future__ import annotations

import argparse
import gc
import heapq
import json
import random
import statistics
import time
import tracemalloc
from collections import OrderedDict
from dataclasses import asdict, dataclass

import msgspec

from services.gateway.routing.discovery import Discovery
from services.gateway.routing.kv_index import IndexState, KVIndex, PromptHashes
from services.gateway.routing.policies import make_policy
from services.gateway.routing.router import Router
from services.gateway.routing.views import RouteRequest
from shared.cluster.bus.kv_events import KVEventBatch, KVOp, KVOpKind
from shared.cluster.bus.load import LoadReport, LoadSnapshot
from shared.cluster.instance import Capacity, InstanceInfo, InstanceState

PAGE = 16
DOC_PAGES = 32
OWN_PAGES = 8
MODEL = "sim"
Timed = tuple[float, int, str]


class StaticMembership:
    def __init__(self, infos: list[InstanceInfo]) -> None:
        self._infos = infos
        self.stale = False

    def ready(self, role: str | None = None) -> list[InstanceInfo]:
        return [i for i in self._infos if role is None or i.role == role]

    def instances(self, role: str | None = None) -> list[InstanceInfo]:
        return self.ready(role)

    def on_event(self, cb: object) -> object:
        return lambda: None


def _infos(n: int) -> list[InstanceInfo]:
    cap = Capacity(max_running_requests=64, num_pages=4096, page_size=PAGE)
    return [
        InstanceInfo(
            cluster="sim",
            role="prefill" if k % 2 == 0 else "decode",
            instance_id=f"{'prefill' if k % 2 == 0 else 'decode'}-{k:04d}",
            grpc_address=f"10.0.{k // 256}.{k % 256}:5000",
            epoch=1,
            state=InstanceState.READY,
            model=MODEL,
            capacity=cap,
        )
        for k in range(n)
    ]


class SimInstance:
    """One instance's cache (LRU of page hashes) and the KV events it has yet to publish."""

    def __init__(self, iid: str, capacity: int) -> None:
        self.iid = iid
        self.capacity = capacity
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.seq = 0
        self.pending: list[int] = []

    def store(self, hashes: list[int]) -> None:
        for h in hashes:
            if h in self.lru:
                self.lru.move_to_end(h)
            else:
                self.lru[h] = None
                self.pending.append(h)

    def event(self) -> KVEventBatch:
        evicted = []
        while len(self.lru) > self.capacity:
            evicted.append(self.lru.popitem(last=False)[0])
        stored = [h for h in self.pending if h in self.lru]
        self.pending = []
        self.seq += 1
        ops = (KVOp(KVOpKind.STORED, tuple(stored)), KVOp(KVOpKind.EVICTED, tuple(evicted)))
        return KVEventBatch(instance_id=self.iid, epoch=1, seq=self.seq, ops=ops, page_size=PAGE)


@dataclass
class Row:
    instances: int
    requests: int
    rate_req_s: float
    route_p50_us: float  # CPU time of the routing thread (the box is shared: wall time waits on other processes)
    route_p99_us: float
    route_mean_us: float
    route_wall_p50_us: float
    event_us: float  # per event batch
    events_per_s: float  # simulated
    event_core_share: float  # of one core, at the simulated rate
    prefix_hit: float  # requests routed to a prefill holding their document, of those where one held it
    entries: int
    index_mib: float  # tracemalloc
    index_bytes_per_instance: int
    bytes_per_entry: float
    estimate_mib: float  # KVIndex.approx_bytes()
    rounds_p50_us: list[float] | None = None


def _docs(n: int, rng: random.Random) -> list[list[int]]:
    return [[rng.randrange(1, 40_000) for _ in range(DOC_PAGES * PAGE)] for _ in range(max(64, 4 * n))]


def _fill(index: KVIndex, sims: list[SimInstance], rng: random.Random) -> None:
    for s in sims:
        s.store([rng.getrandbits(63) for _ in range(s.capacity)])
        index.apply(s.event())


def _report(iid: str, role: str, seq: int, rng: random.Random) -> LoadReport:
    load = LoadSnapshot(
        running=rng.randrange(0, 16),
        queued=rng.randrange(0, 4),
        queued_prefill_tokens=rng.randrange(0, 4096),
        free_pages=rng.randrange(512, 4096),
        total_pages=4096,
    )
    return LoadReport(instance_id=iid, role=role, epoch=1, seq=seq, ts=time.time(), load=load)


def measure_memory(n: int, pages: int, seed: int) -> tuple[int, int, int]:
    """(tracemalloc bytes of the filled index, its entries, its own estimate). The events arrive encoded, as from
    NATS, so the hashes the index keeps are allocated while it is traced; no two instances share a page (the worst
    case: shared prefixes cost one key for all their holders)."""
    rng = random.Random(seed)
    payloads = [
        msgspec.msgpack.encode(
            KVEventBatch(
                instance_id=i.instance_id,
                epoch=1,
                seq=1,
                ops=(KVOp(KVOpKind.STORED, tuple(rng.getrandbits(63) for _ in range(pages))),),
                page_size=PAGE,
            )
        )
        for i in _infos(n)
    ]
    decoder = msgspec.msgpack.Decoder(KVEventBatch)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    index = KVIndex()
    for payload in payloads:
        index.apply(decoder.decode(payload))
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return used, index.holders.refs, index.approx_bytes()


def _timeline(infos: list[InstanceInfo], args: argparse.Namespace, rate: float, rng: random.Random) -> list[Timed]:
    """The simulated timeline, a heap of (t, kind, instance): 0 a request, 1 an instance's KV event batch, 2 its
    load report."""
    sim_s = args.requests / rate
    timeline: list[Timed] = []
    for i in infos:
        phase = rng.random()
        timeline += [
            ((phase + k) / args.batches_per_s, 1, i.instance_id) for k in range(int(sim_s * args.batches_per_s) + 1)
        ]
        timeline += [((phase + k) * 0.2, 2, i.instance_id) for k in range(int(sim_s / 0.2) + 1)]
    t = 0.0
    for _ in range(args.requests):
        t += rng.expovariate(rate)
        timeline.append((t, 0, ""))
    heapq.heapify(timeline)
    return timeline


def run_one(n: int, args: argparse.Namespace, memory: tuple[int, int, int]) -> Row:
    rng = random.Random(args.seed + n)
    infos = _infos(n)
    sims = {i.instance_id: SimInstance(i.instance_id, args.pages) for i in infos}
    sim_now = [0.0]
    index = KVIndex()
    router = Router(make_policy("kv_aware"), kv_index=index, clock=lambda: sim_now[0])
    discovery = Discovery(StaticMembership(infos), router, clock=lambda: sim_now[0])  # type: ignore[arg-type]
    _fill(index, list(sims.values()), rng)
    mem, entries, estimate = memory
    docs = _docs(n, rng)
    doc_hashes = [PromptHashes(d).for_page_size(PAGE) for d in docs]
    weights = [1.0 / (k + 1) ** 1.1 for k in range(len(docs))]
    rate = max(args.min_rate, n * args.rate_per_instance)
    timeline = _timeline(infos, args, rate, rng)
    churn = max(1, args.pages_per_s // args.batches_per_s)
    route_ns: list[int] = []
    wall_ns: list[int] = []
    event_ns = events = held_cases = hits = report_seq = 0
    roles = {i.instance_id: i.role for i in infos}
    while timeline:
        t, kind, who = heapq.heappop(timeline)
        if t > args.requests / rate:
            break
        sim_now[0] = t
        if kind == 1:
            s = sims[who]
            s.store([rng.getrandbits(63) for _ in range(churn)])  # background work: other prompts' pages
            ev = s.event()
            t0 = time.thread_time_ns()
            index.apply(ev)
            event_ns += time.thread_time_ns() - t0
            events += 1
        elif kind == 2:
            report_seq += 1
            discovery.loads.latest[who] = _report(who, roles[who], report_seq, rng)
            discovery.loads.received_at[who] = time.monotonic()
        else:
            d = rng.choices(range(len(docs)), weights)[0]
            own = [rng.randrange(1, 40_000) for _ in range(OWN_PAGES * PAGE)]
            prompt = tuple(docs[d] + own)
            hashes = PromptHashes(prompt)
            hashes.for_page_size(PAGE)  # hashing the prompt costs the same at any N: outside the timing
            req = RouteRequest(f"r{len(route_ns)}", prompt, 16)
            w0, t0 = time.perf_counter_ns(), time.thread_time_ns()
            plan = router.plan(req, discovery.pools(MODEL), hashes=hashes)
            lease = router.begin(plan, len(prompt))
            lease.first_token()
            lease.release()
            route_ns.append(time.thread_time_ns() - t0)
            wall_ns.append(time.perf_counter_ns() - w0)
            holders = index.overlaps(doc_hashes[d]).pages
            if any(iid.startswith("prefill") and p >= DOC_PAGES for iid, p in holders.items()):
                held_cases += 1
                hits += plan.prefill is not None and holders.get(plan.prefill.instance_id, 0) >= DOC_PAGES
            full = hashes.for_page_size(PAGE)
            for inst in (plan.decode, plan.prefill):
                if inst is not None:
                    sims[inst.instance_id].store(full)
    sim_s = args.requests / rate
    q = statistics.quantiles(route_ns, n=100)
    return Row(
        instances=n,
        requests=len(route_ns),
        rate_req_s=rate,
        route_p50_us=round(q[49] / 1e3, 1),
        route_p99_us=round(q[98] / 1e3, 1),
        route_mean_us=round(statistics.fmean(route_ns) / 1e3, 1),
        route_wall_p50_us=round(statistics.median(wall_ns) / 1e3, 1),
        event_us=round(event_ns / max(1, events) / 1e3, 1),
        events_per_s=round(events / sim_s),
        event_core_share=round(event_ns / 1e9 / sim_s, 3),
        prefix_hit=round(hits / held_cases, 3) if held_cases else 0.0,
        entries=entries,
        index_mib=round(mem / 2**20, 1),
        index_bytes_per_instance=mem // n,
        bytes_per_entry=round(mem / max(1, entries), 1),
        estimate_mib=round(estimate / 2**20, 1),
    )


def check_bound(n: int, pages: int) -> dict[str, int]:
    """Fill past a bound of half the demand: the index must stay within it, the overflowing instances degraded."""
    bound = n * pages // 2
    index = KVIndex(max_entries=bound)
    rng = random.Random(1)
    _fill(index, [SimInstance(i.instance_id, pages) for i in _infos(n)], rng)
    full = sum(1 for e in index.entries() if e.state == IndexState.DEGRADED and e.reason == "full")
    assert index.holders.refs <= bound, (index.holders.refs, bound)
    return {"instances": n, "max_entries": bound, "entries": index.holders.refs, "degraded_full": full}


def print_table(rows: list[Row]) -> None:
    head = (
        "| instances | req/s | route p50 (us CPU) | p99 | mean | p50 wall | event batch (us) | batches/s | "
        "core share | prefix hit | entries | index MiB | bytes/instance | bytes/entry | estimate MiB | p50 per round |"
    )
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        print(
            f"| {r.instances} | {r.rate_req_s:g} | {r.route_p50_us} | {r.route_p99_us} | {r.route_mean_us} | "
            f"{r.route_wall_p50_us} | "
            f"{r.event_us} | {r.events_per_s} | {r.event_core_share:.1%} | {r.prefix_hit:.1%} | {r.entries} | "
            f"{r.index_mib} | {r.index_bytes_per_instance} | {r.bytes_per_entry} | {r.estimate_mib} | "
            f"{', '.join(f'{x:g}' for x in r.rounds_p50_us or [])} |"
        )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--counts", type=int, nargs="+", default=[8, 64, 256, 1024])
    p.add_argument("--pages", type=int, default=2048, help="pages each instance's cache holds")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--rate-per-instance", type=float, default=1.0, help="req/s per instance")
    p.add_argument("--min-rate", type=float, default=200.0, help="req/s at least")
    p.add_argument("--pages-per-s", type=int, default=200, help="pages each instance stores (and evicts) a second")
    p.add_argument("--batches-per-s", type=int, default=20, help="KV event batches per instance a second")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=3, help="rounds over the counts, alternating their order")
    p.add_argument("--json", default=None, help="also write the rows here")
    args = p.parse_args(argv)
    best: dict[int, Row] = {}
    p50s: dict[int, list[float]] = {n: [] for n in args.counts}
    mems: dict[int, tuple[int, int, int]] = {}
    for rnd in range(args.repeat):
        for n in args.counts if rnd % 2 == 0 else reversed(args.counts):
            if n not in mems:
                mems[n] = measure_memory(n, args.pages, args.seed)
            prev = best.get(n)
            row = run_one(n, args, mems[n])
            p50s[n].append(row.route_p50_us)
            print(json.dumps(asdict(row)), flush=True)
            if prev is None or row.route_p50_us < prev.route_p50_us:
                best[n] = row
    rows = [best[n] for n in args.counts]
    for row in rows:
        row.rounds_p50_us = p50s[row.instances]
    print_table(rows)
    base = rows[0].route_p50_us
    print(f"p50 at {rows[-1].instances} / p50 at {rows[0].instances}: {rows[-1].route_p50_us / base:.2f}x")
    bound = check_bound(max(args.counts), args.pages)
    print(f"memory bound: {json.dumps(bound)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": [asdict(r) for r in rows], "bound": bound, "args": vars(args)}, f, indent=1)


if __name__ == "__main__":
    main()
