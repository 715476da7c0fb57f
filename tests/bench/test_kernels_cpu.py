"""bench.kernels_cpu: every case runs on a model's shapes and prints a rate; bad flags exit 2 with the flag named."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.kernels_cpu import DECODE_CASES, EXTEND_CASES, GEMM_ROWS, main
from shared.kernels.native.build import native_available
from tests.helpers.tiny_models import tiny_llama_dir  # noqa: F401

ok, why = native_available()


def bf16_kernels() -> bool:
    from shared.kernels.native.gemm import bf16_kernels as built

    return built()


@pytest.mark.skipif(not ok, reason=f"native kernels unavailable: {why}")
def test_every_case_prints_a_positive_rate(tiny_llama_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model", str(tiny_llama_dir), "--rounds", "1", "--layers", "1", "--threads", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "1 layers" in out[0] and "1 threads" in out[0]
    rates = [line for line in out[1:] if re.search(r"\d+\.\d+ (GB/s of K/V|GFLOPS)", line)]
    dtypes = 2 if bf16_kernels() else 1  # float32, and bfloat16 where the CPU runs it
    assert len(rates) == (len(DECODE_CASES) + len(EXTEND_CASES) + len(GEMM_ROWS)) * dtypes, out
    assert out[1].startswith("roofline: matmul fp32 ")
    for line in rates:
        ms = float(re.search(r"(\d+\.\d+) ms", line).group(1))  # type: ignore[union-attr]
        assert ms > 0, line


@pytest.mark.parametrize("flag", ["--rounds=0", "--threads=-1", "--layers=-2"])
def test_bad_flags_exit_2_naming_the_flag(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([flag]) == 2
    assert flag.split("=")[0] in capsys.readouterr().err
