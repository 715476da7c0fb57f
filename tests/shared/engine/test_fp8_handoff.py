"""A prefill -> decode hand-off of fp8 KV pages between two real engines (tiny Llama): the pages move as bytes, the
checksums over those bytes agree, decode continues exactly as a colocated fp8 engine does, and the hand-off moves
half the bytes of the same hand-off with bf16 KV."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from shared.config.groups import CacheConfig, SchedulerConfig
from shared.engine.engine import Engine
from shared.engine.model_runner import ModelRunner
from shared.modelspec.sampling import SamplingParams
from tests.helpers.tiny_models import tiny_llama_dir  # noqa: F401

P = 4
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def _engine(model_dir: Path, kv: str) -> Engine:
    runner = ModelRunner(model_dir, kv_cache_dtype=kv, num_pages=64, page_size=P, attention_backend="torch")
    return Engine(runner, cache=CacheConfig(page_size=P), scheduler=SchedulerConfig(max_prefill_tokens=64))


def _handoff(pre: Engine, dec: Engine, rid: str, prompt: list[int]) -> tuple[list[int], int]:
    """One hand-off, the pages moved as raw bytes (what NIXL / Mooncake do); (decode's tokens, bytes moved)."""
    res = dec.reserve_remote(rid, prompt, GREEDY)
    pre.add_request(rid, prompt, dataclasses.replace(GREEDY, max_tokens=1), hold_pages=True)
    first = None
    while pre.has_work():
        for o in pre.step():
            if o.req_id == rid and o.finished:
                first = o.new_token_ids[0]
    assert first is not None
    skip = res.skip_tokens // P
    src, dst = pre.held_pages(rid)[skip:], res.page_ids[skip:]
    data = pre.runner.kv.pages_bytes(src)
    pb = pre.runner.kv.bytes_per_page
    for i, page in enumerate(dst):
        dec.runner.kv.page_view(page).view(-1).view(torch.uint8).copy_(data[i * pb : (i + 1) * pb])
    assert dec.runner.kv.pages_checksum(dst) == pre.runner.kv.pages_checksum(src)
    assert pre.release_held(rid)
    toks = [first]
    dec.activate_remote(rid, first)
    while dec.has_work():
        for o in dec.step():
            if o.req_id == rid:
                toks.extend(o.new_token_ids)
    return toks, data.numel()


def test_fp8_pages_hand_off_as_bytes_and_decode_continues_exactly(tiny_llama_dir: Path) -> None:
    prompts = [list(range(7, 30)), [3, 99, 4, 250, 17, 17, 61, 8, 9]]
    pre, dec = _engine(tiny_llama_dir, "fp8_e4m3"), _engine(tiny_llama_dir, "fp8_e4m3")
    colocated = _engine(tiny_llama_dir, "fp8_e4m3").generate(prompts, GREEDY)
    moved = {}
    for i, p in enumerate(prompts):
        toks, moved[i] = _handoff(pre, dec, f"r{i}", p)
        assert toks == list(colocated[i].token_ids)
    pre16, dec16 = _engine(tiny_llama_dir, "bfloat16"), _engine(tiny_llama_dir, "bfloat16")
    for i, p in enumerate(prompts):
        _, bf16_bytes = _handoff(pre16, dec16, f"b{i}", p)
        assert moved[i] * 2 == bf16_bytes  # half the bytes of bf16 KV, page for page
    assert pre.runner.layout != pre16.runner.layout  # the ticket and the kvstore tell them apart
