"""The bundled SmolLM2-135M disaggregated, per backend: one chat request through decode + prefill returns the same
greedy tokens as the colocated worker and HF generate (30 layers, 3 KV heads: a real layout over the wire)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.services.disagg.disagg_client import generate
from tests.services.disagg.disagg_procs import BACKENDS, Servers, ServiceProc, Spec, start_services, stop_services

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NEW = 24


@pytest.fixture(scope="module")
def bundled(servers: Servers, bundled_model_dir: Path) -> Iterator[dict[str, ServiceProc]]:
    pages = ("--num-pages", "64")
    specs = [Spec("worker", "w-bundled", "bundled-colo", pages)]
    for b in BACKENDS:
        specs += [
            Spec("prefill", f"p-bundled-{b}", f"bundled-{b}", ("--transfer-backend", b, *pages)),
            Spec("decode", f"d-bundled-{b}", f"bundled-{b}", ("--transfer-backend", b, *pages)),
        ]
    procs = start_services(servers.tmp, servers.etcd, servers.nats, bundled_model_dir, specs)
    try:
        yield procs
    finally:
        stop_services(procs.values())


@pytest.fixture(scope="module")
def chat(bundled_model_dir: Path) -> tuple[list[int], list[int], object]:
    """(prompt ids, HF greedy continuation ignoring EOS, tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(bundled_model_dir)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, tokenize=True
    )
    prompt = list(ids["input_ids"]) if not isinstance(ids, list) else ids
    hf = AutoModelForCausalLM.from_pretrained(bundled_model_dir, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    cfg = GenerationConfig(max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), generation_config=cfg)[0, len(prompt) :].tolist()
    return prompt, ref, tok


@pytest.mark.parametrize("backend", BACKENDS)
async def test_bundled_model_disaggregated_equals_colocated_and_hf(
    bundled: dict[str, ServiceProc], backend: str, chat: tuple[list[int], list[int], object]
):
    prompt, ref, tok = chat
    prefill, decode = bundled[f"p-bundled-{backend}"], bundled[f"d-bundled-{backend}"]
    colo = await generate(bundled["w-bundled"].grpc, f"colo-{backend}", prompt, max_tokens=NEW)
    pd = await generate(decode.grpc, f"pd-{backend}", prompt, prefill=prefill.target(), max_tokens=NEW)
    assert colo.tokens == ref
    assert pd.tokens == ref, f"{tok.decode(pd.tokens)!r} vs {tok.decode(ref)!r}"  # type: ignore[attr-defined]
    assert pd.prefill_instance_id == prefill.instance_id and pd.timings is not None and pd.timings.transfer_s > 0
    assert "Paris" in tok.decode(pd.tokens)  # type: ignore[attr-defined]
