"""KV pages decode receives are bit-identical to what colocated prefill computes, with each transfer backend.

In one process: a prefill Engine and a decode Engine on the same tiny model, each with its KVTransfer over its
own KV pool (shared/serving/kv_transfer.py), and a third, colocated Engine as the reference. Per prompt: decode
reserves pages (reserve_remote, skipping what its own prefix cache holds), the ticket's descriptors go through
the real wire format (descriptors -> descs_from_pb), prefill computes with hold_pages and writes its pages into
decode's, decode verifies checksums and activates. The valid token slots of decode's pages must equal the
colocated engine's pages (torch.equal; in bf16, where the CPU runs the native bf16 kernels, byte for byte), and
decode's continuation must equal the colocated output. Also for Mistral and Gemma 2 (sliding windows shorter than
the prompts, soft-capping) and the mixture-of-experts families (Qwen3-MoE, Mixtral, gpt-oss): their pages hold every
position, so the hand-off moves them as Llama's; and for DeepSeek-V3 (MLA), whose pages hold one latent row per
token and layer (an "mla" layout, no V half).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from shared.config.groups import CacheConfig, SchedulerConfig
from shared.engine.engine import Engine
from shared.engine.model_runner import ModelRunner
from shared.modelspec.sampling import SamplingParams
from shared.serving.handoff import descs_from_pb
from shared.serving.kv_transfer import KVTransfer
from shared.transfer.checksum import checksum_pages
from tests.helpers.tiny_mla import make_tiny_mla
from tests.helpers.tiny_models import make_tiny_model, tiny_llama_dir  # noqa: F401

P = 4  # small pages: every prompt spans several
NEW = 8
PARAMS = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)


def _bf16_runs() -> bool:
    from shared.kernels.native.build import native_available
    from shared.kernels.native.gemm import bf16_kernels

    return native_available()[0] and bf16_kernels()


DTYPES = ["float32", *(["bfloat16"] if _bf16_runs() else [])]


def make_engine(model_dir: Path, dtype: str = "float32") -> Engine:
    runner = ModelRunner(model_dir, dtype=dtype, num_pages=96, page_size=P, max_batch_tokens=64)
    return Engine(
        runner, cache=CacheConfig(page_size=P), scheduler=SchedulerConfig(max_running_requests=4, max_prefill_tokens=64)
    )


@dataclasses.dataclass
class Rig:
    backend: str
    pre: Engine
    dec: Engine
    colo: Engine
    t_pre: KVTransfer
    t_dec: KVTransfer


# Llama on every backend and dtype; the windowed / Gemma families (whose KV layout is Llama's) and DeepSeek-V3's latent
# pages on one of them
RIGS = [(b, d, "llama") for b in ("nixl", "mooncake") for d in DTYPES] + [
    ("nixl", "float32", f) for f in ("mistral", "gemma2", "qwen3_moe", "mixtral", "gpt_oss", "mla-v3", "mla-v3-moe")
]


@pytest.fixture(scope="module", params=RIGS, ids=lambda p: "-".join(p))
def rig(
    request: pytest.FixtureRequest, tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Rig]:
    backend, dtype, family = request.param
    model_dir = tiny_llama_dir
    if family.startswith("mla-"):
        model_dir = make_tiny_mla(tmp_path_factory.mktemp(family), family.removeprefix("mla-"))
    elif family != "llama":
        model_dir = make_tiny_model(tmp_path_factory.mktemp(family), family, hidden=72, heads=9, kv_heads=3)
    pre, dec, colo = (make_engine(model_dir, dtype) for _ in range(3))
    assert (pre.runner.layout.kind == "mla") == family.startswith("mla-")
    t_pre = KVTransfer(backend, f"inproc-prefill-{backend}", "127.0.0.1", pre.runner.kv)
    t_dec = KVTransfer(backend, f"inproc-decode-{backend}", "127.0.0.1", dec.runner.kv)
    try:
        yield Rig(backend, pre, dec, colo, t_pre, t_dec)
    finally:
        for t in (t_pre, t_dec):
            t.engine.close()


def run_held(engine: Engine, rid: str, prompt: list[int]) -> tuple[int, tuple[int, ...]]:
    """Prefill with pages held after the first token: (first token, page ids)."""
    engine.add_request(rid, prompt, dataclasses.replace(PARAMS, max_tokens=1), hold_pages=True)
    first = None
    while engine.has_work():
        for o in engine.step():
            if o.req_id == rid and o.finished:
                first = o.new_token_ids[0]
    assert first is not None
    return first, engine.held_pages(rid)


def token_slots(engine: Engine, page_ids: tuple[int, ...] | list[int], n: int) -> torch.Tensor:
    """KV of the first n positions: [n, num_layers, planes, kv_heads, head_dim] gathered from the pages (planes: K
    and V, or an mla layout's latent)."""
    pages = engine.runner.kv.buffer[list(page_ids)]  # [pages, layers, planes, P, kv_heads, head_dim]
    by_pos = pages.permute(0, 3, 1, 2, 4, 5).reshape(len(page_ids) * P, *pages.shape[1:3], *pages.shape[4:])
    return by_pos[:n]


def write_and_wait(rig: Rig, src: list[int], dst_pb, notify: bytes) -> None:  # type: ignore[no-untyped-def]
    """Prefill writes; decode progresses its side (NIXL without a progress thread needs both) until done and the
    completion notice arrives."""
    dst = descs_from_pb(dst_pb, rig.dec.runner.layout)
    peer = rig.t_pre.connect(rig.t_dec.peer_pb())
    handle = rig.t_pre.write_pages(peer, src, dst, notify)
    assert handle.nbytes == len(src) * rig.dec.runner.layout.page_bytes
    deadline = time.monotonic() + 20
    status, notes = "pending", []
    while time.monotonic() < deadline:
        status = rig.t_pre.engine.poll(handle)
        notes += rig.t_dec.engine.notifications()
        if status != "pending" and (rig.backend != "nixl" or notes):
            break
    assert status == "done", f"{rig.backend} write ended {status!r}"
    if rig.backend == "nixl":  # NIXL delivers the notify bytes with the write
        assert (rig.t_pre.engine.name, notify) in notes


def prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    shared = torch.randint(3, vocab, (13,), generator=g).tolist()
    lengths = [5, 4, 17, 30, 9, 41]
    out = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]
    out[3] = shared + out[3]  # later ones share 3 full pages with it: decode's own cache covers them
    out[5] = shared + out[5]
    return out


