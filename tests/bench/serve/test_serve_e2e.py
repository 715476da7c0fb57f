"""`pdrelay bench serve` end to end: the real gateway over mock workers, started by the benchmark itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.serve.procs import MockGateway, process_cpu
from services.cli import main as cli_main
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


def test_mock_workers_run_writes_vllm_keys_and_sane_values(tmp_path: Path, bundled_model_dir: Path) -> None:
    out = tmp_path / "result.json"
    t0 = time.monotonic()
    proc = _bench(
        "--mock-workers",
        "--tokenizer",
        str(bundled_model_dir),
        "--num-prompts",
        "20",
        "--max-concurrency",
        "4",
        "--random-input-len",
        "32",
        "--random-output-len",
        "8",
        "--num-warmups",
        "1",
        "--slo",
        "ttft_ms=60000,tpot_ms=60000",
        "--output-json",
        str(out),
        timeout=30,
    )
    assert time.monotonic() - t0 < 30
    assert proc.returncode == 0, proc.stderr
    assert "Serving Benchmark Result" in proc.stdout and "Gateway CPU per request (us)" in proc.stdout
    doc = json.loads(out.read_text())
    for key in (
        "completed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
        "request_goodput",
        "gateway_cpu_us_per_request",
        "client_cpu_us_per_request",
    ):
        assert key in doc, key
    for stat in ("mean", "median", "std", "p99"):
        for name in ("ttft", "tpot", "itl", "e2el"):
            assert doc[f"{stat}_{name}_ms"] >= 0, (stat, name)
    assert doc["completed"] == 20 and doc["failed"] == 0 and doc["partial"] is False
    assert doc["total_input_tokens"] == 20 * 32  # text prompts of exactly 32 tokens, counted by the gateway
    assert doc["total_output_tokens"] == 20 * 8  # ignore_eos + max_tokens
    assert doc["request_throughput"] == pytest.approx(20 / doc["duration"])
    assert doc["request_goodput"] == pytest.approx(doc["request_throughput"])  # generous SLOs: every request
    assert 0 < doc["median_ttft_ms"] <= doc["median_e2el_ms"] < 10_000
    assert doc["median_ttft_ms"] <= doc["p99_ttft_ms"]
    assert doc["mean_tpot_ms"] > 0 and doc["mean_itl_ms"] > 0
    assert 0 < doc["gateway_cpu_us_per_request"] < 1e6
    assert 0 < doc["client_cpu_us_per_request"] < 1e6
    assert doc["max_concurrency"] == 4 and doc["request_rate"] == "inf"
    assert doc["model"] == bundled_model_dir.name


def test_cli_errors_name_the_problem(bundled_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["bench", "serve", "--mock-workers", "--base-url", "http://127.0.0.1:1"]) == 2
    assert "drop --base-url" in capsys.readouterr().err
    assert (
        cli_main(
            [
                "bench",
                "serve",
                "--tokenizer",
                str(bundled_model_dir),
                "--base-url",
                "http://127.0.0.1:1",
                "--num-prompts",
                "2",
                "--random-input-len",
                "4",
            ]
        )
        == 2
    )
    assert "cannot reach http://127.0.0.1:1" in capsys.readouterr().err
    assert cli_main(["bench", "serve", "--slo", "ttft=abc"]) == 2
    assert "--slo" in capsys.readouterr().err
    assert cli_main(["bench", "serve", "--bogus"]) == 2
    assert "--bogus" in capsys.readouterr().err


def test_process_cpu_reads_this_process() -> None:
    a = process_cpu(os.getpid())
    sum(i * i for i in range(300_000))  # ~20 ms of CPU
    used = process_cpu(os.getpid()).minus(a)
    assert used.sched_s is not None and used.sched_s > 0.005
    with pytest.raises(ValueError, match="process 999999999"):
        process_cpu(999_999_999)


@pytest.mark.slow
def test_compare_url_prints_ratios(tmp_path: Path, bundled_model_dir: Path) -> None:
    out = tmp_path / "cmp.json"
    with MockGateway(bundled_model_dir) as peer:
        peer.wait_ready()
        proc = _bench(
            "--mock-workers",
            "--tokenizer",
            str(bundled_model_dir),
            "--num-prompts",
            "16",
            "--max-concurrency",
            "4",
            "--random-input-len",
            "16",
            "--random-output-len",
            "4",
            "--num-warmups",
            "1",
            "--compare-url",
            peer.base_url,
            "--compare-pid",
            str(peer.pid),
            "--output-json",
            str(out),
            timeout=60,
        )
    assert proc.returncode == 0, proc.stderr
    assert "ratio" in proc.stdout and "pdrelay-mock" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["completed"] == 16 and doc["compare"]["completed"] == 16
    assert doc["compare"]["total_output_tokens"] == doc["total_output_tokens"] == 64
    assert doc["ratios"]["request_throughput"] == pytest.approx(
        doc["request_throughput"] / doc["compare"]["request_throughput"]
    )
    assert doc["compare"]["gateway_cpu_us_per_request"] > 0


@pytest.mark.slow
def test_ctrl_c_prints_partial_results(tmp_path: Path, bundled_model_dir: Path) -> None:
    out = tmp_path / "partial.json"
    cmd = [
        sys.executable,
        "-m",
        "services.cli",
        "bench",
        "serve",
        "--mock-workers",
        "--tokenizer",
        str(bundled_model_dir),
        "--num-prompts",
        "400",
        "--max-concurrency",
        "4",
        "--random-input-len",
        "16",
        "--random-output-len",
        "8",
        "--mock-token-delay-ms",
        "25",
        "--num-warmups",
        "0",
        "--output-json",
        str(out),
    ]
    proc = subprocess.Popen(
        cmd, env=ENV, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 40
        for line in proc.stderr:  # wait until the measured run has started
            if "400 requests" in line or time.monotonic() > deadline:
                break
        time.sleep(1.5)  # 8 tokens x 25 ms: several requests finish, most of the 400 do not
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr
    assert "(partial)" in stdout
    doc = json.loads(out.read_text())
    assert doc["partial"] is True and doc["stopped"] == "interrupted"
    assert 0 < doc["completed"] < 400 and doc["failed"] == 0
