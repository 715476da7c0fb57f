"""bench/control_plane.py runs end to end on tiny sizes (its numbers are only meaningful at full size)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_control_plane_bench_runs_and_reports_ratios() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "bench.control_plane", "--n", "5", "--rounds", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [row["metric"].split()[0] for row in rows] == ["discovery", "bus", "bus", "gRPC", "gRPC"]
    for row in rows:
        assert row["ours"] > 0 and row["raw"] > 0
        assert row["ratio"] == pytest.approx(row["ours"] / row["raw"])
