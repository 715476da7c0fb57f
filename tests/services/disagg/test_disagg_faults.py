"""Hand-off failures with real processes and --fault-injection, per transfer backend.

The processes are conftest.py's (per backend: decode `d` with a 3 s hand-off timeout and 1 retry, a healthy
prefill, one prefill per fault). The client always routes to the faulty prefill; decode must free (quarantine)
the attempt's pages and retry on another ready prefill from etcd. Alternates are tried in instance-id order, so
the healthy one is named `pa-...` and the faulty ones `pz-...`. After each failure: the answer equals HF
generate, and no KV page leaks (load reports: free_pages == total_pages once idle and the quarantine is over).
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from shared.cluster.bus.load import LoadReport
from shared.service.faults import CRASH_EXIT_CODE
from tests.services.disagg.disagg_client import Loads, generate, hf_greedy
from tests.services.disagg.disagg_procs import HANDOFF_TIMEOUT_S as TIMEOUT_S
from tests.services.disagg.disagg_procs import BackendCluster, Servers

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NEW = 8
PROMPTS = {
    name: list(range(start, start + 40))
    for name, start in [  # 40 tokens: 3 pages of 16, distinct per test
        ("crash", 10),
        ("corrupt", 60),
        ("hang", 110),
        ("kill", 160),
        ("after", 210),
    ]
}
Ref = dict[str, list[int]]  # prompt name -> HF greedy tokens


@pytest.fixture(scope="module")
def reference(servers: Servers) -> Ref:
    return dict(zip(PROMPTS, hf_greedy(servers.model_dir, list(PROMPTS.values()), NEW), strict=True))


def quarantined(r: LoadReport) -> bool:
    return r.load.free_pages < r.load.total_pages and r.load.running == 0


async def test_prefill_crash_mid_transfer_is_retried_on_another_prefill(pd: BackendCluster, reference: Ref):
    d, healthy, crash = pd["d"], pd["pa-healthy"], pd["pz-crash"]
    async with Loads(pd.nats_url, [pd.cluster]) as loads:
        res = await generate(d.grpc, "crash-1", PROMPTS["crash"], prefill=crash.target(), max_tokens=NEW)
        # right after the answer, the crashed attempt's pages are still quarantined on decode...
        await loads.wait(d.instance_id, quarantined, 1.5, "quarantined pages")
        assert res.tokens == reference["crash"]
        assert res.prefill_instance_id == healthy.instance_id
        assert crash.proc.wait(10) == CRASH_EXIT_CODE
        assert "hand-off of crash-1@0 failed (attempt 1)" in d.log()
        # ...and freed once the quarantine is over, with no request coming after
        await loads.all_pages_free([d.instance_id, healthy.instance_id], timeout_s=TIMEOUT_S + 5)


async def test_corrupt_checksum_is_refused_and_retried(pd: BackendCluster, reference: Ref):
    d, healthy, corrupt = pd["d"], pd["pa-healthy"], pd["pz-corrupt"]
    async with Loads(pd.nats_url, [pd.cluster]) as loads:
        res = await generate(d.grpc, "corrupt-1", PROMPTS["corrupt"], prefill=corrupt.target(), max_tokens=NEW)
        await loads.wait(d.instance_id, quarantined, 1.5, "quarantined pages")
        assert res.tokens == reference["corrupt"]
        assert res.prefill_instance_id == healthy.instance_id, "decode accepted pages with a wrong checksum"
        assert f"prefill {corrupt.instance_id}: checksum of the 3 pages received" in d.log()
        await loads.all_pages_free([d.instance_id, healthy.instance_id, corrupt.instance_id], timeout_s=TIMEOUT_S + 5)


async def test_hung_prefill_times_out_and_releases_its_held_pages(pd: BackendCluster, reference: Ref):
    d, healthy, hang = pd["d"], pd["pa-healthy"], pd["pz-hang"]
    async with Loads(pd.nats_url, [pd.cluster]) as loads:
        t0 = time.monotonic()
        res = await generate(d.grpc, "hang-1", PROMPTS["hang"], prefill=hang.target(), max_tokens=NEW)
        assert time.monotonic() - t0 >= TIMEOUT_S
        assert res.tokens == reference["hang"]
        assert res.prefill_instance_id == healthy.instance_id
        # decode's deadline cancelled the Prefill RPC: the hung prefill gave its held pages back
        await loads.all_pages_free([hang.instance_id, d.instance_id, healthy.instance_id], timeout_s=TIMEOUT_S + 5)


async def test_killed_decode_makes_the_prefill_release_held_pages(pd: BackendCluster, reference: Ref):
    victim, hang = pd["d-kill"], pd["pz-hang"]
    async with Loads(pd.nats_url, [pd.cluster]) as loads:
        call = asyncio.ensure_future(
            generate(victim.grpc, "kill-1", PROMPTS["kill"], prefill=hang.target(), max_tokens=NEW)
        )
        # prefill computed the prompt and holds its 3 pages (not free, not evictable) while it stalls
        held = await loads.wait(
            hang.instance_id, lambda r: r.load.free_pages <= r.load.total_pages - 3, 20, "3 held pages"
        )
        assert held.load.free_pages == held.load.total_pages - 3
        t_kill = time.monotonic()
        assert victim.kill() == -9
        with pytest.raises(grpc.aio.AioRpcError):
            await call
        # released long before the stall (about 31 s) would have ended
        await loads.all_pages_free([hang.instance_id], timeout_s=5)
        assert time.monotonic() - t_kill < 6
        assert hang.alive()


async def test_services_keep_serving_and_nothing_leaks(pd: BackendCluster, reference: Ref):
    d, healthy = pd["d"], pd["pa-healthy"]
    res = await generate(d.grpc, "after-1", PROMPTS["after"], prefill=healthy.target(), max_tokens=NEW)
    assert res.tokens == reference["after"] and res.prefill_instance_id == healthy.instance_id
    alive = [p.instance_id for p in pd.procs.values() if p.alive()]
    async with Loads(pd.nats_url, [pd.cluster]) as loads:
        await loads.all_pages_free(alive, timeout_s=TIMEOUT_S + 5)
