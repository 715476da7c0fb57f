"""Faults on the vision path of EPD, real processes on a tiny random LLaVA (CLIP + Llama): gateway + prefill + decode,
and an encoder started with `--encoder-fault-injection`.

Checked: an encoder that dies mid-request (encoder_crash) costs the request nothing: prefill encodes the image with
its own tower and the answer is exactly transformers' greedy one; an encoder that hangs (encoder_hang) is given up
within prefill's deadline (a third of what is left of the hand-off) and the request answers as correctly.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from shared.cluster.localcluster.servers import stop_process
from shared.cluster.localcluster.service_process import ServiceProcess, wait_all_ready
from tests.e2e.test_gateway_cluster import _spawn
from tests.e2e.test_vlm_cluster import ask, hf, hf_greedy, model_dir  # noqa: F401 (module fixtures)
from tests.helpers.servers import start_etcd, start_nats
from tests.helpers.tiny_vlm import make_image

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CLUSTER = "vlmfaults"
HANDOFF_S = 9.0  # decode's longest hand-off deadline: prefill gives an encoder a third of what is left of it


@dataclass
class Faulty:
    url: str
    tmp: Path
    common: list[str]

    def encoder(self, name: str, fault: str) -> ServiceProcess:
        p = _spawn(
            name,
            "services.encoder",
            [
                *self.common,
                "--instance-id",
                name,
                "--threads",
                "1",
                "--encoder-model",
                "none",
                "--encoder-fault-injection",
                fault,
            ],
            self.tmp,
        )
        wait_all_ready([p], 120.0)
        time.sleep(0.5)  # the gateway's etcd watch sees it
        return p


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Faulty]:
    tmp = tmp_path_factory.mktemp("vlm-faults")
    etcd, nats = start_etcd(tmp), start_nats(tmp)
    common = [
        "--etcd-endpoints",
        etcd.url,
        "--nats-url",
        nats.url,
        "--cluster",
        CLUSTER,
        "--lease-ttl-s",
        "2",
        "--model",
        str(model_dir),
    ]
    procs: list[ServiceProcess] = []
    try:
        for role in ("prefill", "decode"):
            procs.append(
                _spawn(
                    f"{role}-1",
                    f"services.{role}",
                    [
                        *common,
                        "--instance-id",
                        f"{role}-1",
                        "--threads",
                        "1",
                        "--num-pages",
                        "512",
                        "--transfer-backend",
                        "nixl",
                        "--local-prefill-threshold",
                        "0",
                        "--handoff-timeout-s",
                        str(HANDOFF_S),
                        "--handoff-min-timeout-s",
                        str(HANDOFF_S),
                    ],
                    tmp,
                )
            )
        gateway = _spawn("gateway-1", "services.gateway", [*common, "--instance-id", "gateway-1", "--port", "0"], tmp)
        procs.append(gateway)
        wait_all_ready(procs, 120.0)
        assert gateway.ready is not None
        yield Faulty(f"http://{gateway.ready.http}", tmp, common)
    finally:
        for p in procs:
            stop_process(p.proc)
        etcd.stop()
        nats.stop()


async def _answers_right(cluster: Faulty, hf, seed: int) -> float:  # type: ignore[no-untyped-def]
    png, text = make_image(seed), f"What is in picture {seed}?"
    t0 = time.monotonic()
    r = await ask(cluster.url, [(png, "image/png")], text)
    took = time.monotonic() - t0
    assert r["choices"][0]["message"]["content"] == hf_greedy(hf, [png], text)
    return took


async def test_encoder_crash_mid_request_falls_back(cluster: Faulty, hf) -> None:  # type: ignore[no-untyped-def]
    bad = cluster.encoder("encoder-crash", "encoder_crash")
    try:
        await _answers_right(cluster, hf, 31)  # the only encoder, so the gateway sent the image there
        assert bad.proc.wait(10) == 137, bad.log()[-2000:]  # it died mid-request (as a SIGKILLed process reports)
        await _answers_right(cluster, hf, 32)  # and the cluster goes on without it
    finally:
        stop_process(bad.proc)


async def test_encoder_hang_times_out_and_falls_back(cluster: Faulty, hf) -> None:  # type: ignore[no-untyped-def]
    bad = cluster.encoder("encoder-hang", "encoder_hang")
    try:
        for seed in range(41, 45):  # a crashed encoder's lease may still name it for a moment: until one hangs
            took = await _answers_right(cluster, hf, seed)
            if "stalling" in bad.log():
                break
        else:
            raise AssertionError(f"the hanging encoder got none of the requests:\n{bad.log()[-2000:]}")
        # prefill waited out the encoder's deadline (about a third of the hand-off's), then encoded itself
        assert HANDOFF_S / 3 - 1.5 < took < HANDOFF_S, took
        assert bad.proc.poll() is None  # it is still hung, not dead: the deadline ended the call
    finally:
        stop_process(bad.proc)
