"""Gateways that restart without forgetting, end to end: `pdrelay up --gateway 2 --prefill 2` on a tiny model.

Four long prefixes are warmed, two on each prefill; the first gateway is SIGKILLed and restarted by `pdrelay up`;
its KV index is rebuilt from the prefills' snapshots before it turns ready, so the first request per prefix after
the restart lands on the prefill holding it: the prefills' prefix-cache hits for those four requests must be at
least 90% of what the same requests hit before the restart. Both gateways answer any request, identically, and
`pdrelay status` shows each gateway's index exact for every engine instance.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.cluster.localcluster.rundir import RunState, read_state
from shared.cluster.localcluster.servers import free_port
from tests.helpers.tiny_models import make_tiny_model

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

CLUSTER = "restart"


def pdrelay(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunState]:
    tmp = tmp_path_factory.mktemp("gw-restart")
    model = make_tiny_model(tmp, "llama")
    run_dir = tmp / "run"
    up = pdrelay(
        "up",
        "--detach",
        "--quiet",
        "--run-dir",
        str(run_dir),
        "--cluster",
        CLUSTER,
        "--gateway",
        "2",
        "--prefill",
        "2",
        "--decode",
        "1",
        "--kvstore",
        "0",
        "--encoder",
        "0",
        "--model",
        str(model),
        "--num-pages",
        "512",
        "--context-length",
        "4096",
        "--lease-ttl-s",
        "2",
        "--port",
        str(free_port()),
        "--etcd-port",
        str(free_port()),
        "--nats-port",
        str(free_port()),
        timeout=240,
    )
    try:
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        state = read_state(run_dir)
        assert state is not None
        yield state
    finally:
        pdrelay("down", "--run-dir", str(run_dir), timeout=120)


def _prefix(i: int) -> list[dict[str, str]]:
    doc = " ".join(
        f"section {i}-{k}: the paged KV cache of document {i} keeps part {k};" for k in range(17)
    )  # ~640 tokens
    return [{"role": "system", "content": doc}, {"role": "user", "content": "Summarize."}]


def _status(run_dir: str) -> dict[str, Any]:
    st = pdrelay("status", "--run-dir", run_dir, "--json", timeout=30)
    assert st.returncode == 0, st.stderr
    return json.loads(st.stdout)


def _prefill_hits(status: dict[str, Any]) -> dict[str, float]:
    """pdrelay:prefix_cache_hits (prompt tokens) of each prefill, from its /metrics."""
    out = {}
    for row in status["rows"]:
        if row["role"] != "prefill":
            continue
        text = httpx.get(f"http://{row['metrics']}/metrics", timeout=5).text
        line = next(ln for ln in text.splitlines() if ln.startswith("pdrelay:prefix_cache_hits_total"))
        out[row["instance_id"]] = float(line.split()[-1])
    return out


def _ask(http: str, i: int) -> str:
    body = {"messages": _prefix(i), "max_tokens": 4, "temperature": 0}
    r = httpx.post(f"http://{http}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def _round(state: RunState, http: str) -> tuple[int, list[str]]:
    """The four prefixes once each; the prefills' prefix-cache hits it caused."""
    before = _prefill_hits(_status(state.run_dir))
    answers = [_ask(http, i) for i in range(4)]
    time.sleep(0.5)  # metrics are read at scrape time; KV events reach the gateways
    after = _prefill_hits(_status(state.run_dir))
    return int(sum(after.values()) - sum(before.values())), answers


def _gateways(state: RunState) -> list[tuple[str, int, str]]:
    return sorted((c.instance_id, c.pid, c.http) for c in state.children if c.role == "gateway")


def test_a_restarted_gateway_routes_to_the_caches_it_knew(cluster: RunState) -> None:
    (gw1, pid1, http1), (_, _, http2) = _gateways(cluster)
    _, answers = _round(cluster, http1)  # each prefix computed once, alternating over the two prefills
    st = _status(cluster.run_dir)
    pages = {e[0]: e[5] for e in st["kv_index"][gw1]["entries"] if e[0].startswith("prefill")}
    assert len(pages) == 2 and all(pages.values()), f"every prefill holds prefixes: {pages}"
    hits_before, again = _round(cluster, http1)
    assert again == answers
    assert hits_before >= 4 * 256, f"repeats hit the prefills' caches: {hits_before} tokens"
    # the second gateway serves the same requests, with the same index (both follow the same events)
    hits_other, other = _round(cluster, http2)
    assert other == answers and hits_other >= 0.9 * hits_before, (hits_other, hits_before)

    os.kill(pid1, signal.SIGKILL)
    deadline = time.monotonic() + 90
    while True:
        state = read_state(Path(cluster.run_dir))
        assert state is not None
        gw = next(c for c in state.children if c.instance_id == gw1)
        if gw.pid != pid1 and gw.state == "ready":
            break
        assert time.monotonic() < deadline, "the gateway was not restarted"
        time.sleep(0.2)
    entries = _status(cluster.run_dir)["kv_index"][gw1]["entries"]
    assert {e[0]: e[1] for e in entries if not e[0].startswith("gateway")} == dict.fromkeys(
        [e[0] for e in entries], "exact"
    ), entries
    hits_after, after = _round(state, gw.http)
    assert after == answers
    print(f"prefix-cache hit tokens: {hits_before} before the restart, {hits_after} after")
    assert hits_after >= 0.9 * hits_before, f"{hits_after} of {hits_before} hit tokens after the restart"
