"""Scale-down drains (real processes, mock engines): the instances told to go stop taking work, finish their
streams and pending KV hand-offs, then exit; every request in flight completes in full."""

from __future__ import annotations

import asyncio
import re

import pytest

from bench.scale_cluster import MockCluster, poisson_load

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

OUTPUT_TOKENS = 48


def test_scale_down_mid_load_loses_no_request(tmp_path) -> None:
    cluster = MockCluster(tmp_path / "run", "--prefill", "2", "--decode", "2")
    try:
        assert len(cluster.children("prefill")) == 2 and len(cluster.children("decode")) == 2

        async def go():  # type: ignore[no-untyped-def]
            # ~4 s of arrivals, each request decoding for ~3 s: the scale-down lands on streams mid-way and on
            # prompts whose KV hand-off is still in flight
            load = asyncio.create_task(poisson_load(cluster.url, [(4.0, 6.0, 384, OUTPUT_TOKENS)], seed=3))
            await asyncio.sleep(2.0)
            sc = await asyncio.to_thread(cluster.cli, "scale", "prefill=1", "decode=1")
            assert sc.returncode == 0 and "draining" in sc.stdout, sc.stdout + sc.stderr
            return await load

        results = asyncio.run(go())
        failed = [r.error for _, r in results if not r.success]
        assert not failed, f"{len(failed)} of {len(results)} requests failed: {failed[:3]}\n{cluster.logs()}"
        assert len(results) >= 10
        assert all(r.output_tokens == OUTPUT_TOKENS for _, r in results)
        gone = cluster.wait(
            "the drained instances exit",
            lambda: {"prefill-2", "decode-2"}.isdisjoint(c.instance_id for c in cluster.state.children),
            timeout=60,
        )
        assert gone
        for iid in ("prefill-2", "decode-2"):
            log = (cluster.run_dir / "logs" / f"{iid}.log").read_text()
            assert "drain command received" in log and "stopped after draining" in log, log[-2000:]
            assert "still in flight" not in log, log[-2000:]  # drained, not cut off at the timeout
            m = re.search(r"draining \(drain command: scale_down\), (\d+) in flight", log)
            assert m and int(m.group(1)) > 0, f"{iid} had nothing in flight when it drained: the test proves nothing"
    finally:
        cluster.down()
