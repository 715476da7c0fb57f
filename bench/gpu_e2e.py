"""The GPU check's end-to-end part: the engine against transformers on the same device, and a KV hand-off between
two engine processes on one GPU. Prints tables; bench/gpu_check.sh runs it after the kernel timings.

    python -m bench.gpu_e2e [--quick] [--json-out PATH]
    python -m bench.gpu_e2e --device cpu --quick          (smoke run: a tiny random model, no targets)

1. parity: bf16 logits of one prompt (max |diff| against transformers, argmax agreement) and greedy tokens
   (Engine.generate vs HF generate: tokens equal before the first divergence), on the bundled model and on a
   1B-class Llama config with random weights (Llama-3.2-1B shapes).
2. throughput: 16 requests of 128 prompt / 64 new tokens at once (c=16): engine output tok/s vs HF generate with
   the same batch.
3. hand-off: a prefill process computes prompts with their pages held and shares its KV pool (CUDA IPC through
   torch.multiprocessing; shared memory on cpu); a decode process on the same GPU copies the pages VRAM -> VRAM into
   its own pool, both sum them on the device (WORDSUM64), and decode's continuation must equal a colocated run.
NIXL and Mooncake are not needed (the machine may not have them): tests/shared/transfer/test_vram_transfer.py
moves VRAM pages through them where they exist.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

PAGE = 16
ONE_B = {"layers": 16, "hidden": 2048, "inter": 8192, "heads": 32, "kv_heads": 8, "vocab": 128256}


def _runner(path: Path, dev: str, pages: int, ctx: int = 1024):  # -> ModelRunner
    from shared.engine.model_runner import ModelRunner

    return ModelRunner(
        path,
        dtype="bfloat16" if dev == "cuda" else "float32",
        device=dev,
        num_pages=pages,
        page_size=PAGE,
        attention_backend="triton" if dev == "cuda" else "torch",
        context_length=ctx,
        max_batch_tokens=4096,
    )


def _engine(path: Path, dev: str, pages: int = 1024):  # -> Engine
    from shared.config.groups import CacheConfig, SchedulerConfig
    from shared.engine.engine import Engine

    sched = SchedulerConfig(max_running_requests=16, max_prefill_tokens=4096, chunked_prefill_size=2048)
    return Engine(_runner(path, dev, pages), cache=CacheConfig(page_size=PAGE), scheduler=sched)


def _prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (length,), generator=g).tolist() for _ in range(n)]


def _hf(path: Path, dev: str) -> Any:
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)  # its stubs type .to() as a decorator
    return model.to(dev).eval()


def parity_row(name: str, path: Path, dev: str, new_tokens: int) -> dict[str, Any]:
    from shared.engine.types import ScheduledSeq, SchedulerOutput
    from shared.modelspec.sampling import SamplingParams

    hf, runner = _hf(path, dev), _runner(path, dev, 64)
    prompt = _prompts(1, 48, runner.vocab_size, seed=1)[0]
    out = SchedulerOutput((ScheduledSeq("p", tuple(prompt), 0, tuple(range(-(-len(prompt) // PAGE))), True),))
    ours = runner.forward(out)[0].float()
    with torch.no_grad():
        ref = hf(torch.tensor([prompt], device=dev)).logits[0, -1].float()
        want = hf.generate(torch.tensor([prompt], device=dev), max_new_tokens=new_tokens, do_sample=False)[0]
    want = want[len(prompt) :].tolist()
    del runner
    got = list(
        _engine(path, dev).generate([prompt], SamplingParams(max_tokens=new_tokens, temperature=0.0))[0].token_ids
    )
    same = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
    return {
        "model": name,
        "max_abs_logit_diff": float((ours - ref).abs().max()),
        "logit_scale": float(ref.abs().max()),
        "argmax_agree": bool(ours.argmax() == ref.argmax()),
        "greedy_equal_tokens": same,
        "greedy_tokens": new_tokens,
    }


def throughput_row(name: str, path: Path, dev: str, quick: bool) -> dict[str, Any]:
    from shared.modelspec.sampling import SamplingParams

    n, isl, osl = (4, 16, 8) if quick else (16, 128, 64)
    engine = _engine(path, dev)
    prompts = _prompts(n, isl, engine.runner.vocab_size, seed=2)
    params = SamplingParams(max_tokens=osl, temperature=0.0, ignore_eos=True)
    engine.generate(prompts[:2], SamplingParams(max_tokens=2, temperature=0.0), prefix="warm")
    times = []
    for rep in range(1 if quick else 3):
        _sync(dev)
        t0 = time.perf_counter()
        engine.generate(prompts, params, prefix=f"run{rep}")
        _sync(dev)
        times.append(time.perf_counter() - t0)
    del engine
    hf = _hf(path, dev)
    ids = torch.tensor(prompts, device=dev)  # equal lengths: no padding
    mask = torch.ones_like(ids)
    hf_times = []
    with torch.no_grad():
        hf.generate(ids[:2], attention_mask=mask[:2], max_new_tokens=2, do_sample=False)
        for _ in range(1 if quick else 3):
            _sync(dev)
            t0 = time.perf_counter()
            hf.generate(ids, attention_mask=mask, max_new_tokens=osl, min_new_tokens=osl, do_sample=False)
            _sync(dev)
            hf_times.append(time.perf_counter() - t0)
    ours, theirs = n * osl / statistics.median(times), n * osl / statistics.median(hf_times)
    return {"model": name, "requests": n, "isl": isl, "osl": osl, "engine_tok_s": ours, "hf_tok_s": theirs,
            "ratio": ours / theirs}  # fmt: skip


def _sync(dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


def _prefill_proc(path: str, dev: str, prompts: list[list[int]], q_out: Any, q_done: Any) -> None:
    """The prefill process: compute each prompt with its pages held, share the pool, wait until decode has copied."""
    from shared.modelspec.sampling import SamplingParams
    from shared.transfer.checksum import PageChecksum, checksum_pages

    engine = _engine(Path(path), dev)
    firsts, pages = [], []
    for i, p in enumerate(prompts):
        engine.add_request(f"p{i}", p, SamplingParams(max_tokens=1, temperature=0.0), hold_pages=True)
        while engine.has_work():
            for o in engine.step():
                if o.finished:
                    firsts.append(o.new_token_ids[0])
        pages.append(list(engine.held_pages(f"p{i}")))
    pool = engine.runner.kv.buffer
    sums = [checksum_pages(pool, ids, PageChecksum.WORDSUM64) for ids in pages]
    _sync(dev)
    q_out.put((pool, pages, firsts, sums))  # a CUDA tensor goes as an IPC handle, a CPU one as shared memory
    q_done.get(timeout=600)  # the pool must outlive the decode's copy


def handoff_row(name: str, path: Path, dev: str, quick: bool) -> dict[str, Any]:
    import torch.multiprocessing as mp

    from shared.modelspec.sampling import SamplingParams
    from shared.transfer.checksum import PageChecksum, checksum_pages

    n, isl, osl = (2, 40, 6) if quick else (8, 300, 32)
    engine = _engine(path, dev)
    prompts = _prompts(n, isl, engine.runner.vocab_size, seed=3)
    ctx = mp.get_context("spawn")
    q_out, q_done = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_prefill_proc, args=(str(path), dev, prompts, q_out, q_done), daemon=True)
    t0 = time.perf_counter()
    proc.start()
    try:
        remote, src_pages, firsts, sums = q_out.get(timeout=600)
        t_copy = time.perf_counter()
        ok_sums, moved = 0, 0
        for i, p in enumerate(prompts):
            res = engine.reserve_remote(f"d{i}", p, SamplingParams(max_tokens=osl, temperature=0.0, ignore_eos=True))
            dst = list(res.page_ids)
            src = torch.tensor(src_pages[i][: len(dst)], device=dev)
            engine.runner.kv.buffer[torch.tensor(dst, device=dev)] = remote.index_select(0, src)
            moved += len(dst) * engine.runner.kv.buffer[0].numel() * engine.runner.kv.buffer.element_size()
            ok_sums += checksum_pages(engine.runner.kv.buffer, dst, PageChecksum.WORDSUM64) == sums[i]
            engine.activate_remote(f"d{i}", firsts[i])
        _sync(dev)
        copy_s = time.perf_counter() - t_copy
        got: dict[str, list[int]] = {f"d{i}": [firsts[i]] for i in range(n)}
        while engine.has_work():
            for o in engine.step():
                got[o.req_id] = got.get(o.req_id, []) + list(o.new_token_ids)
        q_done.put(True)
    finally:
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()
    colo = engine.generate(prompts, SamplingParams(max_tokens=osl, temperature=0.0, ignore_eos=True), prefix="colo")
    same = sum(got[f"d{i}"][:osl] == list(c.token_ids) for i, c in enumerate(colo))
    return {"model": name, "prompts": n, "checksums_equal": ok_sums, "continuations_equal": same,
            "bytes_moved": moved, "copy_ms": copy_s * 1e3, "total_s": time.perf_counter() - t0}  # fmt: skip


def models(dev: str, quick: bool, tmp: Path) -> list[tuple[str, Path]]:
    from bench.gpu_check import model_dir, random_checkpoint

    if quick:
        path, name = model_dir(True, tmp)
        return [(name, path)]
    path, name = model_dir(False, tmp)
    out = [(name, path)]
    out.append((
        "Llama-3.2-1B shapes, random weights",
        random_checkpoint(tmp / "llama-1b", layers=ONE_B["layers"], hidden=ONE_B["hidden"], inter=ONE_B["inter"],
                          heads=ONE_B["heads"], kv_heads=ONE_B["kv_heads"], vocab=ONE_B["vocab"]),
    ))  # fmt: skip
    return out


def print_tables(res: dict[str, Any]) -> None:
    print(f"\nparity vs transformers ({res['dtype']} on {res['device']})")
    print(f"{'model':40} {'max|dlogit|':>12} {'of max|logit|':>14} {'argmax':>7} {'greedy equal':>13}")
    for r in res["parity"]:
        print(
            f"{r['model']:40} {r['max_abs_logit_diff']:12.3e} {r['max_abs_logit_diff'] / r['logit_scale']:14.2%} "
            f"{'same' if r['argmax_agree'] else 'DIFF':>7} {r['greedy_equal_tokens']:>6} of {r['greedy_tokens']}"
        )
    print(f"\nthroughput at c={res['throughput'][0]['requests']}")
    print(f"{'model':40} {'engine tok/s':>13} {'HF tok/s':>10} {'ratio':>7}")
    for r in res["throughput"]:
        print(f"{r['model']:40} {r['engine_tok_s']:13.1f} {r['hf_tok_s']:10.1f} {r['ratio']:6.2f}x")
    h = res["handoff"]
    print(
        f"\nhand-off between two processes on one device: {h['prompts']} prompts, {h['bytes_moved'] / 2**20:.1f} MiB "
        f"in {h['copy_ms']:.1f} ms, device checksums equal {h['checksums_equal']}/{h['prompts']}, continuations "
        f"equal {h['continuations_equal']}/{h['prompts']}"
    )


def run(ns: argparse.Namespace) -> int:
    dev = ns.device
    if dev == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run on a GPU machine, or pass --device cpu --quick for a smoke run", file=sys.stderr)
        return 2
    quick = ns.quick or dev == "cpu"
    res: dict[str, Any] = {"device": dev, "dtype": "bfloat16" if dev == "cuda" else "float32", "quick": quick}
    with tempfile.TemporaryDirectory() as tmp:
        ms = models(dev, quick, Path(tmp))
        res["parity"] = [parity_row(name, path, dev, 8 if quick else 32) for name, path in ms]
        res["throughput"] = [throughput_row(name, path, dev, quick) for name, path in ms[:1]]
        res["handoff"] = handoff_row(ms[0][0], ms[0][1], dev, quick)
    print_tables(res)
    if ns.json_out:
        Path(ns.json_out).write_text(json.dumps(res, indent=2))
    h = res["handoff"]
    ok = h["checksums_equal"] == h["prompts"] == h["continuations_equal"] and all(
        r["argmax_agree"] for r in res["parity"]
    )
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_e2e", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--quick", action="store_true", help="tiny sizes (checks the script, not the GPU)")
    p.add_argument("--json-out", default=None, metavar="PATH")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
