"""A vision-language model through the whole cluster: etcd + NATS + gateway + a colocated worker, then gateway +
two encoders + prefill + decode (EPD: embeddings and KV over NIXL), all real processes on a tiny random LLaVA
(CLIP + Llama).

Checked: a chat request with PNG / JPEG images gives exactly the greedy tokens of transformers'
LlavaForConditionalGeneration on the same images; the same images again reuse the prompt KV (cached tokens) and
the encoder cache, and answer the same; another image with the same text answers as transformers does for it (no
page shared); with every encoder dead, prefill's own tower answers, as correctly.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import torch
from PIL import Image

from shared.cluster.localcluster.servers import stop_process
from shared.cluster.localcluster.service_process import ServiceProcess, wait_all_ready
from tests.e2e.test_gateway_cluster import _spawn
from tests.helpers.servers import start_etcd, start_nats
from tests.helpers.tiny_vlm import make_image, make_tiny_llava

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CLUSTER = "vlmtest"
# (prefill + decode without encoders is the EPD topology after its encoders died: the last test there)
TOPOLOGIES = {"colocated": (("worker", 1),), "epd": (("encoder", 2), ("prefill", 1), ("decode", 1))}


@dataclass
class Gateway:
    url: str
    topology: str
    encoders: list[ServiceProcess]


MAX_TOKENS = 8


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llava(tmp_path_factory.mktemp("vlm-models"), "clip-llama")


@pytest.fixture(scope="module", params=list(TOPOLOGIES))
def gateway_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, model_dir: Path
) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp(f"vlm-{request.param}")
    etcd, nats = start_etcd(tmp), start_nats(tmp)
    common = [
        "--etcd-endpoints",
        etcd.url,
        "--nats-url",
        nats.url,
        "--cluster",
        CLUSTER,
        "--lease-ttl-s",
        "2",
        "--model",
        str(model_dir),
    ]
    procs: list[ServiceProcess] = []
    try:
        for role, count in TOPOLOGIES[request.param]:
            for i in range(1, count + 1):
                args = [*common, "--instance-id", f"{role}-{i}", "--threads", "1"]
                if role == "encoder":
                    args += ["--encoder-model", "none", "--metrics-port", "0"]
                else:
                    args += ["--num-pages", "512", "--load-report-interval-s", "0.05"]
                if role in ("prefill", "decode"):
                    args += ["--transfer-backend", "nixl", "--local-prefill-threshold", "0"]
                procs.append(_spawn(f"{role}-{i}", f"services.{role}", args, tmp))
        gateway = _spawn("gateway-1", "services.gateway", [*common, "--instance-id", "gateway-1", "--port", "0"], tmp)
        procs.append(gateway)
        wait_all_ready(procs, 120.0)
        assert gateway.ready is not None
        yield Gateway(f"http://{gateway.ready.http}", request.param, [p for p in procs if p.name.startswith("encoder")])
    finally:
        for p in procs:
            stop_process(p.proc)
        etcd.stop()
        nats.stop()


@pytest.fixture(scope="module")
def hf(model_dir: Path):  # -> (model, image processor, tokenizer)
    from transformers import (
        AutoImageProcessor,
        AutoTokenizer,
        LlavaForConditionalGeneration,
    )

    return (
        LlavaForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval(),
        AutoImageProcessor.from_pretrained(model_dir),
        AutoTokenizer.from_pretrained(model_dir),
    )


def hf_greedy(hf, images: list[bytes], text: str) -> str:  # type: ignore[no-untyped-def]
    model, proc, tok = hf
    content = "\n".join(["<image>"] * len(images) + [text])  # what the gateway makes of [image parts..., text]
    templated = tok.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )
    ids = tok.encode(templated, add_special_tokens=False)
    image_id = model.config.image_token_id
    n = model.config.image_seq_length
    expanded = [t for i in ids for t in ([i] * n if i == image_id else [i])]
    px = proc(images=[Image.open(io.BytesIO(b)) for b in images], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor([expanded]),
            pixel_values=px,
            max_new_tokens=MAX_TOKENS,
            do_sample=False,
            attention_mask=torch.ones(1, len(expanded), dtype=torch.long),
        )
    return tok.decode(out[0, len(expanded) :].tolist(), skip_special_tokens=True)


async def ask(url: str, images: list[tuple[bytes, str]], text: str) -> dict:
    parts = [
        {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{base64.b64encode(b).decode()}"}}
        for b, mime in images
    ]
    body = {
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}],
    }
    async with httpx.AsyncClient(timeout=60.0) as c:
        r = await c.post(f"{url}/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _metric(text: str, name: str) -> float:
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.split(" ")[0].split("{")[0] in (name, name + "_total")
    )


async def encoder_cache(gw: Gateway) -> list[tuple[float, float]]:
    """(queries, hits) of each encoder's cache, from its /metrics."""
    out = []
    async with httpx.AsyncClient(timeout=10.0) as c:
        for p in gw.encoders:
            assert p.ready is not None and p.ready.metrics
            text = (await c.get(f"http://{p.ready.metrics}/metrics")).text
            out.append((_metric(text, "pdrelay:encoder_cache_queries"), _metric(text, "pdrelay:encoder_cache_hits")))
    return out


async def test_greedy_matches_transformers_and_images_key_the_cache(gateway_url: Gateway, hf) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_url
    png, jpg, other = make_image(11), make_image(12, (40, 64), "JPEG"), make_image(13)
    text = "Describe the picture."
    first = await ask(gw.url, [(png, "image/png"), (jpg, "image/jpeg")], text)
    assert first["choices"][0]["message"]["content"] == hf_greedy(hf, [png, jpg], text)

    again = await ask(gw.url, [(png, "image/png"), (jpg, "image/jpeg")], text)
    assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
    prompt_tokens = first["usage"]["prompt_tokens"]
    assert prompt_tokens > 32
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= prompt_tokens - 32  # all but a page or two

    swapped = await ask(gw.url, [(other, "image/png"), (jpg, "image/jpeg")], text)
    assert swapped["choices"][0]["message"]["content"] == hf_greedy(hf, [other, jpg], text)
    # the text before the first image may come from the cache, nothing after it
    assert swapped["usage"]["prompt_tokens_details"]["cached_tokens"] < 16
    if gw.topology == "epd":  # the encoders embedded every image: 2 + 2 + 2 lookups, the repeated ones hits
        counts = await encoder_cache(gw)
        assert sum(q for q, _ in counts) == 6, counts
        assert sum(h for _, h in counts) == 3, counts  # png and jpg again, then jpg


async def test_epd_survives_dead_encoders(gateway_url: Gateway, hf) -> None:  # type: ignore[no-untyped-def]
    if gateway_url.topology != "epd":
        pytest.skip("EPD topology only")
    for p in gateway_url.encoders:  # every encoder gone: prefill's own tower answers, just as correctly
        p.proc.kill()
        p.proc.wait()
    png = make_image(21)
    r = await ask(gateway_url.url, [(png, "image/png")], "And this one?")
    assert r["choices"][0]["message"]["content"] == hf_greedy(hf, [png], "And this one?")


async def test_text_only_requests_still_work(gateway_url: Gateway) -> None:
    async with httpx.AsyncClient(timeout=60.0) as c:
        r = await c.post(
            f"{gateway_url.url}/v1/chat/completions",
            json={"max_tokens": 4, "messages": [{"role": "user", "content": "Hello there"}]},
        )
    assert r.status_code == 200, r.text
