"""OpenAI API features in the engine: grammar overhead per decode step, and n = 4 vs four separate requests.

    python -m bench.api [--threads 2] [--batch 16] [--tokens 32] [--rounds 4] [--json-out PATH]

grammar: two engines on the bundled model step in turn, one decoding `batch` requests free and the other the same
  prompts under a JSON schema (a long bounded string, so both emit the same number of tokens); the roles swap every
  round. Each full decode step of one is paired with the adjacent step of the other, so load from other processes
  hits both sides of a pair alike: the overhead is the median of the per-pair ratios (grammar step / free step,
  step = schedule + prepare + forward + sample + update from the engine's own step stats). The mask filler's own
  timings say how much grammar work lay on the step's path (waiting for the fill, filling inline, applying the mask)
  and how much overlapped the forward pass.
n=4: one request with n = 4 vs four requests with the same prompt sent together (256-token prompt, 16 sampled
  tokens each): prompt tokens computed, steps, output tok/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from shared.engine.grammar.mask import MaskStats
from shared.grammar.spec import GrammarKind, StructuredSpec
from shared.modelspec.sampling import SamplingParams

SCHEMA = {
    "type": "object",
    "properties": {"story": {"type": "string", "minLength": 600, "maxLength": 800}},
    "required": ["story"],
    "additionalProperties": False,
}
BUNDLED = "bundled:smollm2-135m-instruct"


def _engine(threads: int, model: str = BUNDLED, num_pages: int = 2048):  # -> (Engine, tokenizer)
    from transformers import AutoTokenizer

    from shared.config.groups import CacheConfig, SchedulerConfig
    from shared.engine.engine import Engine
    from shared.engine.model_runner import ModelRunner
    from shared.modelspec.bundled import resolve_model_path

    path = resolve_model_path(model)
    tok = AutoTokenizer.from_pretrained(path)
    runner = ModelRunner(path, num_pages=num_pages, page_size=16)
    return Engine(
        runner,
        cache=CacheConfig(page_size=16),
        scheduler=SchedulerConfig(max_running_requests=64),
        tokenizer=tok,
        threads=threads,
    ), tok


def _step_s(engine) -> float:
    s = engine.stats.last_step
    return s.schedule_s + s.prepare_s + s.forward_s + s.sample_s + s.update_s


def _is_full_decode(engine, batch: int) -> bool:
    s = engine.stats.last_step
    return s.num_seqs == batch and s.num_tokens == batch


def paired_ratios(free: list[float], grammar: list[float]) -> list[float]:
    """grammar[i] / free[i] over the steps both sides have (the i-th full decode step of each ran side by side)."""
    return [g / f for f, g in zip(free, grammar, strict=False) if f > 0]


def _interleaved(
    engines: list,
    prompts: list[list[int]],
    params: list[list[SamplingParams]],
) -> tuple[list[list[tuple[float, float]]], list[int]]:
    """Add params[k] to engines[k], then step the engines in turn until both are done. -> ((wall s, CPU s) of each
    engine's full decode steps, tokens each generated). CPU time is this process's (all its threads, the grammar
    helper included): what a step cost, whatever else the machine ran meanwhile."""
    batch = len(prompts)
    tag = time.monotonic_ns()
    for k, (engine, ps) in enumerate(zip(engines, params, strict=True)):
        for i, (p, sp) in enumerate(zip(prompts, ps, strict=True)):
            engine.add_request(f"ab{tag}-{k}-{i}", p, sp)
    steps: list[list[tuple[float, float]]] = [[] for _ in engines]
    out = [0 for _ in engines]
    while any(e.has_work() for e in engines):
        for k, engine in enumerate(engines):
            if not engine.has_work():
                continue
            c0 = time.process_time()
            outs = engine.step()
            cpu = time.process_time() - c0
            out[k] += sum(len(o.new_token_ids) for o in outs)
            if _is_full_decode(engine, batch):
                steps[k].append((_step_s(engine), cpu))
    return steps, out


def bench_grammar(engines: list, tok, batch: int, tokens: int, rounds: int) -> dict[str, Any]:
    msgs = [{"role": "user", "content": f"Tell story number {i} as JSON."} for i in range(batch)]
    prompts = []
    for m in msgs:
        ids = tok.apply_chat_template([m], add_generation_prompt=True, tokenize=True)
        prompts.append(list(ids["input_ids"]) if not isinstance(ids, list) else ids)
    spec = StructuredSpec(GrammarKind.JSON_SCHEMA, json.dumps(SCHEMA))
    free = [SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)] * batch
    constrained = [SamplingParams(max_tokens=tokens, temperature=0.0, structured=spec)] * batch
    for e in engines:  # warm-up (and the grammar compiler: first schema compile), both engines, both kinds
        _interleaved([e], prompts[:2], [constrained[:2]])
        _interleaved([e], prompts[:2], [free[:2]])
        e.masks.stats = MaskStats()  # count only the measured rounds
    ratios: list[float] = []
    cpu_ratios: list[float] = []
    free_s: list[float] = []
    gram_s: list[float] = []
    per_round: list[float] = []
    for r in range(rounds):
        # the roles swap every round, so a difference between the two engines (memory placement) cancels too
        order = [free, constrained] if r % 2 == 0 else [constrained, free]
        steps, out = _interleaved(engines, prompts, order)
        assert out == [batch * tokens] * 2, out
        f, g = (steps[0], steps[1]) if r % 2 == 0 else (steps[1], steps[0])
        rs = paired_ratios([w for w, _ in f], [w for w, _ in g])
        ratios += rs
        cpu_ratios += paired_ratios([c for _, c in f], [c for _, c in g])
        free_s += [w for w, _ in f]
        gram_s += [w for w, _ in g]
        per_round.append(statistics.median(rs))
    masks = [e.masks.stats for e in engines]
    mask_steps = sum(m.steps for m in masks)
    critical = sum(m.critical_s for m in masks) / max(mask_steps, 1)
    fill = sum(m.fill_s for m in masks) / max(mask_steps, 1)
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
    med_free = statistics.median(free_s)
    return {
        "batch": batch,
        "tokens": tokens,
        "rounds": rounds,
        "pairs": len(ratios),
        "overhead_median": round(statistics.median(ratios) - 1.0, 4),
        "overhead_iqr": [round(q[0] - 1.0, 4), round(q[2] - 1.0, 4)],
        "overhead_cpu_median": round(statistics.median(cpu_ratios) - 1.0, 4) if cpu_ratios else None,
        "overhead_per_round": [round(x - 1.0, 4) for x in per_round],
        "step_ms_free_median": round(1e3 * med_free, 2),
        "step_ms_grammar_median": round(1e3 * statistics.median(gram_s), 2),
        "mask_critical_ms_per_step": round(1e3 * critical, 3),
        "mask_fill_ms_per_step": round(1e3 * fill, 3),
        "mask_critical_share": round(critical / med_free, 4) if med_free else None,
        "inline_fill_steps_share": None
        if not mask_steps
        else round(sum(m.inline_fill_s for m in masks) / max(sum(m.fill_s for m in masks), 1e-12), 3),
    }


def bench_n(engine, n: int = 4, prompt_len: int = 256, tokens: int = 16) -> dict[str, Any]:
    prompt = [100 + (37 * i) % 40000 for i in range(prompt_len)]

    def run(reqs: list[tuple[str, SamplingParams]]) -> dict[str, Any]:
        engine.cache.reset()  # no prefix hits from an earlier run
        engine.reset_stats()
        t0 = time.perf_counter()
        for rid, sp in reqs:
            engine.add_request(rid, prompt, sp)
        out, left = 0, sum(sp.n for _, sp in reqs)
        while left:
            for o in engine.step():
                out += len(o.new_token_ids)
                left -= o.finished
        wall = time.perf_counter() - t0
        s = engine.stats
        # every sampled token but each sample's last is fed back as a decode input; the rest is prompt work
        computed = s.totals.num_tokens - (out - n)
        return {
            "wall_s": round(wall, 3),
            "output_tokens": out,
            "tok_s": round(out / wall, 1),
            "prompt_tokens_computed": computed,
            "steps": s.num_steps,
        }

    tag = time.monotonic_ns()
    together = run(
        [
            (f"sep{tag}-{i}", SamplingParams(max_tokens=tokens, temperature=1.0, seed=i, ignore_eos=True))
            for i in range(n)
        ]
    )
    forked = run([(f"n{tag}", SamplingParams(max_tokens=tokens, temperature=1.0, seed=0, ignore_eos=True, n=n))])
    return {
        "n": n,
        "prompt_len": prompt_len,
        "tokens": tokens,
        "separate": together,
        "n_request": forked,
        "prefill_saved": round(1 - forked["prompt_tokens_computed"] / together["prompt_tokens_computed"], 3),
        "tok_s_ratio": round(forked["tok_s"] / together["tok_s"], 3),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--model", default=BUNDLED, help="model directory or bundled name (default: %(default)s)")
    ap.add_argument("--skip-n", action="store_true", help="only the grammar overhead")
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    if args.batch < 1 or args.tokens < 2 or args.rounds < 1:
        ap.error("--batch >= 1, --tokens >= 2 and --rounds >= 1")
    pages = max(64, 2 * args.batch * (64 + args.tokens) // 16)  # two engines: only what the workload needs
    (engine, tok), (other, _) = _engine(args.threads, args.model, pages), _engine(args.threads, args.model, pages)
    g = bench_grammar([engine, other], tok, args.batch, args.tokens, args.rounds)
    lo, hi = g["overhead_iqr"]
    print(
        f"grammar, batch {g['batch']}, {g['tokens']} tokens, {g['pairs']} interleaved step pairs: overhead "
        f"{100 * g['overhead_median']:+.1f}% median (IQR {100 * lo:+.1f}% .. {100 * hi:+.1f}%; per round "
        f"{', '.join(f'{100 * x:+.1f}%' for x in g['overhead_per_round'])}), CPU time "
        f"{100 * g['overhead_cpu_median']:+.1f}% median (target <= 10%); step "
        f"{g['step_ms_free_median']} ms free, {g['step_ms_grammar_median']} ms grammar (medians); mask on the step's "
        f"path {g['mask_critical_ms_per_step']} ms/step ({100 * (g['mask_critical_share'] or 0):.1f}% of a free "
        f"step), fill {g['mask_fill_ms_per_step']} ms/step (overlapped with the forward pass; inline share "
        f"{g['inline_fill_steps_share']})"
    )
    out: dict[str, Any] = {"grammar": g}
    del engine, other  # their KV memory, before the n = 4 engine takes its own
    if not args.skip_n:
        big, _ = _engine(args.threads, args.model)
        nres = bench_n(big)
        s, f = nres["separate"], nres["n_request"]
        print(
            f"n=4 vs 4 requests (prompt {nres['prompt_len']}, {nres['tokens']} tokens each): prompt tokens "
            f"computed {f['prompt_tokens_computed']} vs {s['prompt_tokens_computed']} "
            f"({100 * nres['prefill_saved']:.0f}% saved), {f['tok_s']} vs {s['tok_s']} tok/s ({nres['tok_s_ratio']}x)"
        )
        out["n"] = nres
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
