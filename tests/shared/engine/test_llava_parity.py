"""LLaVA-style models (CLIP + Llama, SigLIP + Qwen2; odd head counts) against transformers'
LlavaForConditionalGeneration on tiny random checkpoints, with real images decoded from PNG / JPEG bytes:
preprocessing (pixel values), the vision tower + projector (image embeddings), logits <= 1e-4 with the embeddings
spliced in at the placeholder positions (whole prompt, chunk boundaries inside an image, batches mixing text-only
and image prompts), greedy tokens through the Engine, and the prefix cache keyed by media hash."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from PIL import Image

from shared.config.groups import CacheConfig, SchedulerConfig
from shared.engine.engine import Engine
from shared.engine.model_runner import ModelRunner
from shared.engine.request import MediaInput
from shared.engine.types import EmbedSlice, ScheduledSeq, SchedulerOutput
from shared.engine.vision_runner import VisionEncoderRunner
from shared.modelspec.block_hash import page_hashes
from shared.modelspec.sampling import SamplingParams
from tests.helpers.tiny_vlm import make_image, tiny_llava_dir  # noqa: F401

PAGE = 4
TOL = 1e-4


@pytest.fixture(scope="module")
def models(tiny_llava_dir: Path):
    from transformers import AutoImageProcessor, LlavaForConditionalGeneration

    hf = LlavaForConditionalGeneration.from_pretrained(tiny_llava_dir, dtype=torch.float32).eval()
    proc = AutoImageProcessor.from_pretrained(tiny_llava_dir)
    vision = VisionEncoderRunner(tiny_llava_dir)
    runner = ModelRunner(tiny_llava_dir, num_pages=256, page_size=PAGE)
    return hf, proc, vision, runner


def images(seed: int) -> list[Image.Image]:
    """A PNG and a JPEG of odd sizes, one of them grayscale (converted to RGB like transformers does)."""
    png = Image.open(io.BytesIO(make_image(seed, (45, 37), "PNG")))
    jpg = Image.open(io.BytesIO(make_image(seed + 100, (29, 61), "JPEG"))).convert("L")
    return [png, jpg]


def prompt_with(vision: VisionEncoderRunner, n_images: int, seed: int) -> tuple[list[int], list[int]]:
    """Token ids with n_images expanded placeholder runs between text tokens; returns (ids, image offsets)."""
    g = torch.Generator().manual_seed(seed)
    ids: list[int] = []
    offsets = []
    for _ in range(n_images):
        ids += torch.randint(3, 400, (3,), generator=g).tolist()
        offsets.append(len(ids))
        ids += [vision.image_token_id] * vision.num_image_tokens
    ids += torch.randint(3, 400, (5,), generator=g).tolist()
    return ids, offsets


def hf_logits(hf, ids: list[int], pixel_values: torch.Tensor | None) -> torch.Tensor:
    with torch.no_grad():
        return hf(input_ids=torch.tensor([ids]), pixel_values=pixel_values).logits[0].float()


def assert_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    diff = (ours - ref).abs().max().item()
    assert diff <= TOL, f"max abs diff {diff:.2e} > {TOL}"


def npages(n: int) -> int:
    return -(-n // PAGE)


def test_pixels_and_embeddings_match(models) -> None:
    hf, proc, vision, _ = models
    imgs = images(1)
    ref = proc(images=imgs, return_tensors="pt")["pixel_values"]
    pixels = [vision.image_spec.fit(im) for im in imgs]
    assert (vision.pixel_values(pixels) - ref).abs().max().item() <= 1e-6
    with torch.no_grad():
        ref_emb = hf.model.get_image_features(pixel_values=ref).pooler_output
    ours = vision.encode(pixels)
    assert len(ours) == 2 and ours[0].shape == (vision.num_image_tokens, vision.hidden_size)
    for a, b in zip(ours, ref_emb):
        assert (a - b).abs().max().item() <= 1e-5
    assert (ours[0] - ours[1]).abs().max().item() > 1e-2  # two images really differ


def test_logits_with_images_spliced(models) -> None:
    hf, proc, vision, runner = models
    imgs = images(2)
    px = proc(images=imgs, return_tensors="pt")["pixel_values"]
    emb = vision.encode([vision.image_spec.fit(im) for im in imgs])
    ids, offs = prompt_with(vision, 2, seed=3)
    text, _ = prompt_with(vision, 0, seed=4)
    ref = hf_logits(hf, ids, px)
    seqs = (
        ScheduledSeq("t", tuple(text), 0, tuple(range(npages(len(text)))), True),
        ScheduledSeq(
            "m",
            tuple(ids),
            0,
            tuple(range(20, 20 + npages(len(ids)))),
            True,
            tuple(EmbedSlice(o, e) for o, e in zip(offs, emb)),
        ),
    )
    logits = runner.forward(SchedulerOutput(seqs))
    assert_close(logits[0], hf_logits(hf, text, None)[-1])
    assert_close(logits[1], ref[-1])

    # chunked prefill with chunk ends inside both images: each chunk gets its slice of the embeddings
    pages = tuple(range(100, 100 + npages(len(ids))))
    start = 0
    cuts = [offs[0] + 5, offs[1] + 3, len(ids)]
    for end in cuts:
        sl = []
        for o, e in zip(offs, emb):
            lo, hi = max(o, start), min(o + len(e), end)
            if lo < hi:
                sl.append(EmbedSlice(lo - start, e[lo - o : hi - o]))
        seq = ScheduledSeq("c", tuple(ids[start:end]), start, pages[: npages(end)], True, tuple(sl))
        assert_close(runner.forward(SchedulerOutput((seq,)))[0], ref[end - 1])
        start = end


def test_greedy_tokens_and_media_keyed_prefix_cache(models) -> None:
    hf, proc, vision, runner = models
    imgs = images(5)
    pixels = [vision.image_spec.fit(im) for im in imgs]
    emb = vision.encode(pixels)
    ids, offs = prompt_with(vision, 1, seed=6)
    n = vision.num_image_tokens
    engine = Engine(runner, cache=CacheConfig(page_size=PAGE), scheduler=SchedulerConfig(max_running_requests=8))
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)

    def run(tag: str, k: int):
        mm = [MediaInput(offs[0], n, f"hash-{k}", emb[k])]
        return engine.generate([ids], greedy, prefix=tag, media=[mm])[0]

    def hf_greedy(k: int) -> list[int]:
        px = proc(images=[imgs[k]], return_tensors="pt")["pixel_values"]
        with torch.no_grad():
            out = hf.generate(
                input_ids=torch.tensor([ids]),
                pixel_values=px,
                max_new_tokens=8,
                do_sample=False,
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            )
        return out[0, len(ids) :].tolist()

    first = run("a", 0)
    assert list(first.token_ids) == hf_greedy(0)
    again = run("b", 0)  # same image, same prompt: every full page but the last comes from the cache
    assert again.num_cached_tokens >= (len(ids) - 1) // PAGE * PAGE - PAGE
    assert again.token_ids == first.token_ids
    other = run("c", 1)  # same placeholder tokens, another image: only the text pages before it may be reused
    assert other.num_cached_tokens <= offs[0] // PAGE * PAGE
    assert list(other.token_ids) == hf_greedy(1)
    assert other.token_ids != first.token_ids


def test_block_hashes_keep_images_apart() -> None:
    ids = [7] * 3 + [99] * 10 + [8] * 5
    plain = page_hashes(ids, PAGE)
    a = page_hashes(ids, PAGE, media=[(3, 10, "aaa")])
    b = page_hashes(ids, PAGE, media=[(3, 10, "bbb")])
    shifted = page_hashes(ids, PAGE, media=[(4, 9, "aaa")])
    assert len(a) == len(ids) // PAGE
    # page 0 holds positions 0..3: position 3 is the image's first placeholder, so already page 0 differs
    assert all(x != y for x, y in zip(a, b)) and all(x != y for x, y in zip(a, plain))
    assert a[0] != shifted[0]
    assert page_hashes(ids[:3] + [1], PAGE, media=[(4, 1, "x")][:0]) == page_hashes(ids[:3] + [1], PAGE)
