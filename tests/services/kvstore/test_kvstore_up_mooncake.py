"""`pdrelay up` starts one mooncake_master (with its metadata server) beside the kvstore, on 127.0.0.1 and free
ports; `pdrelay status` shows the kvstore's T3 fill; `pdrelay down` stops the master too."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from shared.cluster.bus.load import LoadReport, LoadSnapshot, TierFill
from shared.cluster.localcluster.rundir import pid_alive, read_state
from shared.cluster.status import ClusterStatus, StatusRow, format_table
from tests.shared.cluster.test_localcluster import _ports, _wait_gone, pdrelay


def test_status_shows_the_mooncake_tier() -> None:
    load = LoadSnapshot(
        free_pages=1,
        total_pages=2,
        tiers=(TierFill("dram", 0, 1 << 30, 0), TierFill("mooncake", 64 << 20, 256 << 20, 512)),
    )
    row = StatusRow(
        role="kvstore",
        instance_id="kvstore-1",
        state="ready",
        epoch=1,
        grpc="127.0.0.1:1",
        load=LoadReport(instance_id="kvstore-1", role="kvstore", epoch=1, seq=1, ts=0.0, load=load),
        load_age_s=0.1,
    )
    text = format_table(ClusterStatus(cluster="c", etcd_url="e", nats_url="n", rows=[row]))
    assert "kvstore-1 mooncake: 25.0% of 256.0 MiB (512 pages)" in text


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_up_runs_a_mooncake_master_beside_the_kvstore(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    up = pdrelay(
        "up",
        "--detach",
        "--run-dir",
        run_dir,
        "--cluster",
        "e2e-mc",
        "--gateway",
        "0",
        "--prefill",
        "0",
        "--decode",
        "0",
        "--kvstore",
        "1",
        "--lease-ttl-s",
        "2",
        "--kvstore-dram-bytes",
        "4MiB",
        "--kvstore-mooncake-segment-bytes",
        "16MiB",
        *_ports(),
        timeout=200,
    )
    state = read_state(Path(run_dir))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert state is not None and state.ready and state.mooncake_pid and pid_alive(state.mooncake_pid)
        assert state.mooncake_master.startswith("127.0.0.1:") and "mooncake_master 127.0.0.1:" in up.stdout
        cfg = Path(next(c.config for c in state.children if c.role == "kvstore")).read_text()
        assert state.mooncake_master in cfg  # the kvstore was pointed at it
        deadline, st = time.monotonic() + 60, None
        while time.monotonic() < deadline:
            st = pdrelay("status", "--run-dir", run_dir)
            if "kvstore-1 mooncake:" in st.stdout:
                break
            time.sleep(0.5)
        assert st is not None and "kvstore-1 mooncake: 0.0% of 256.0 MiB" in st.stdout, st.stdout if st else ""
    finally:
        down = pdrelay("down", "--run-dir", run_dir, timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert _wait_gone([state.supervisor_pid, state.mooncake_pid, *(c.pid for c in state.children)]) == []
