"""bench/quantize_int4.py: a round-to-nearest AWQ export that the engine loads as AWQ, each weight within half a
quantization step of the original (a step at a group's ends); shapes that are not whole groups, and an output
inside the source tree, are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file

from bench.quantize_int4 import main
from shared.engine.model_runner import ModelRunner
from tests.helpers.tiny_models import make_tiny_model


def test_the_export_loads_as_awq_within_half_a_step_of_each_weight(tmp_path: Path) -> None:
    src = make_tiny_model(tmp_path, "llama", hidden=256, heads=4, kv_heads=2, layers=2)
    out = tmp_path / "awq"
    assert main(["--model", str(src), "--out", str(out), "--group-size", "32"]) == 0
    runner = ModelRunner(out, num_pages=8, page_size=4)
    assert runner.quant is not None and (runner.quant.method, runner.quant.group_size) == ("awq", 32)
    w = load_file(src / "model.safetensors")["model.layers.1.mlp.down_proj.weight"]
    packed = runner.model.layers[1].packed["down"]
    deq = packed.dequantize()
    step = packed.scales.float().repeat_interleave(32, 1)  # [out, in]: each weight's group's scale
    err = (deq - w).abs() / step
    # round to nearest: half a step, except at a group's ends, where the zero point's rounding (and the float16
    # scale's) can push the extreme weight one nibble past 15 or 0 and clamp it: at most one step
    assert err.max() <= 1 + 1e-4 and float((err <= 0.5 + 1e-4).float().mean()) > 0.99
    assert (deq - w).abs().max() > 0  # it did quantize
    assert not (out / "pdrelay-prepared.json").exists()


def test_bad_groups_and_an_output_in_the_tree_are_refused(tmp_path: Path, capsys) -> None:
    src = make_tiny_model(tmp_path, "llama", hidden=256, heads=4, kv_heads=2, layers=2)
    with pytest.raises(SystemExit, match=r"is not whole groups of 96 inputs"):
        main(["--model", str(src), "--out", str(tmp_path / "bad"), "--group-size", "96"])
    assert not (tmp_path / "bad").exists()  # nothing half-written left behind
    assert main(["--model", str(src), "--out", str(Path(__file__).parent / "x")]) == 2
    assert "must be a new directory outside" in capsys.readouterr().err
