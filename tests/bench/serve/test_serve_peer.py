"""`pdrelay bench serve --peer-cmd`: a second endpoint started from a shell command, measured next to the mock
gateway in one run (here the peer is another mock gateway, so the test needs nothing outside pdrelay)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.serve.peer import PeerProcess, parse_pid_file
from shared.cluster.localcluster.service_process import service_env

ENV = service_env()


def _bench(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli", "bench", "serve", *args],
        env=ENV,
        text=True,
        capture_output=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_pid_file_lines() -> None:
    assert parse_pid_file("front 12\n\nworker 34\nworker 56\n") == {"front": (12,), "worker": (34, 56)}
    assert parse_pid_file("") == {"front": (), "worker": ()}
    for bad in ("front", "front x", "engine 12", "front 12 13"):
        with pytest.raises(ValueError, match="line 1"):
            parse_pid_file(bad)


def test_peer_command_needs_a_port_placeholder() -> None:
    with pytest.raises(ValueError, match=r"\{port\}"):
        PeerProcess("sleep 1")


def test_peer_that_exits_is_reported_with_its_output() -> None:
    with PeerProcess("echo no model here {port}; exit 3") as peer:
        with pytest.raises(RuntimeError, match=r"exited with code 3(.|\n)*no model here"):
            peer.wait_ready(30.0)


def test_peer_cmd_runs_both_phases_side_by_side(tmp_path: Path, bundled_model_dir: Path) -> None:
    out = tmp_path / "peer.json"
    mock = (
        f"{shlex.quote(sys.executable)} -m services.gateway.mock --host 127.0.0.1 --port {{port}} "
        f"--model {shlex.quote(str(bundled_model_dir))}"
    )
    # The shell writes its own pid and then becomes the server: the pid file names the front process.
    peer_cmd = f'echo "front $$" > {{pid_file}}; exec {mock}'
    proc = _bench(
        "--mock-workers",
        "--tokenizer",
        str(bundled_model_dir),
        "--num-prompts",
        "12",
        "--max-concurrency",
        "1",
        "--throughput-concurrency",
        "4",
        "--random-input-len",
        "16",
        "--random-output-len",
        "4",
        "--num-warmups",
        "1",
        "--tcp-quickack",
        "--peer-cmd",
        peer_cmd,
        "--peer-label",
        "mockpeer",
        "--metric-percentiles",
        "50,99",
        "--output-json",
        str(out),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Concurrency 4" in proc.stdout and "pdrelay-mock vs mockpeer" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["compare"]["label"] == "mockpeer" and doc["compare"]["completed"] == 12
    assert doc["compare"]["total_output_tokens"] == doc["total_output_tokens"] == 48
    assert doc["max_concurrency"] == 1 and doc["compare"]["max_concurrency"] == 1
    assert doc["compare"]["gateway_cpu_us_per_request"] > 0
    assert doc["ratios"]["median_e2el_ms"] == pytest.approx(doc["median_e2el_ms"] / doc["compare"]["median_e2el_ms"])
    tp = doc["throughput_phase"]
    assert tp["max_concurrency"] == 4 and tp["compare"]["max_concurrency"] == 4
    assert tp["completed"] == tp["compare"]["completed"] == 12
    assert tp["ratios"]["request_throughput"] == pytest.approx(
        tp["request_throughput"] / tp["compare"]["request_throughput"]
    )
    # The peer is stopped with the benchmark.
    peer_pid = doc["compare"]["gateway_pid"]
    deadline = time.monotonic() + 30
    while _alive(peer_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(peer_pid)


def test_peer_cmd_and_compare_url_exclude_each_other(bundled_model_dir: Path) -> None:
    proc = _bench(
        "--mock-workers",
        "--tokenizer",
        str(bundled_model_dir),
        "--peer-cmd",
        "x {port}",
        "--compare-url",
        "http://127.0.0.1:1",
        timeout=60,
    )
    assert proc.returncode == 2 and "--peer-cmd" in proc.stderr
