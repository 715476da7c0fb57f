"""In-process hand-off steps between two engines (TP=1 or TP>1 on CPU): a prefill whose pages are exported as a
hand-off reads them, and a decode that lands those bytes in its pool and imports them, as NIXL / Mooncake and the
services do (services/prefill/service.py, services/decode/remote_prefill.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from shared.config.groups import CacheConfig, DeviceConfig, KernelConfig, ModelConfig, ParallelConfig, SchedulerConfig
from shared.engine.engine import Engine
from shared.modelspec.sampling import SamplingParams

PAGE = 4
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def tp_engine(model_dir: Path, tp: int) -> Engine:
    return Engine.from_groups(
        model=ModelConfig(model=str(model_dir)),
        cache=CacheConfig(num_pages=64, page_size=PAGE),
        scheduler=SchedulerConfig(max_running_requests=8, chunked_prefill_size=64),
        kernels=KernelConfig(attention_backend="torch", linear_backend="torch"),
        device=DeviceConfig(device="cpu", threads=tp),
        parallel=ParallelConfig(tp_size=tp),
    )


def prompts(seed: int) -> list[list[int]]:
    """Prompts of their own per test (a prompt another test computed would hit the engine's prefix cache)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 500, (n,), generator=g).tolist() for n in (5, 9, 17, 30)]


def prefill(engine: Engine, rid: str, prompt: list[int]) -> tuple[int, torch.Tensor]:
    """The prompt's first token and its pages' bytes as a hand-off reads them (exported, from runner.kv)."""
    engine.add_request(rid, prompt, dataclasses.replace(GREEDY, max_tokens=1), hold_pages=True)
    first = None
    while engine.has_work():
        for o in engine.step():
            if o.req_id == rid and o.finished:
                first = o.new_token_ids[0]
    assert first is not None
    ids = list(engine.held_pages(rid))
    engine.export_pages(ids)
    data = engine.runner.kv.pages_bytes(ids).clone()
    assert engine.release_held(rid)
    return first, data


def decode(engine: Engine, rid: str, prompt: list[int], first: int, data: torch.Tensor) -> list[int]:
    """Decode's side: reserve pages, land the bytes in runner.kv (what NIXL / Mooncake do), import, continue."""
    res = engine.reserve_remote(rid, prompt, GREEDY)
    assert res.skip_tokens == 0, "a prompt this decode computed before: its prefix cache would shorten the hand-off"
    kv = engine.runner.kv
    pb = kv.bytes_per_page
    for i, page in enumerate(res.page_ids):
        kv.page_view(page).view(-1).view(torch.uint8).copy_(data[i * pb : (i + 1) * pb])
    toks = [first]
    engine.activate_remote(rid, first, received=res.page_ids)
    while engine.has_work():
        for o in engine.step():
            if o.req_id == rid:
                toks.extend(o.new_token_ids)
    return toks
