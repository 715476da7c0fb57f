"""bench/api.py on a tiny random-weight model: the interleaved A/B run pairs steps of both sides, swaps the roles,
counts the mask's own timings, and writes the numbers RESULTS.md quotes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import api
from tests.helpers.tiny_models import tiny_llama_dir  # noqa: F401  (session fixture)


def test_paired_ratios_pair_steps_side_by_side() -> None:
    assert api.paired_ratios([1.0, 2.0, 4.0], [1.5, 2.0]) == [1.5, 1.0]  # the extra step of one side is left out


@pytest.mark.slow
def test_grammar_overhead_run(tiny_llama_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "api.json"
    assert (
        api.main(
            [
                "--model",
                str(tiny_llama_dir),
                "--batch",
                "3",
                "--tokens",
                "6",
                "--rounds",
                "2",
                "--threads",
                "1",
                "--skip-n",
                "--json-out",
                str(out),
            ]
        )
        == 0
    )
    g = json.loads(out.read_text())["grammar"]
    assert g["pairs"] == 2 * 5  # 6 tokens: the first comes from the prefill step, 5 full decode steps per round
    assert len(g["overhead_per_round"]) == 2 and g["overhead_cpu_median"] is not None
    assert g["mask_critical_ms_per_step"] > 0 and g["mask_fill_ms_per_step"] > 0  # the constrained side was masked
