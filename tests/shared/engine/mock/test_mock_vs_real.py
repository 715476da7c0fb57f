"""The mock engine against the real one on the bundled model: the same workload, TTFT and TPOT within a tolerance.

The shipped table was measured at one moment of a shared box, whose load changes by multiples from one minute to
the next; so this test fits a small table on the spot with the same procedure (shared/engine/mock/fit.py), runs
the workload on the real engine and on the mock over that table, and compares. That checks the timing model
(interpolation, mixed steps, the real scheduler's own overhead on top) rather than today's load. The tolerance
is stated in TOLERANCE: wide enough for a busy 2-core box, narrow enough to catch a model of the wrong work
(decode time that ignores the batch, prefill that ignores the prompt length).
"""

from __future__ import annotations

import time

import pytest

from shared.config import resolve
from shared.engine.engine import Engine
from shared.engine.mock import build_mock_engine
from shared.engine.mock.fit import measure
from shared.modelspec.sampling import SamplingParams

TOLERANCE = 0.35  # mock / real within [1 - 0.45, 1 + 0.45]
PROMPT_TOKENS, NEW_TOKENS, BATCH = 96, 12, 4


def run_workload(engine: Engine, run: int) -> tuple[float, float]:
    """(mean TTFT, mean TPOT) in seconds of BATCH requests that arrive together; prompts differ per run (a repeat
    would be served from the prefix cache)."""
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    for i in range(BATCH):
        prompt = [1000 + (run * 7919 + i * 131 + j * 17) % 20000 for j in range(PROMPT_TOKENS)]
        engine.add_request(f"w{run}-{i}", prompt, params)
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    count: dict[str, int] = {}
    while engine.has_work():
        for o in engine.step():
            if o.new_token_ids:
                now = time.perf_counter()
                first.setdefault(o.req_id, now)
                last[o.req_id] = now
                count[o.req_id] = count.get(o.req_id, 0) + len(o.new_token_ids)
    assert all(n == NEW_TOKENS for n in count.values()) and len(count) == BATCH
    ttft = sum(first[r] - t0 for r in first) / BATCH
    tpot = sum((last[r] - first[r]) / (NEW_TOKENS - 1) for r in first) / BATCH
    return ttft, tpot


@pytest.mark.slow
def test_mock_ttft_and_tpot_match_the_real_engine(bundled_model_dir, tmp_path) -> None:
    real = Engine.from_config(resolve("worker", ["--threads", "1", "--num-pages", "128"]))
    run_workload(real, 0)  # warm
    table = measure(
        "bundled:smollm2-135m-instruct",
        1,
        2,
        prefill=(16, 128, 384),
        batch=(1, 4),
        context=(64, 256),
        progress=lambda line: None,
    )
    path = tmp_path / "table.json"
    table.dump(path)
    real_ttft, real_tpot = run_workload(real, 1)
    mock = build_mock_engine(
        resolve("worker", ["--engine", "mock", "--num-pages", "128", "--mock-timing-table", str(path)])
    )
    mock_ttft, mock_tpot = run_workload(mock, 2)
    print(
        f"TTFT real {real_ttft * 1e3:.0f} ms mock {mock_ttft * 1e3:.0f} ms; "
        f"TPOT real {real_tpot * 1e3:.1f} ms mock {mock_tpot * 1e3:.1f} ms"
    )
    assert abs(mock_ttft / real_ttft - 1) <= TOLERANCE, (mock_ttft, real_ttft)
    assert abs(mock_tpot / real_tpot - 1) <= TOLERANCE, (mock_tpot, real_tpot)
