"""The mock engine: timing-table predictions, the runner's contract, and the real engine driving it."""

from __future__ import annotations

import pytest

from shared.config import resolve
from shared.engine.mock import MockRunner, TimingTable, build_mock_engine, next_token
from shared.engine.mock.timing import DecodeTable, PrefillTable
from shared.engine.types import ScheduledSeq, SchedulerOutput
from shared.modelspec.sampling import SamplingParams


def _table() -> TimingTable:
    return TimingTable(
        model="m",
        vocab_size=1000,
        eos_token_ids=(2,),
        context_length=4096,
        num_pages=64,
        threads=1,
        host="test",
        measured_at="2026-12-01",
        prefill=PrefillTable(tokens=(16, 128), ms=(10.0, 80.0)),
        decode=DecodeTable(batch=(1, 16), context=(64, 1024), ms=((20.0, 30.0), (50.0, 110.0))),
    )


def test_predictions_interpolate_and_extend_the_measured_points() -> None:
    t = _table()
    assert t.prefill_s(16) == pytest.approx(0.010)
    assert t.prefill_s(72) == pytest.approx(0.045)  # halfway between 16 and 128 tokens
    assert t.prefill_s(240) == pytest.approx(0.150)  # past the last point: the last segment, extended
    assert t.decode_s(1, 64) == pytest.approx(0.020)
    assert t.decode_s(16, 1024) == pytest.approx(0.110)
    assert t.decode_s(16, 544) == pytest.approx(0.080)  # halfway in context
    # mixed step: the decode rows join the prompt's GEMMs, and their attention over the context is added
    mixed = t.step_s(100, 1, 1024)
    assert mixed == pytest.approx(t.prefill_s(101) + t.decode_s(1, 1024) - t.decode_s(1, 64))
    assert t.step_s(0, 0, 0) == 0.0


def test_table_shipped_with_the_repo_loads_and_grows_with_work() -> None:
    t = TimingTable.load()
    assert t.vocab_size > 0 and t.num_pages > 0
    assert t.step_s(512, 0, 0) > t.step_s(16, 0, 0)
    assert t.step_s(0, 64, 64 * 2048) > t.step_s(0, 1, 64)


def test_bad_table_path_names_the_flag(tmp_path) -> None:
    with pytest.raises(ValueError, match="--mock-timing-table"):
        TimingTable.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text('{"model": 1}')
    with pytest.raises(ValueError, match="not a timing table"):
        TimingTable.load(tmp_path / "bad.json")


def test_runner_sleeps_the_modelled_time_and_writes_real_kv() -> None:
    slept: list[float] = []
    runner = MockRunner(_table(), page_size=16, num_pages=8, sleep=slept.append)
    out = SchedulerOutput(
        (ScheduledSeq("a", tuple(range(20, 40)), 0, (3, 5), True), ScheduledSeq("b", (7,), 63, (0, 1, 2, 4), True))
    )
    logits = runner.forward(out)
    assert logits.shape[0] == 2
    assert logits.argmax(-1).tolist() == [next_token(39, 20), next_token(7, 64)]
    # the modelled step time, less what the step itself already took (writing KV, building logits)
    assert runner.modelled_s == pytest.approx(_table().step_s(20, 1, 64))
    assert len(slept) <= 1 and sum(slept) <= runner.modelled_s
    # position 17 of "a" lives in its second page (5) at offset 1: K holds the token id, V the position
    assert runner.kv.buffer[5, 0, 0, 1, 0].tolist() == [37.0, 17.0]
    assert runner.kv.buffer[4, 0, 1, 15, 0].tolist() == [7.0, 63.0]


def test_real_engine_runs_on_the_mock_to_max_tokens() -> None:
    cfg = resolve("worker", ["--engine", "mock", "--mock-speedup", "100", "--num-pages", "64"])
    engine = build_mock_engine(cfg)
    assert engine.runner.num_pages == 64
    prompts = [[11, 12, 13, 14, 15], [21, 22, 23]]
    done = engine.generate(prompts, SamplingParams(max_tokens=6, temperature=0.0), prefix="m")
    for prompt, c in zip(prompts, done, strict=True):
        assert c.finish_reason == "length" and len(c.token_ids) == 6
        want, last = [], prompt[-1]
        for i in range(6):
            last = next_token(last, len(prompt) + i)
            want.append(last)
        assert list(c.token_ids) == want
    # the radix cache holds the finished prompts: a repeat is served from it
    again = engine.generate([prompts[0] + [99] * 16], SamplingParams(max_tokens=1), prefix="r")
    assert again[0].finish_reason == "length"


def test_engine_flag_is_checked() -> None:
    from shared.config.errors import ConfigError

    with pytest.raises(ConfigError, match="--engine"):
        resolve("decode", ["--engine", "fake"])
    with pytest.raises(ConfigError, match="--mock-speedup"):
        resolve("decode", ["--mock-speedup", "0"])
