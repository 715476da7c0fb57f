"""`pdrelay up --dry-run` and `pdrelay config show --plan` on simulated GPUs: every engine gets its own GPU, the
plans fit (or say in one line why not), and nothing starts. Placement rules are unit-tested at the end."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from services.cli import main
from shared.cluster.localcluster.placement import (
    SHARED_ENCODER_BYTES,
    EncoderGpu,
    GpuLayout,
    Request,
    next_free,
    place,
)
from tests.helpers.header_checkpoints import LLAMA_31_8B, write_header_checkpoint

GIB = 1 << 30


@pytest.fixture(scope="module")
def llama8b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_header_checkpoint(tmp_path_factory.mktemp("ckpt") / "Llama-3.1-8B-Instruct", LLAMA_31_8B)


def _up(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys, simulate: str | None) -> tuple[int, str, str]:
    for key in list(os.environ):
        if key.startswith("PDRELAY_"):
            monkeypatch.delenv(key)
    if simulate:
        monkeypatch.setenv("PDRELAY_SIMULATE_DEVICES", simulate)
    monkeypatch.setenv("PDRELAY_RUN_DIR", "/nonexistent/pdrelay-dry-run")  # a dry run writes nothing
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_every_engine_gets_its_own_gpu_and_fits(llama8b: Path, monkeypatch, capsys) -> None:
    argv = ["up", "--dry-run", "--json", "--model", str(llama8b), "--prefill", "2", "--decode", "2"]
    rc, out, err = _up(argv, monkeypatch, capsys, "8x80GiB")
    assert rc == 0, err
    data = json.loads(out)
    assert data["host"].startswith("8 GPU(s) of 80.00 GiB (simulated: PDRELAY_SIMULATE_DEVICES=8x80GiB)")
    procs = {p["instance"]: p for p in data["processes"]}
    engines = [procs[i] for i in ("prefill-1", "prefill-2", "decode-1", "decode-2")]
    devices = [tuple(p["devices"]) for p in engines]
    assert devices == [("cuda:0",), ("cuda:1",), ("cuda:2",), ("cuda:3",)]
    assert [p["env"]["CUDA_VISIBLE_DEVICES"] for p in engines] == ["0", "1", "2", "3"]
    for p in engines:
        plan = p["plan"]
        assert plan["fits"] and plan["device"] == p["devices"][0]
        used = plan["weights_bytes"] + plan["workspace_bytes"] + plan["cuda_graph_bytes"] + plan["kv_bytes"]
        assert used <= plan["budget_bytes"] == int(0.9 * 80 * GIB)
        assert plan["kv_tokens"] >= 131072 and plan["weights_bytes"] == 8_030_261_248 * 2
        assert p["flags"][:2] == ["--base-gpu-id", p["devices"][0][5:]]
    assert procs["encoder-1"]["devices"] == ["cuda:4"]  # its own GPU, after the engines'
    assert procs["gateway-1"]["devices"] == [] and procs["gateway-1"]["env"]["CUDA_VISIBLE_DEVICES"] == ""
    assert not Path("/nonexistent/pdrelay-dry-run").exists()


def test_the_table(llama8b: Path, monkeypatch, capsys) -> None:
    argv = ["up", "--dry-run", "--model", str(llama8b), "--prefill", "2", "--decode", "2", "--encoder", "0"]
    rc, out, _ = _up(argv, monkeypatch, capsys, "8x80GiB")
    assert rc == 0
    lines = out.splitlines()
    assert lines[1].split()[:4] == ["INSTANCE", "ROLE", "DEVICES", "WEIGHTS"]
    decode = next(line for line in lines if line.startswith("decode-2"))
    assert decode.split()[:4] == ["decode-2", "decode", "cuda:3", "14.96"]
    assert "CUDA_VISIBLE_DEVICES=3 --base-gpu-id 3" in decode


def test_too_much_fraction_on_one_16_gib_gpu_says_why(llama8b: Path, monkeypatch, capsys) -> None:
    argv = ["up", "--dry-run", "--model", str(llama8b), "--prefill", "0", "--decode", "0", "--worker", "1"]
    rc, out, err = _up([*argv, "--mem-fraction-static", "0.99"], monkeypatch, capsys, "1x16GiB")
    assert rc == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith(
        "pdrelay up: error: Llama-3.1-8B-Instruct does not fit on cuda:0: --mem-fraction-static 0.99 x 16.00 GiB "
        "free = 15.84 GiB"
    )
    assert "lower --context-length to" in err


def test_more_engines_than_gpus_is_refused_with_the_counts(llama8b: Path, monkeypatch, capsys) -> None:
    argv = ["up", "--dry-run", "--model", str(llama8b), "--prefill", "2", "--decode", "2", "--tp-size", "2"]
    rc, _, err = _up(argv, monkeypatch, capsys, "6x80GiB")
    assert rc == 1
    assert (
        "2 prefill x 2 GPUs + 2 decode x 2 GPUs + 1 encoder process(es) need 9 GPUs from cuda:0, up to cuda:8, "
        "but this host has 6" in err
    )
    assert "--encoder-gpu shared (or cpu)" in err


def test_a_shared_encoder_is_planned_around(llama8b: Path, monkeypatch, capsys) -> None:
    base = ["up", "--dry-run", "--json", "--model", str(llama8b), "--decode", "1", "--prefill", "1"]
    rc, _, err = _up(base, monkeypatch, capsys, "2x80GiB")
    assert rc == 1 and "need 3 GPUs" in err  # two engines and an encoder of its own
    rc, shared, err = _up([*base, "--encoder-gpu", "shared"], monkeypatch, capsys, "2x80GiB")
    assert rc == 0, err
    procs = {p["instance"]: p for p in json.loads(shared)["processes"]}
    assert procs["encoder-1"]["devices"] == procs["prefill-1"]["devices"] == ["cuda:0"]
    assert procs["prefill-1"]["plan"]["free_bytes"] == 80 * GIB - SHARED_ENCODER_BYTES
    assert procs["decode-1"]["plan"]["free_bytes"] == 80 * GIB


def test_cuda_n_is_refused_and_simulation_needs_a_dry_run(monkeypatch, capsys) -> None:
    rc, _, err = _up(["up", "--dry-run", "--device", "cuda:1"], monkeypatch, capsys, None)
    assert rc == 2 and "use --base-gpu-id 1 to start from that one" in err
    rc, _, err = _up(["up", "--prefill", "1"], monkeypatch, capsys, "8x80GiB")
    assert rc == 2 and "PDRELAY_SIMULATE_DEVICES describes GPUs this host may not have" in err


def test_config_show_plan(llama8b: Path, monkeypatch, capsys) -> None:
    argv = ["config", "show", "--role", "decode", "--plan", "--json", "--model", str(llama8b), "--device", "cuda:6"]
    rc, out, err = _up(argv, monkeypatch, capsys, "8x80GiB")
    assert rc == 0, err
    (proc,) = json.loads(out)["processes"]
    assert proc["devices"] == ["cuda:6"] and proc["plan"]["fits"] and proc["plan"]["kv_pages"] > 0


@pytest.mark.slow
def test_cpu_host_places_nothing(monkeypatch, capsys) -> None:
    """The default `pdrelay up` on this CPU box: no GPU, no CUDA environment, the CPU budget as before."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    rc, out, err = _up(["up", "--dry-run", "--json"], monkeypatch, capsys, None)
    assert rc == 0, err
    for p in json.loads(out)["processes"]:
        assert p["env"] == {} and p["devices"] == ["cpu"]


# -- placement rules ------------------------------------------------------------------------------------------------
def test_place_fills_in_order_with_steps_and_ranks() -> None:
    reqs = [Request("prefill-1", "prefill", 2), Request("decode-1", "decode", 1), Request("encoder-1", "encoder")]
    out = place(reqs, GpuLayout(8, base=1, step=2))
    assert [out[r.iid].gpus for r in reqs] == [(1, 3), (5,), (7,)]
    cpu = place(reqs, GpuLayout(8, encoder=EncoderGpu.CPU))
    assert cpu["encoder-1"].cpu and cpu["encoder-1"].devices == ("cpu",)
    assert next_free(GpuLayout(4), {0, 2}, 2) == (1, 3)
    with pytest.raises(ValueError, match=r"no free GPU left"):
        next_free(GpuLayout(4), {0, 1, 2}, 2)
