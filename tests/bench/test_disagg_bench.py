"""`pdrelay bench handoff --quick` on the tiny model with NIXL: it starts its own cluster, measures, prints the
table and writes JSON whose numbers hang together."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.cli import main as pdrelay
from tests.helpers.tiny_models import tiny_llama_dir  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_bench_handoff_quick(tiny_llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "handoff.json"
    assert (
        pdrelay(
            [
                "bench",
                "handoff",
                "--quick",
                "--backends",
                "nixl",
                "--model",
                str(tiny_llama_dir),
                "--json-out",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    summary = json.loads(out.read_text())
    rows = summary["results"]
    assert [(r["prompt_tokens"], r["backend"]) for r in rows] == [(64, "nixl"), (256, "nixl")]
    for r in rows:
        assert r["rounds"] == 2 and r["ttft_colocated_ms"] > 0 and r["ttft_disagg_ms"] > 0
        assert r["transfer_ms"] > 0 and 0 < r["transfer_frac"] < 1
        assert r["overhead_ms"] == pytest.approx(r["overhead_frac"] * r["ttft_colocated_ms"])
        assert r["overhead_ms_min"] <= r["overhead_ms"] <= r["overhead_ms_max"]
        assert r["cpu_colocated_ms"] > 0 and r["cpu_disagg_ms"] > 0
        assert r["kv_bytes"] == -(-r["prompt_tokens"] // 16) * 2 * 2 * 16 * 2 * 16 * 4  # tiny model pages, fp32
        assert f"{r['prompt_tokens']:>6}      nixl  TTFT colocated" in printed
    assert summary["target_overhead_1024_nixl"] is None  # --quick has no 1024-token prompts
    assert len(summary["load_average"]) == 2 and "machine load average" in printed


def test_bench_handoff_rejects_bad_flags(capsys: pytest.CaptureFixture[str]):
    assert pdrelay(["bench", "handoff", "--backends", "rdma"]) == 2
    assert "--backends 'rdma'" in capsys.readouterr().err
    assert pdrelay(["bench", "handoff", "--reps", "0"]) == 2
    assert pdrelay(["bench", "handoff", "--unknown-flag"]) == 2
