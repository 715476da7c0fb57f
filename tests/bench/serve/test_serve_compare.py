"""`pdrelay bench serve --compare-peer vllm`: flag checks, the workload's FLOP count behind the roofline, the
comparison table, and the base URL forms the benchmarks accept."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from bench.serve.compare import comparison_lines, validate, workload_flops
from bench.serve.datasets import BenchRequest
from bench.serve.main import add_arguments
from bench.urls import openai_base_url


def _ns(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def test_compare_peer_flags_are_checked(tmp_path: Path) -> None:
    py = tmp_path / "python"
    py.write_text("")
    spec = validate(
        _ns(
            "--compare-peer",
            "vllm",
            "--peer-python",
            str(py),
            "--pdrelay-setups",
            "colocated,cluster",
            "--compare-range-ratios",
            "0,0.5",
            "--pdrelay-role-flags",
            "worker=--threads 2",
        )
    )
    assert spec.setups == ("colocated", "cluster") and spec.peer_settings == ("default", "all", "all-fp32")
    fp32 = validate(_ns("--compare-peer", "vllm", "--peer-python", str(py), "--pdrelay-setups", "colocated-fp32"))
    assert fp32.setups == ("colocated-fp32",)
    assert spec.range_ratios == (0.0, 0.5) and spec.role_flags == {"worker": ("--threads", "2")}
    bad = [
        (("--peer-python", str(tmp_path / "nope")), "--peer-python"),
        (("--peer-python", str(py), "--base-url", "http://127.0.0.1:1"), "--base-url"),
        (("--peer-python", str(py), "--pdrelay-setups", "colocated,bogus"), "--pdrelay-setups"),
        (("--peer-python", str(py), "--peer-settings", "fast"), "--peer-settings"),
        (("--peer-python", str(py), "--compare-range-ratios", "0,1.5"), "--compare-range-ratios"),
        (("--peer-python", str(py), "--pdrelay-role-flags", "nobody=--x 1"), "--pdrelay-role-flags"),
        (("--peer-python", str(py), "--dataset", "shared-prefix"), "--dataset"),
    ]
    for extra, flag in bad:
        with pytest.raises(ValueError, match=flag):
            validate(_ns("--compare-peer", "vllm", *extra))


def test_compare_peer_needs_the_peer_python(monkeypatch) -> None:
    monkeypatch.delenv("VLLM_PYTHON", raising=False)
    with pytest.raises(ValueError, match="--peer-python"):
        validate(_ns("--compare-peer", "vllm"))


def test_workload_flops_count_the_dense_weights_the_head_and_attention(tmp_path: Path) -> None:
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "vocab_size": 49152,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    one = workload_flops(tmp_path, [BenchRequest(prompt="x", prompt_len=128, output_len=64)])
    body = 2 * 30 * (576 * 576 + 2 * 576 * 192 + 576 * 576 + 3 * 576 * 1536)  # ~212 MFLOP per token
    head = 2 * 576 * 49152
    attn = 4 * 30 * 576 * (192 * 193 / 2)
    assert one == pytest.approx(192 * body + 64 * head + attn)
    # SmolLM2-135M on 128/64: ~270 MFLOP per output-producing token, 64 prompts ~2.9 TFLOP
    assert 2.7e12 < 64 * one < 3.1e12


def test_comparison_lines_give_ratios_and_the_roofline_fraction() -> None:
    s = {
        "output_throughput": 120.0,
        "mean_ttft_ms": 900.0,
        "mean_tpot_ms": 60.0,
        "median_tpot_ms": 58.0,
        "p99_itl_ms": 300.0,
        "duration": 40.0,
    }
    peer = {**s, "output_throughput": 100.0, "duration": 48.0}
    lines = comparison_lines(
        {"pdrelay-colocated": {"w": s}, "vllm-default": {"w": peer}}, ["vllm-default"], {"w": 20.0}, ["w"]
    )
    ours = next(line for line in lines if "pdrelay-colocated" in line)
    theirs = next(line for line in lines if line.strip().startswith("vllm-default"))
    assert "50.0%" in ours and "1.20x" in ours  # 20 s floor / 40 s; 120 / 100 tok/s
    assert "41.7%" in theirs and "1.00x" in theirs


def test_engine_profile_from_counters() -> None:
    from bench.serve.compare import engine_profile

    before = {
        "pdrelay:engine_steps": 10,
        "pdrelay:engine_step_seconds": 1.0,
        "pdrelay:engine_step_seconds{forward}": 0.9,
        "pdrelay:engine_step_tokens": 100,
    }
    after = {
        "pdrelay:engine_steps": 110,
        "pdrelay:engine_step_seconds": 9.0,
        "pdrelay:engine_step_seconds{forward}": 8.1,
        "pdrelay:engine_step_tokens": 1700,
    }
    p = engine_profile(before, after, duration_s=10.0)
    assert p["engine_busy_share"] == pytest.approx(0.8) and p["engine_steps"] == 100
    assert p["engine_step_ms"] == pytest.approx(80.0) and p["engine_tokens_per_step"] == pytest.approx(16.0)
    assert p["engine_forward_share"] == pytest.approx(7.2 / 8.0)


def test_base_urls_with_or_without_v1() -> None:
    for text in (
        "http://127.0.0.1:8100",
        "http://127.0.0.1:8100/",
        "http://127.0.0.1:8100/v1",
        "http://127.0.0.1:8100/v1/",
    ):
        assert openai_base_url("--url", text) == "http://127.0.0.1:8100"
    assert openai_base_url("--url", "https://h/api/v1") == "https://h/api"
    for bad in ("127.0.0.1:8000", "ftp://h", "http://h:notaport", "http://", "http://h/v1?x=1"):
        with pytest.raises(ValueError, match="^--url "):
            openai_base_url("--url", bad)


@pytest.mark.parametrize("cmd", [("engine", "--quick", "--url"), ("serve", "--num-prompts", "2", "--base-url")])
def test_an_unreachable_or_bad_url_is_one_line_naming_the_flag(cmd: tuple[str, ...]) -> None:
    import os
    import subprocess
    import sys

    from shared.cluster.localcluster.servers import free_port
    from shared.cluster.localcluster.service_process import OFFLINE_ENV

    env = {**os.environ, **OFFLINE_ENV}
    for url in (f"http://127.0.0.1:{free_port()}/v1", "localhost:8000"):
        proc = subprocess.run(
            [sys.executable, "-m", "services.cli", "bench", *cmd, url],
            env=env,
            text=True,
            capture_output=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert cmd[-1] in proc.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ("status", "--etcd", "notaurl"),
        ("bench", "control-plane", "--etcd", "nope"),
        ("bench", "control-plane", "--nats", "nats://127.0.0.1:{port}"),
    ],
)
def test_control_plane_commands_fail_in_one_line_on_bad_urls(argv: tuple[str, ...]) -> None:
    import os
    import subprocess
    import sys

    from shared.cluster.localcluster.servers import free_port
    from shared.cluster.localcluster.service_process import OFFLINE_ENV

    argv = tuple(a.replace("{port}", str(free_port())) for a in argv)
    proc = subprocess.run(
        [sys.executable, "-m", "services.cli", *argv],
        text=True,
        capture_output=True,
        timeout=120,
        env={**os.environ, **OFFLINE_ENV},
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert proc.returncode in (1, 2), proc.stderr
    # (the bus client may log its reconnect attempt first)
    assert "Traceback" not in proc.stderr and proc.stderr.strip().splitlines()[-1].startswith("pdrelay "), proc.stderr


def test_every_peer_start_script_exists_and_is_executable() -> None:
    import os

    from bench.serve.compare import BENCH_DIR, PEERS

    for peer, script in PEERS.items():
        path = BENCH_DIR / script
        assert path.is_file() and os.access(path, os.X_OK), f"{peer}: {path}"


def test_rounds_give_medians_and_per_round_ratios() -> None:
    """Three rounds: the row shows the median throughput, and the ratio is the median of the per-round ratios (the
    box drifting between rounds moves both servers of a round together)."""
    from bench.serve.compare_report import combine_rounds, ratio

    def run(tps: float, dur: float) -> dict[str, float]:
        return {"output_throughput": tps, "duration": dur, "mean_ttft_ms": 1000.0 / tps, "mean_tpot_ms": 50.0}

    ours = combine_rounds([run(120, 40), run(90, 50), run(150, 30)], [20.0, 20.0, 21.0])
    peer = combine_rounds([run(100, 48), run(100, 45), run(100, 30)], [20.0, 20.0, 21.0])
    assert ours["output_throughput"] == 120 and ours["round_throughputs"] == [120, 90, 150]
    assert ours["roofline_fraction"] == pytest.approx(0.5)  # median of 0.5, 0.4, 0.7
    assert ratio(ours, peer) == pytest.approx(1.2)  # median of 1.2, 0.9, 1.5
    assert ratio(ours, {"output_throughput": 60.0}) == pytest.approx(2.0)  # no rounds: plain ratio
    lines = comparison_lines({"a": {"w": ours}, "b": {"w": peer}}, ["b"], {"w": 20.0}, ["w"])
    assert any(line.strip() == "a rounds: 120.0 90.0 150.0 tok/s" for line in lines)
    assert "1.20x" in next(line for line in lines if line.strip().startswith("a ") and "%" in line)


def test_rounds_must_be_positive(tmp_path: Path) -> None:
    py = tmp_path / "python"
    py.write_text("")
    with pytest.raises(ValueError, match="--rounds"):
        validate(_ns("--compare-peer", "vllm", "--peer-python", str(py), "--rounds", "0"))
    assert validate(_ns("--compare-peer", "vllm", "--peer-python", str(py), "--rounds", "3")).rounds == 3


def test_the_setups_are_what_pdrelay_up_starts() -> None:
    """The compared clusters carry the services `pdrelay up` starts beside the engines (encoder, kvstore): a bench
    without them would measure a cluster no user runs."""
    from bench.serve.compare_servers import SETUPS
    from services.commands.up import _WITH_ENGINES, DEFAULT_COUNTS

    engines = ("prefill", "decode", "worker")
    assert SETUPS["cluster"] == {r: n for r, n in DEFAULT_COUNTS.items() if n}
    colocated = {r: n for r, n in DEFAULT_COUNTS.items() if n and r not in engines} | {"worker": 1}
    assert SETUPS["colocated"] == colocated
    assert all(SETUPS[s][r] == DEFAULT_COUNTS[r] for s in SETUPS for r in _WITH_ENGINES)


def test_fp32_setups_pin_the_engines_dtype_and_the_peer_settings_name_theirs() -> None:
    from bench.serve.compare_servers import PEER_SETTINGS, SETUP_DTYPE, SETUPS

    assert SETUPS["colocated-fp32"] == SETUPS["colocated"] and SETUP_DTYPE == {
        "colocated-fp32": "float32",
        "cluster-fp32": "float32",
    }
    vllm = PEER_SETTINGS["vllm"]
    assert vllm["default"] == {"VLLM_PEER_CORES": "default", "VLLM_PEER_DTYPE": "auto"}  # vLLM at its defaults
    assert vllm["all-fp32"] == {"VLLM_PEER_CORES": "all", "VLLM_PEER_DTYPE": "float32"}
