"""A cluster of hosts on one machine (`pdrelay up --netns`): every instance in a network namespace of its own, joined
by a bridge in another, addresses from 198.18.0.0/15, etcd and NATS on a control host, the Mooncake master on the
kvstore's host. Nothing is added to the test's own namespace; the namespaces go with `pdrelay down`.

Two runs on a tiny random Llama: KV over NIXL (UCX's tcp transport between hosts), and KV over Mooncake with mutual
TLS on every hop (gRPC, etcd, NATS, the gateway's HTTPS). In each: greedy answers equal the engine run in this
process (the one-host reference); hand-offs crossed hosts (every decode and prefill took part); the kvstore took
pages over the network; embeddings came from the encoder's host; `pdrelay status` reads the cluster from its client
host. Skipped, with the reason, where namespaces cannot be made.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.cluster import netns
from shared.cluster.localcluster.rundir import RunState, read_state
from tests.helpers.tiny_models import make_tiny_model

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(420)]

VARIANTS = {"nixl": (), "mooncake-tls": ("--transfer-backend", "mooncake", "--tls")}
PROMPTS = [" ".join(f"host {k} sends page {i} of prompt {k};" for i in range(12)) for k in range(6)]


def pdrelay(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        env=env,
    )


@dataclass
class MultiHost:
    variant: str
    state: RunState
    model_dir: Path

    @property
    def tls(self) -> bool:
        return bool(self.state.tls_dir)

    def child(self, iid: str) -> Any:
        return next(c for c in self.state.children if c.instance_id == iid)

    def http(self, fn: Callable[[httpx.Client], Any]) -> Any:
        """fn(client) run from the cluster's client host, against the gateway."""
        gw = self.child("gateway-1")
        scheme = "https" if self.tls else "http"
        verify: str | bool = str(Path(self.state.tls_dir) / "ca.pem") if self.tls else True

        def call() -> Any:
            with httpx.Client(base_url=f"{scheme}://{gw.http}", timeout=60, verify=verify) as c:
                return fn(c)

        return netns.in_netns(self.state.netns, call)

    def metrics(self, address: str) -> dict[str, float]:
        def get() -> str:
            return httpx.get(f"http://{address}/metrics", timeout=5).text

        out = {}
        for line in netns.in_netns(self.state.netns, get).splitlines():
            if line and not line.startswith("#") and "{" not in line:
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out


@pytest.fixture(scope="module", params=list(VARIANTS))
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiHost]:
    reason = netns.unavailable()
    if reason is not None:
        pytest.skip(f"network namespaces cannot be made here: {reason}")
    variant = request.param
    tmp = tmp_path_factory.mktemp(f"multihost-{variant}")
    model = make_tiny_model(tmp, "llama")
    run_dir = tmp / "run"
    state: RunState | None = None
    try:
        # fmt: off
        up = pdrelay(
            "up", "--netns", "--detach", "--quiet", "--run-dir", str(run_dir), "--cluster", f"mh-{variant}",
            "--prefill", "2", "--decode", "2", "--model", str(model), "--context-length", "4096",
            "--num-pages", "512", *VARIANTS[variant], timeout=300,
        )
        # fmt: on
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        state = read_state(run_dir)
        assert state is not None and state.netns
        yield MultiHost(variant, state, model)
    finally:
        down = pdrelay("down", "--run-dir", str(run_dir), timeout=120)
        if state is not None:  # every host of the cluster went with it
            left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
            assert f"pdr{state.supervisor_pid}-" not in left, down.stdout + left


@pytest.fixture(scope="module")
def reference(cluster: MultiHost) -> Callable[[str, int], str]:
    """The greedy answer of the engine run in this process on the same model: the one-host reference."""
    from services.gateway.text.detokenizer import IncrementalDetokenizer
    from services.gateway.text.tokenizer import GatewayTokenizer
    from shared.config import resolve
    from shared.engine.engine import Engine
    from shared.modelspec.sampling import SamplingParams

    cfg = resolve(
        "worker",
        ["--model", str(cluster.model_dir), "--num-pages", "512", "--threads", "1", "--dtype", "float32"],
        env={},
    )
    engine = Engine.from_config(cfg)
    tok = GatewayTokenizer.from_dir(cluster.model_dir)

    def run(text: str, max_tokens: int) -> str:
        prompt = tok.encode_chat([{"role": "user", "content": text}])
        sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        ids = list(engine.generate([prompt], sp)[0].token_ids)
        # as a one-host gateway streams them: complete UTF-8 only (a byte-level BPE may stop mid-character)
        detok = IncrementalDetokenizer(tok.fast, prompt_token_ids=prompt)
        return "".join(detok.step([t]).text for t in ids) + detok.finish()

    return run


def _host(address: str) -> str:
    return address.rsplit(":", 1)[0]