def test_received_pages_are_bit_identical_to_colocated_prefill(rig: Rig):
    pre, dec, colo = rig.pre, rig.dec, rig.colo
    skipped = 0
    for i, prompt in enumerate(prompts(dec.runner.vocab_size)):
        rid = f"{rig.backend}-{i}"
        n = len(prompt)
        res = dec.reserve_remote(rid, prompt, PARAMS)
        skip = res.skip_tokens // P
        skipped += skip
        ticket_pages = rig.t_dec.descriptors(res.page_ids[skip:])
        first, src = run_held(pre, rid, prompt)
        assert len(src) == len(res.page_ids) == -(-n // P)
        ref_first, ref_pages = run_held(colo, rid, prompt)
        assert first == ref_first
        reference = token_slots(colo, ref_pages, n)
        if skip < len(src):  # decode's fresh pages do not hold this KV yet: the comparison below can fail
            assert not torch.equal(token_slots(dec, res.page_ids, n), reference)
        write_and_wait(rig, list(src[skip:]), ticket_pages, f"{rid}:1".encode())
        # checksums: what prefill sent == what decode holds (the values both sides put in PrefillResponse)
        sent = rig.t_pre.checksum(src[skip:])
        assert rig.t_dec.checksum(res.page_ids[skip:]) == sent
        assert checksum_pages(dec.runner.kv.buffer, res.page_ids[skip:]) == sent
        # direct compare of every valid token slot, the pages decode skipped (its own cache) included
        got = token_slots(dec, res.page_ids, n)
        assert torch.equal(got, reference), f"prompt {i}: received KV differs from colocated prefill"
        bits = torch.int16 if got.dtype == torch.bfloat16 else torch.int32  # and byte for byte (bf16: not widened)
        assert torch.equal(got.view(bits), reference.view(bits))
        assert got.abs().sum() > 0
        pre.release_held(rid)
        colo.release_held(rid)
        # decode continues from the received KV exactly as the colocated engine does from its own
        toks = list(dec.activate_remote(rid, first)[0].new_token_ids)
        while dec.has_work():
            toks += [t for o in dec.step() if o.req_id == rid for t in o.new_token_ids]
        (ref,) = colo.generate([prompt], PARAMS, prefix=f"ref-{rid}")
        assert toks == list(ref.token_ids), f"prompt {i}: decode after hand-off diverged from colocated"
    assert skipped > 0, "decode's prefix cache was meant to cover some pages"
    for e in (pre, dec, colo):  # nothing held, reserved or leaked
        assert e.allocator.num_used == e.cache.num_pages == e.cache.num_evictable


def test_checksum_catches_a_corrupted_page(rig: Rig):
    dec = rig.dec
    ids = [1, 2, 3]
    before = rig.t_dec.checksum(ids)
    view = dec.runner.kv.buffer[2].view(-1)
    keep = view[5].clone()
    view[5] += 1.0
    try:
        assert rig.t_dec.checksum(ids) != before
    finally:
        view[5] = keep
    assert rig.t_dec.checksum(ids) == before
