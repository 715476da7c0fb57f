"""Tensor parallelism on CPU: a decode step at TP=2 vs TP=1, and the all-reduce's share of the TP=2 step.

    python -m bench.tp_step --make-model DIR     # a random Llama of SmolLM2-135M's shapes with 8 heads / 4 KV heads
    python -m bench.tp_step --model DIR [--batch 8] [--context 256] [--steps 20] [--threads 2]

The bundled SmolLM2-135M has 9 attention heads and 3 KV heads: TP=2 cannot split it, so --make-model writes a model
of its sizes (30 layers, hidden 576, MLP 1536, vocabulary 49152) with 8 heads of 72 and 4 KV heads, random weights,
and the bundled model's tokenizer. The run prefills --batch prompts of --context tokens, then times --steps decode
steps of the whole batch through the runner (no scheduler, no sampling): TP=1 on --threads threads, TP=2 with the
threads split between its two ranks (1 each by default). On TP=2, torch's profiler on rank 0 sums the time inside
the collectives: the all-reduces (two per layer and the embedding's) and the logits' all-gather; on a busy box a
collective also waits for the other rank to reach it, which is counted in it.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

from bench.entry import bench_main


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--make-model", default=None, metavar="DIR", help="write the TP=2-splittable model to DIR and stop")
    p.add_argument("--model", default=None, help="a model directory whose heads split in 2 (see --make-model)")
    p.add_argument("--batch", type=int, default=8, help="sequences decoding together")
    p.add_argument("--context", type=int, default=256, help="prompt tokens of each sequence")
    p.add_argument("--steps", type=int, default=20, help="decode steps timed (after 3 untimed)")
    p.add_argument("--threads", type=int, default=2, help="torch threads of the whole instance (TP=2: split)")


def make_model(out: Path) -> None:
    """SmolLM2-135M's shapes, 8 heads / 4 KV heads, random weights, the bundled tokenizer."""
    import transformers

    from shared.modelspec.bundled import resolve_model_path

    bundled = Path(resolve_model_path("bundled:smollm2-135m-instruct"))
    cfg = transformers.LlamaConfig.from_pretrained(bundled)
    cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim = 8, 4, 72
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        if (bundled / name).is_file():
            shutil.copy(bundled / name, out / name)


def _engine(model: str, tp: int, threads: int, pages: int):  # -> Engine
    from shared.config.groups import CacheConfig, DeviceConfig, ModelConfig, ParallelConfig, SchedulerConfig
    from shared.engine.engine import Engine

    return Engine.from_groups(
        model=ModelConfig(model=model),
        cache=CacheConfig(num_pages=pages, page_size=16),
        scheduler=SchedulerConfig(max_running_requests=64),
        device=DeviceConfig(device="cpu", threads=threads),
        parallel=ParallelConfig(tp_size=tp),
    )


def _decode_steps(engine, batch: int, context: int, steps: int, profile: bool) -> tuple[list[float], float]:
    """(each timed decode step's seconds, seconds inside collectives on rank 0 over them, 0 without profile)."""
    from shared.engine.types import ScheduledSeq, SchedulerOutput

    runner = engine.runner
    g = torch.Generator().manual_seed(1)
    per = -(-(context + steps + 4) // 16)
    seqs = [
        ScheduledSeq(
            f"s{i}",
            tuple(torch.randint(3, 40000, (context,), generator=g).tolist()),
            0,
            tuple(range(i * per, (i + 1) * per)),  # its own pages, enough for the prompt and every step
            True,
        )
        for i in range(batch)
    ]
    for s in seqs:  # one prompt per step: the prefill's size is not what is measured
        runner.forward_batch(runner.prepare(SchedulerOutput((s,))))
    pos = context
    times: list[float] = []
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if profile else None
    for k in range(steps + 3):
        if k == 3 and prof is not None:
            prof.__enter__()
        out = SchedulerOutput(tuple(ScheduledSeq(s.req_id, (7,), pos, s.page_ids, True) for s in seqs))
        t0 = time.perf_counter()
        runner.forward_batch(runner.prepare(out))
        if k >= 3:
            times.append(time.perf_counter() - t0)
        pos += 1
    coll = 0.0
    if prof is not None:
        prof.__exit__(None, None, None)
        # the c10d ops (their time includes the wait for the other rank): all-reduce and all-gather
        names = ("c10d::allreduce_", "c10d::allgather_")
        coll = sum(e.cpu_time_total for e in prof.key_averages() if e.key in names) / 1e6
    return times, coll


def run(ns: argparse.Namespace) -> int:
    if ns.make_model:
        make_model(Path(ns.make_model))
        print(f"wrote {ns.make_model}")
        return 0
    if not ns.model:
        print("bench tp_step: give --model DIR (make one with --make-model DIR)", file=sys.stderr)
        return 2
    pages = ns.batch * (-(-(ns.context + ns.steps + 4) // 16)) + 4
    results = {}
    for tp in (1, 2):
        engine = _engine(ns.model, tp, ns.threads, pages)
        try:
            times, coll = _decode_steps(engine, ns.batch, ns.context, ns.steps, profile=tp > 1)
        finally:
            close = getattr(engine.runner, "close", None)
            if close is not None:
                close()
        results[tp] = (statistics.median(times), sum(times), coll)
    t1, t2 = results[1][0], results[2][0]
    share = results[2][2] / results[2][1]
    print(
        f"decode step, batch {ns.batch} x {ns.context} context, {ns.threads} thread(s) in all, median of {ns.steps}: "
        f"TP=1 {t1 * 1e3:.1f} ms, TP=2 {t2 * 1e3:.1f} ms ({t1 / t2:.2f}x); TP=2 rank 0 inside collectives "
        f"{results[2][2] * 1e3 / ns.steps:.1f} ms per step = {100 * share:.1f}% of the step"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    return bench_main("bench.tp_step", __doc__, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