def test_every_instance_runs_on_a_host_of_its_own(cluster: MultiHost) -> None:
    s = cluster.state
    hosts = {c.instance_id: _host(c.grpc) for c in s.children}
    assert set(hosts) >= {"gateway-1", "prefill-1", "prefill-2", "decode-1", "decode-2", "kvstore-1", "encoder-1"}
    control = _host(s.etcd_url.split("//")[1])
    assert _host(s.nats_url.split("//")[1]) == control
    assert len(set(hosts.values()) | {control}) == len(hosts) + 1, hosts
    for address in (*hosts.values(), control):
        assert ipaddress.ip_address(address) in ipaddress.ip_network("198.18.0.0/15")
    assert _host(s.mooncake_master) == hosts["kvstore-1"]
    assert s.etcd_url.startswith("https://" if cluster.tls else "http://")


def test_greedy_answers_equal_the_one_host_reference(cluster: MultiHost, reference: Callable[[str, int], str]) -> None:
    decodes = {i: cluster.child(i) for i in ("decode-1", "decode-2")}
    status = pdrelay("status", "--run-dir", cluster.state.run_dir, "--json")
    assert status.returncode == 0, status.stderr  # it entered the client host to read etcd and NATS
    rows = {r["instance_id"]: r for r in json.loads(status.stdout)["rows"]}
    before = {i: cluster.metrics(rows[i]["metrics"]).get("pdrelay:handoffs_total", 0.0) for i in decodes}

    def ask(c: httpx.Client) -> list[str]:
        out = []
        for k, text in enumerate(PROMPTS):
            body = {
                "messages": [{"role": "user", "content": text}],
                "max_tokens": 12,
                "temperature": 0,
                "ignore_eos": True,
            }
            if k % 2:
                with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
                    assert r.status_code == 200
                    chunks = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: {")]
                    out.append("".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks))
            else:
                r = c.post("/v1/chat/completions", json=body)
                assert r.status_code == 200, r.text
                out.append(r.json()["choices"][0]["message"]["content"])
        return out

    t0 = time.monotonic()
    answers = cluster.http(ask)
    print(f"{cluster.variant}: {len(PROMPTS)} requests across hosts in {time.monotonic() - t0:.1f} s")
    assert answers == [reference(p, 12) for p in PROMPTS]
    after = {i: cluster.metrics(rows[i]["metrics"]).get("pdrelay:handoffs_total", 0.0) for i in decodes}
    assert all(after[i] > before[i] for i in decodes), (before, after)  # both decodes took hand-offs
    assert sum(after.values()) - sum(before.values()) == len(PROMPTS)
    for iid in ("prefill-1", "prefill-2"):
        m = cluster.metrics(rows[iid]["metrics"])
        assert m.get("pdrelay:kv_transfer_seconds_count", 0) > 0, f"{iid} wrote no KV to a decode host"


def test_embeddings_come_from_the_encoder_host(cluster: MultiHost) -> None:
    def embed(c: httpx.Client) -> list[float]:
        r = c.post("/v1/embeddings", json={"input": ["pages cross hosts"]})
        assert r.status_code == 200, r.text
        return list(r.json()["data"][0]["embedding"])

    assert len(cluster.http(embed)) == 384


CHAOS = (
    "partition-prefill",
    "partition-decode",
    "partition-kvstore",
    "loss-oneway-prefill",
    "kv-loss",
    "kv-latency",
    "kill-kvstore",
    "stop-kvstore",
    "mooncake-master-down",
    "kill-encoder",
)


def test_chaos_between_hosts(cluster: MultiHost, tmp_path: Path) -> None:
    """`pdrelay chaos` on the hosts: partitions of a prefill, a decode and the kvstore host, one-way loss, loss (and
    latency, where netem exists) on the KV path, the kvstore killed and hung, the Mooncake master down, the encoder
    killed with embeddings in flight: every scenario 0 wrong, 0 hung, 0 leaked pages, recovered."""
    if cluster.variant != "nixl":
        pytest.skip("one run of the network scenarios is enough (the nixl cluster)")
    out = tmp_path / "chaos.json"
    # fmt: off
    r = pdrelay(
        "chaos", "--run-dir", cluster.state.run_dir, "--scenarios", ",".join(CHAOS), "--duration", "7",
        "--fault-after-s", "2", "--hang-s", "4", "--concurrency", "3", "--max-tokens", "8",
        "--recovery-timeout-s", "60", "--leak-timeout-s", "30", "--json", str(out), timeout=400,
    )
    # fmt: on
    print(r.stdout[-2500:])
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    res = json.loads(out.read_text())
    rows = {s["scenario"]: s for s in res["scenarios"]}
    assert list(rows) == list(CHAOS)
    netem = netns.netem_unavailable()
    for name, s in rows.items():
        if name == "kv-latency" and netem is not None:
            assert "netem" in s["skipped"], s
            continue
        assert not s["skipped"], s
        assert s["sent"] > 0 and s["correct"] > 0 and s["wrong"] == s["hung"] == s["leaked_pages"] == 0, s
        assert s["recovery_s"] is not None, s
