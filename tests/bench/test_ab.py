"""bench.ab: refuses a tree that is not pdrelay and a round count below one; on the bundled model, runs both sides'
clusters, alternates them, prints each round and the summary, and stops both clusters."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from bench.ab import add_arguments, run

ROOT = Path(__file__).resolve().parents[2]


def _ns(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def test_refuses_a_side_that_is_not_a_pdrelay_tree(tmp_path: Path, capsys) -> None:
    assert run(_ns("--b", str(tmp_path))) == 2
    assert f"--b {tmp_path}: not a pdrelay tree" in capsys.readouterr().err


def test_refuses_rounds_below_one(capsys) -> None:
    assert run(_ns("--a", str(ROOT), "--b", str(ROOT), "--rounds", "0")) == 2
    assert "--rounds must be >= 1 (got 0)" in capsys.readouterr().err


@pytest.mark.slow
def test_two_sides_serve_in_alternating_rounds_and_both_clusters_stop(bundled_model_dir: Path) -> None:
    small = "--encoder 0 --kvstore 0"
    cmd = [
        sys.executable, "-m", "bench.ab", "--a", str(ROOT), "--b", str(ROOT), "--a-flags", small,
        "--b-flags", f"{small} --stream-interval 2", "--rounds", "2", "--range-ratios", "0",
        "--random-input-len", "16", "--random-output-len", "4", "--num-prompts", "4", "--max-concurrency", "2",
        "--model", str(bundled_model_dir),
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, done.stderr[-3000:]
    rounds = [line for line in done.stdout.splitlines() if line.startswith("round ")]
    # round 1 goes A then B, round 2 B then A; every run served its requests
    assert [line.split(":")[0] for line in rounds] == [
        "round 1 range 0 side A",
        "round 1 range 0 side B",
        "round 2 range 0 side B",
        "round 2 range 0 side A",
    ]
    assert all(float(line.split(": ")[1].split()[0]) > 0 for line in rounds)
    assert "B ahead in" in done.stdout and "B / A" in done.stdout
    # both clusters are down: no process still names the A/B run directories
    left = subprocess.run(["pgrep", "-f", "pdrelay-ab-"], capture_output=True, text=True).stdout.split()
    assert not left, left
