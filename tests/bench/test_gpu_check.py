"""bench/gpu_check: the script's CPU-safe parts. A smoke run under the interpreter at tiny sizes goes through every
kernel timing, the copy roofline and the eager vs static-buffer decode steps; the shell wrapper parses and refuses
a machine without CUDA with exit code 2. The real numbers need a GPU (bench/gpu_check.sh)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest

from bench import gpu_check

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_smoke_run_on_cpu(tmp_path: Path) -> None:
    """bench/gpu_check.sh --device cpu --quick, as CI runs it: every section of the GPU check at tiny sizes."""
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    script = ROOT / "bench" / "gpu_check.sh"
    r = subprocess.run([bash, str(script), "--device", "cpu", "--quick", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    text = r.stdout
    res = json.loads((tmp_path / "gpu_check.json").read_text())
    names = [r["kernel"] for r in res["kernels"]]
    for want in (
        "decode 32/8x128",
        "decode 9/3x64",
        "extend",
        "rms_norm",
        "fused_add_rms_norm",
        "rotary",
        "silu_and_mul",
        "kv pack",
        "kv unpack",
    ):
        assert any(n.startswith(want) for n in names), f"no {want} row in {names}"
    for r in res["kernels"]:
        assert r["triton_us"] > 0 and r["ref_us"] > 0 and r["bytes"] > 0
        assert math.isclose(r["speedup"], r["ref_us"] / r["triton_us"])
    assert [r["batch"] for r in res["steps"]] == [1, 4]
    for r in res["steps"]:
        assert r["max_abs_logit_diff"] < 1e-4 and r["argmax_agree"] == 1.0
    assert "targets" not in res  # a smoke run claims nothing about targets
    assert "copy bandwidth" in text and "decode steps" in text
    e2e = json.loads((tmp_path / "gpu_e2e.json").read_text())
    assert [r["argmax_agree"] for r in e2e["parity"]] == [True] and e2e["parity"][0]["greedy_equal_tokens"] == 8
    assert e2e["throughput"][0]["engine_tok_s"] > 0 and e2e["throughput"][0]["hf_tok_s"] > 0
    h = e2e["handoff"]
    assert h["checksums_equal"] == h["continuations_equal"] == h["prompts"] == 2
    assert "hand-off between two processes" in text and "gpu tests rc=0, timings rc=0, e2e rc=0" in text


def test_shell_wrapper_parses_and_needs_cuda(tmp_path: Path) -> None:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    script = ROOT / "bench" / "gpu_check.sh"
    assert subprocess.run([bash, "-n", str(script)], capture_output=True).returncode == 0
    import torch

    if torch.cuda.is_available():
        return  # the real run is bench/gpu_check.sh itself
    r = subprocess.run([bash, str(script), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no usable CUDA torch" in r.stdout


def test_cuda_run_without_a_device_says_what_to_do(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert gpu_check.main([]) == 2
    assert "--device cpu --quick" in capsys.readouterr().err
