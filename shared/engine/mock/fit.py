"""Measure the real engine's step times and write the mock engine's timing table.

    python -m shared.engine.mock.fit [--model bundled:smollm2-135m-instruct] [--threads 1] [--out table.json]

Each point runs the real ModelRunner on a synthetic step (a prompt chunk of N tokens, or B decoding sequences with
C tokens of context each) plus the argmax over its logits, and keeps the fastest of a few repetitions. The
defaults measure what a service on a shared CPU box runs with (one intra-op thread). Decode rows share their
context pages: the step reads the same bytes per row as distinct sequences would, in a pool that stays small.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from collections.abc import Sequence

from shared.engine.mock.timing import DEFAULT_TABLE, DecodeTable, PrefillTable, TimingTable

PREFILL_TOKENS = (16, 64, 128, 256, 512)
DECODE_BATCH = (1, 4, 16, 32, 64)
DECODE_CONTEXT = (64, 512, 2048)


def _best_s(fn, reps: int) -> float:
    fn()  # warm: first calls pay for lazy kernel setup
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)  # a shared box only ever adds time: the fastest run is the least disturbed one


def measure(
    model: str,
    threads: int,
    reps: int,
    prefill: Sequence[int],
    batch: Sequence[int],
    context: Sequence[int],
    progress=print,
) -> TimingTable:
    import torch

    from shared.config import resolve
    from shared.engine.kv_pool import num_pages_for_budget
    from shared.engine.model_runner import ModelRunner
    from shared.engine.types import ScheduledSeq, SchedulerOutput
    from shared.modelspec.bundled import resolve_model_path

    torch.set_num_threads(threads)
    cfg = resolve("decode", ["--model", model, "--threads", str(threads)])
    path = resolve_model_path(model, cfg.model.model_cache_dir)
    page = cfg.cache.page_size
    pool_pages = max(max(context), max(prefill)) // page + 2
    runner = ModelRunner(
        path,
        dtype=cfg.model.dtype,
        num_pages=pool_pages,
        page_size=page,
        attention_backend=cfg.kernels.attention_backend,
        linear_backend=cfg.kernels.linear_backend,
        max_batch_tokens=max(max(prefill), max(batch)) + 1,
    )
    default_pages = cfg.cache.num_pages or num_pages_for_budget(runner.layout, cfg.cache.kv_cache_memory_bytes)

    def run(out: SchedulerOutput) -> None:
        runner.forward(out).argmax(dim=-1).tolist()

    pre_ms = []
    for n in prefill:
        seq = ScheduledSeq("p", tuple(range(100, 100 + n)), 0, tuple(range(-(-n // page))), True)
        pre_ms.append(round(_best_s(lambda s=seq: run(SchedulerOutput((s,))), reps) * 1e3, 3))
        progress(f"prefill {n:5d} tokens: {pre_ms[-1]:8.2f} ms")
    dec_ms = []
    for b in batch:
        row = []
        for c in context:
            pages = tuple(range(-(-c // page)))
            seqs = tuple(ScheduledSeq(f"d{i}", (100 + i,), c - 1, pages, True) for i in range(b))
            row.append(round(_best_s(lambda s=seqs: run(SchedulerOutput(s)), reps) * 1e3, 3))
            progress(f"decode batch {b:3d} context {c:5d}: {row[-1]:8.2f} ms")
        dec_ms.append(tuple(row))
    return TimingTable(
        model=model,
        vocab_size=runner.vocab_size,
        eos_token_ids=runner.eos_token_ids,
        context_length=runner.context_length,
        num_pages=default_pages,
        threads=threads,
        host=f"{platform.machine()} {os.cpu_count()} cores, {platform.python_implementation()}",
        measured_at=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        prefill=PrefillTable(tokens=tuple(prefill), ms=tuple(pre_ms)),
        decode=DecodeTable(batch=tuple(batch), context=tuple(context), ms=tuple(dec_ms)),
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m shared.engine.mock.fit", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="bundled:smollm2-135m-instruct")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (services default to 1)")
    p.add_argument("--reps", type=int, default=3, help="repetitions per point (the fastest is kept)")
    p.add_argument("--out", default=str(DEFAULT_TABLE), help="where to write the table")
    ns = p.parse_args(argv)
    if ns.threads < 1 or ns.reps < 1:
        print("fit: --threads and --reps must be >= 1", file=sys.stderr)
        return 2
    table = measure(ns.model, ns.threads, ns.reps, PREFILL_TOKENS, DECODE_BATCH, DECODE_CONTEXT)
    table.dump(ns.out)
    print(f"wrote {ns.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
