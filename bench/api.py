"""OpenAI API features in the engine: grammar overhead per decode step, and n = 4 vs four separate requests.

    python -m bench.api [--threads 2] [--batch 16] [--tokens 64] [--repeat 3] [--json-out PATH]

grammar: `batch` requests decode `tokens` tokens each on the bundled model, once free and once each under a JSON
  schema (a long bounded string, so both runs emit the same number of tokens); per decode step time (forward +
  sampling + update, from the engine's own step stats) with and without, best of `repeat` alternating runs.
n=4: one request with n = 4 vs four requests with the same prompt sent together (256-token prompt, 16 sampled
  tokens each): prompt tokens computed, steps, output tok/s.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from shared.engine.sampling_params import SamplingParams
from shared.grammar.spec import GrammarKind, StructuredSpec

SCHEMA = {"type": "object", "properties": {"story": {"type": "string", "minLength": 600, "maxLength": 800}},
          "required": ["story"], "additionalProperties": False}


def _engine(threads: int):  # -> (Engine, tokenizer)
    from transformers import AutoTokenizer

    from shared.config.groups import CacheConfig, SchedulerConfig
    from shared.modelspec.bundled import resolve_model_path
    from shared.engine.engine import Engine
    from shared.engine.model_runner import ModelRunner

    path = resolve_model_path("bundled:smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(path)
    runner = ModelRunner(path, num_pages=2048, page_size=16)
    return Engine(runner, cache=CacheConfig(page_size=16), scheduler=SchedulerConfig(max_running_requests=64),
                  tokenizer=tok, threads=threads), tok


def _decode_step_ms(engine, prompts: list[list[int]], params: list[SamplingParams]) -> tuple[float, int]:
    """Mean ms per decode-only step (prefill steps left out), and the tokens generated."""
    engine.reset_stats()
    ids = [f"b{time.monotonic_ns()}-{i}" for i in range(len(prompts))]
    for rid, p, sp in zip(ids, prompts, params, strict=True):
        engine.add_request(rid, p, sp)
    steps, total = 0, 0.0
    n_out = 0
    while engine.has_work():
        outs = engine.step()
        s = engine.stats.last_step
        n_out += sum(len(o.new_token_ids) for o in outs)
        if s.num_seqs == len(prompts) and s.num_tokens == len(prompts):  # a full decode step
            steps += 1
            total += s.schedule_s + s.prepare_s + s.forward_s + s.sample_s + s.update_s
    return 1e3 * total / max(steps, 1), n_out


def bench_grammar(engine, tok, batch: int, tokens: int, repeat: int) -> dict[str, Any]:
    msgs = [{"role": "user", "content": f"Tell story number {i} as JSON."} for i in range(batch)]
    prompts = []
    for m in msgs:
        ids = tok.apply_chat_template([m], add_generation_prompt=True, tokenize=True)
        prompts.append(list(ids["input_ids"]) if not isinstance(ids, list) else ids)
    spec = StructuredSpec(GrammarKind.JSON_SCHEMA, json.dumps(SCHEMA))
    free = [SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)] * batch
    constrained = [SamplingParams(max_tokens=tokens, temperature=0.0, structured=spec)] * batch
    _decode_step_ms(engine, prompts[:2], free[:2])  # warm-up (and the grammar compiler: first schema compile)
    _decode_step_ms(engine, prompts[:2], constrained[:2])
    base, gram = [], []
    for _ in range(repeat):
        ms, n0 = _decode_step_ms(engine, prompts, free)
        base.append(ms)
        ms, n1 = _decode_step_ms(engine, prompts, constrained)
        gram.append(ms)
        assert n0 == n1 == batch * tokens, (n0, n1)
    b, g = min(base), min(gram)
    return {"batch": batch, "tokens": tokens, "step_ms_free": round(b, 2), "step_ms_grammar": round(g, 2),
            "overhead": round(g / b - 1.0, 4), "runs_free": [round(x, 2) for x in base],
            "runs_grammar": [round(x, 2) for x in gram]}


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
        return {"wall_s": round(wall, 3), "output_tokens": out, "tok_s": round(out / wall, 1),
                "prompt_tokens_computed": computed, "steps": s.num_steps}

    tag = time.monotonic_ns()
    together = run([(f"sep{tag}-{i}", SamplingParams(max_tokens=tokens, temperature=1.0, seed=i, ignore_eos=True))
                    for i in range(n)])
    forked = run([(f"n{tag}", SamplingParams(max_tokens=tokens, temperature=1.0, seed=0, ignore_eos=True, n=n))])
    return {"n": n, "prompt_len": prompt_len, "tokens": tokens, "separate": together, "n_request": forked,
            "prefill_saved": round(1 - forked["prompt_tokens_computed"] / together["prompt_tokens_computed"], 3),
            "tok_s_ratio": round(forked["tok_s"] / together["tok_s"], 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    engine, tok = _engine(args.threads)
    g = bench_grammar(engine, tok, args.batch, args.tokens, args.repeat)
    print(f"grammar, batch {g['batch']}, {g['tokens']} tokens: decode step {g['step_ms_free']} ms free, "
          f"{g['step_ms_grammar']} ms under a JSON schema: overhead {100 * g['overhead']:+.1f}% (target <= 10%)")
    nres = bench_n(engine)
    s, f = nres["separate"], nres["n_request"]
    print(f"n=4 vs 4 requests (prompt {nres['prompt_len']}, {nres['tokens']} tokens each): prompt tokens computed "
          f"{f['prompt_tokens_computed']} vs {s['prompt_tokens_computed']} ({100 * nres['prefill_saved']:.0f}% saved), "
          f"{f['tok_s']} vs {s['tok_s']} tok/s ({nres['tok_s_ratio']}x)")
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump({"grammar": g, "n": nres}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
