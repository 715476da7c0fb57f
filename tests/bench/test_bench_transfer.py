"""The transfer benchmark runs end to end on both backends (tiny sizes) and its numbers hang together."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.transfer import parse_size


def test_parse_size() -> None:
    assert [parse_size(s) for s in ("64K", "16M", "1G", "4096", "2MiB")] == [65536, 16 << 20, 1 << 30, 4096, 2 << 20]
    for bad in ("", "K", "-1M", "1.5M"):
        with pytest.raises(ValueError, match="not a positive size"):
            parse_size(bad)


@pytest.mark.slow
def test_bench_runs_on_both_backends(tmp_path: Path) -> None:
    out = tmp_path / "transfer.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.transfer", "--sizes", "64K,256K", "--iters", "2", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "x memcpy" in proc.stdout
    result = json.loads(out.read_text())
    assert [r["pages"] for r in result["rows"]] == [1, 4]
    assert result["layout"] == "allocator"
    for r in result["rows"]:
        assert 1 <= r["descriptors"] <= r["pages"]
        assert r["memcpy_gbps"] > 0
        for b in ("nixl", "mooncake"):
            # ratios are medians of per-round ratios: close to, not equal to, the ratio of the median speeds
            assert r[f"{b}_gbps"] > 0 and r[f"{b}_ratio"] > 0
            assert 0.1 < r[f"{b}_ratio"] / (r[f"{b}_gbps"] / r["memcpy_gbps"]) < 10


def test_bad_flags_exit_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.transfer", "--backends", "carrier-pigeon"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "choose from ('nixl', 'mooncake')" in proc.stderr
