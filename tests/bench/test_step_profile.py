"""bench.step_profile: the clocks attribute every GEMM's FLOPs to the right component and leave the output alone."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.step_profile import _report, add_arguments, profile_wave, run
from shared.config import PassContext, resolve
from shared.engine.engine import Engine
from shared.modelspec.sampling import SamplingParams
from tests.helpers.tiny_models import tiny_llama_dir  # noqa: F401


def _engine(model_dir: Path) -> Engine:
    cfg = resolve(
        "worker",
        ["--model", str(model_dir), "--threads", "1", "--num-pages", "64", "--dtype", "float32"],
        env={},
        ctx=PassContext(),
    )
    return Engine.from_config(cfg)


def _greedy(engine: Engine, prompt: list[int]) -> list[int]:
    engine.add_request("probe", prompt, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    out: list[int] = []
    while engine.has_work():
        out += [t for o in engine.step() for t in o.new_token_ids]
    return out


def test_decode_flops_match_the_model_and_output_is_unchanged(tiny_llama_dir: Path) -> None:
    engine = _engine(tiny_llama_dir)
    prompt = list(range(5, 29))
    before = _greedy(engine, prompt)
    prof = profile_wave(engine, requests=3, input_len=12, output_len=5)
    assert _greedy(engine, prompt) == before  # the clocked engine computes the same tokens

    a = engine.runner.arch
    q, kv = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
    per_row = 2 * a.num_layers * a.hidden_size * ((q + 2 * kv) + q + 2 * a.intermediate_size)
    decode = prof.steps["decode"]
    assert decode and prof.steps["prefill"]
    rows = sum(s.num_tokens for s, _ in decode)
    clock = prof.clocks["decode"]
    assert clock.flops["qkv, o, gate_up"] == rows * per_row
    assert clock.flops["down"] == rows * 2 * a.num_layers * a.intermediate_size * a.hidden_size
    assert clock.flops["lm_head"] == rows * 2 * a.hidden_size * a.vocab_size
    assert clock.seconds["attention"] > 0 and clock.seconds["elementwise"] > 0
    assert sum(clock.seconds.values()) <= sum(dt for _, dt in decode)
    assert prof.kv_read["decode"] > 0


def test_report_prints_each_component(tiny_llama_dir: Path, capsys) -> None:
    prof = profile_wave(_engine(tiny_llama_dir), requests=2, input_len=8, output_len=3)
    _report("decode", prof.steps["decode"], prof.clocks["decode"], prof.kv_read["decode"], peak=100.0)
    out = capsys.readouterr().out
    assert out.startswith("decode: ") and "GFLOPS" in out and "GB/s of KV" in out
    for component in ("qkv, o, gate_up", "down", "lm_head", "attention", "elementwise", "sampling"):
        assert f"  {component} " in out


def test_refuses_an_empty_wave(capsys) -> None:
    p = argparse.ArgumentParser()
    add_arguments(p)
    assert run(p.parse_args(["--requests", "0"])) == 2
    assert "--requests must be >= 1" in capsys.readouterr().err
