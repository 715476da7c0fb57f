"""Real processes shared by the disaggregation tests of this package (started once, stopped by PID at the end).

Per transfer backend (a package-scoped parameter, so pytest runs every test of one backend, then the other):
    d-<b>           decode, --handoff-timeout-s 3 (the quarantine of a failed attempt), 1 retry
    d-kill-<b>      decode with a 30 s hand-off timeout: SIGKILLed while a prefill works for it
    pa-healthy-<b>  prefill
    pz-crash-<b>    prefill, --fault-injection prefill_crash_mid_transfer
    pz-corrupt-<b>  prefill, --fault-injection prefill_corrupt_checksum
    pz-hang-<b>     prefill, --fault-injection prefill_hang
and one colocated worker `w-colo` for both. Decode retries on other ready prefills in instance-id order, so the
healthy one (`pa-...`) is the first alternate to any faulty one (`pz-...`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.servers import start_etcd, start_nats
from tests.helpers.tiny_models import tiny_llama_dir  # noqa: F401
from tests.services.disagg.disagg_procs import (
    BACKENDS,
    HANDOFF_TIMEOUT_S,
    NUM_PAGES,
    BackendCluster,
    Servers,
    ServiceProc,
    Spec,
    start_services,
    stop_services,
)


@pytest.fixture(scope="package")
def servers(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Iterator[Servers]:
    tmp = tmp_path_factory.mktemp("disagg")
    etcd = start_etcd(tmp)
    try:
        nats = start_nats(tmp)
        try:
            yield Servers(tmp, etcd, nats, tiny_llama_dir)
        finally:
            nats.stop()
    finally:
        etcd.stop()


def _stop_checked(procs: dict[str, ServiceProc]) -> None:
    alive = {iid for iid, p in procs.items() if p.alive()}
    codes = stop_services(procs.values())
    bad = {iid: c for iid, c in codes.items() if iid in alive and c != 0}
    assert not bad, f"services must exit 0 on SIGTERM: {bad}"


@pytest.fixture(scope="package")
def worker(servers: Servers) -> Iterator[ServiceProc]:
    procs = start_services(
        servers.tmp, servers.etcd, servers.nats, servers.model_dir, [Spec("worker", "w-colo", "colo", NUM_PAGES)]
    )
    yield procs["w-colo"]
    _stop_checked(procs)


@pytest.fixture(scope="package", params=BACKENDS)
def pd(request: pytest.FixtureRequest, servers: Servers) -> Iterator[BackendCluster]:
    b = request.param
    cluster = f"pd-{b}"
    common = ("--transfer-backend", b, *NUM_PAGES)
    specs = [
        Spec(
            "decode",
            f"d-{b}",
            cluster,
            # deltas in groups of 3 (the first and last at once): the parity test's HF equality covers the path
            (
                *common,
                "--handoff-timeout-s",
                str(HANDOFF_TIMEOUT_S),
                "--handoff-retries",
                "1",
                "--stream-interval",
                "3",
            ),
        ),
        Spec("decode", f"d-kill-{b}", cluster, (*common, "--handoff-timeout-s", "30")),
        Spec("prefill", f"pa-healthy-{b}", cluster, common),
        Spec("prefill", f"pz-crash-{b}", cluster, (*common, "--fault-injection", "prefill_crash_mid_transfer")),
        Spec("prefill", f"pz-corrupt-{b}", cluster, (*common, "--fault-injection", "prefill_corrupt_checksum")),
        Spec("prefill", f"pz-hang-{b}", cluster, (*common, "--fault-injection", "prefill_hang")),
    ]
    procs = start_services(servers.tmp, servers.etcd, servers.nats, servers.model_dir, specs)
    try:
        yield BackendCluster(b, cluster, procs, servers.nats.url, servers.model_dir)
    finally:
        _stop_checked(procs)
