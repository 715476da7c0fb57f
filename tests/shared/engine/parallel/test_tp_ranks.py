"""The rank processes of a tensor-parallel instance: a rank that dies or hangs fails rank 0's next step loudly
(RankLost naming the rank) instead of blocking it; the batch every rank computes is the one rank 0 built; the
prefill and decode roles run at --tp-size > 1 (a size the model cannot split is refused in one line)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from shared.config import ConfigError, PassContext
from shared.config.resolve import resolve
from shared.engine.engine import Engine, EngineStepError
from shared.engine.errors import RankLost
from shared.engine.parallel.runner import TPOptions, TPRunner, start_tp_runner
from shared.engine.types import ScheduledSeq, SchedulerOutput
from shared.modelspec.sampling import SamplingParams
from tests.helpers.tiny_models import tiny_llama_dir  # noqa: F401


def start(model: Path, timeout_s: float) -> TPRunner:
    return start_tp_runner(
        TPOptions(
            tp_size=2,
            model_dir=str(model),
            dtype="float32",
            device="cpu",
            follower_devices=("cpu",),
            threads=1,
            num_pages=16,
            kv_budget_bytes=None,
            page_size=4,
            attention_backend="torch",
            linear_backend="torch",
            max_batch_tokens=64,
            context_length=None,
            collective_timeout_s=timeout_s,
        )
    )


def step(runner: TPRunner) -> None:
    out = SchedulerOutput((ScheduledSeq("a", (5, 6, 7), 0, (1,), True),))
    runner.forward_batch(runner.prepare(out))


def test_a_dead_rank_fails_the_next_step_by_name(tiny_llama_dir: Path) -> None:
    runner = start(tiny_llama_dir, timeout_s=30)
    try:
        step(runner)
        follower = runner.ranks.procs[0]
        follower.kill()
        follower.wait()
        with pytest.raises(RankLost, match=rf"^tensor-parallel rank 1 of 2 \(pid {follower.pid}\) exited with code -9"):
            step(runner)
    finally:
        runner.close()


def test_a_hung_rank_times_out_the_step(tiny_llama_dir: Path) -> None:
    runner = start(tiny_llama_dir, timeout_s=3)
    follower = runner.ranks.procs[0]
    try:
        step(runner)
        os.kill(follower.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(RankLost, match="a tensor-parallel collective failed"):
            step(runner)
        assert time.monotonic() - t0 < 20
    finally:
        follower.kill()
        runner.close()


def test_engine_step_names_the_lost_rank(tiny_llama_dir: Path) -> None:
    from shared.config.groups import CacheConfig, DeviceConfig, ModelConfig, ParallelConfig, SchedulerConfig

    engine = Engine.from_groups(
        model=ModelConfig(model=str(tiny_llama_dir)),
        cache=CacheConfig(num_pages=32, page_size=4),
        scheduler=SchedulerConfig(max_running_requests=4, chunked_prefill_size=32),
        device=DeviceConfig(device="cpu", threads=2),
        parallel=ParallelConfig(tp_size=2),
    )
    runner = engine.runner
    assert isinstance(runner, TPRunner)
    try:
        runner.ranks.procs[0].kill()
        runner.ranks.procs[0].wait()
        with pytest.raises(EngineStepError) as err:
            engine.generate([[5, 6, 7]], SamplingParams(max_tokens=2, temperature=0.0))
        assert isinstance(err.value.__cause__, RankLost)
    finally:
        runner.close()


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_disaggregated_roles_run_tp_and_refuse_a_bad_size(tiny_llama_dir: Path, role: str) -> None:
    """The roles start at --tp-size 2, their hand-off pool in the layout every TP size shares (all KV heads); a
    --tp-size the model cannot split is one line naming the numbers."""
    argv = ["--model", str(tiny_llama_dir), "--device", "cpu"]
    ctx = PassContext(check_transfer_backends=False)
    with pytest.raises(ConfigError, match=r"^--tp-size 3 does not divide the model's 4 attention heads \(4 % 3 = 1\)"):
        resolve(role, [*argv, "--tp-size", "3"], env={}, ctx=ctx)
    engine = Engine.from_config(resolve(role, [*argv, "--tp-size", "2", "--num-pages", "16"], env={}, ctx=ctx))
    runner = engine.runner
    try:
        assert isinstance(runner, TPRunner) and runner.inner.layout.num_kv_heads == 1
        assert runner.layout.num_kv_heads == runner.kv.layout.num_kv_heads == 2
    finally:
        assert isinstance(runner, TPRunner)
        runner.close()
