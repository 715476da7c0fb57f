"""DeepSeek-V2 / V3 (multi-head latent attention, dense layers) against transformers on tiny random checkpoints
(fp32, eager attention): max abs logit difference <= 1e-4 and identical greedy tokens, through the paged engine with
a latent KV cache (an "mla" KVLayout: one row of kv_lora_rank + qk_rope_head_dim per token and layer, no V).

Variants (tests/helpers/tiny_mla.py): V2 with q LoRA, V2-Lite without, V3 with interleaved yarn RoPE, V3 with NeoX
RoPE, and V2 / V3 with MoE layers (8 experts top-2 in 4 groups, 1 shared expert; V2 group_limited_greedy, V3
noaux_tc with a non-zero correction bias; transformers' experts in eager mode). Pages of 4 tokens, shorter than every
prompt but one; page ids scrambled."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shared.config.groups import CacheConfig, SchedulerConfig
from shared.engine.engine import Engine
from shared.engine.model_runner import ModelRunner
from shared.engine.types import ScheduledSeq, SchedulerOutput
from shared.modelspec.sampling import SamplingParams
from tests.helpers.paged_parity import Pages, Worst, hf_logits, prompt
from tests.helpers.tiny_mla import MLA_VARIANTS, make_tiny_mla

PAGE = 4
TOL = 1e-4
WORST = Worst(TOL)
_DIRS: dict[str, Path] = {}
_HF: dict[str, torch.nn.Module] = {}


def _dir(variant: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if variant not in _DIRS:
        _DIRS[variant] = make_tiny_mla(tmp_path_factory.mktemp("mla"), variant)
    return _DIRS[variant]


@pytest.fixture(scope="module", params=MLA_VARIANTS)
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelRunner, object]:
    """(our runner, HF's model in fp32 with eager attention) for one variant."""
    from transformers import AutoModelForCausalLM

    variant = request.param
    d = _dir(variant, tmp_path_factory)
    if variant not in _HF:
        extra = {"experts_implementation": "eager"} if variant.endswith("-moe") else {}
        _HF[variant] = AutoModelForCausalLM.from_pretrained(
            d, dtype=torch.float32, attn_implementation="eager", **extra
        ).eval()
    return ModelRunner(d, num_pages=96, page_size=PAGE), _HF[variant]


@pytest.fixture
def runner(case: tuple[ModelRunner, object]) -> ModelRunner:
    return case[0]


@pytest.fixture
def hf(case: tuple[ModelRunner, object]):
    return case[1]


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    WORST.print()


def npages(n: int) -> int:
    return -(-n // PAGE)


def check(runner: ModelRunner, ours: torch.Tensor, ref: torch.Tensor) -> None:
    WORST.check(runner.model_dir.name, ours, ref)


def test_the_cache_holds_the_latent(runner: ModelRunner) -> None:
    mla = runner.arch.mla
    assert mla is not None and runner.attn.name == "torch"
    lay = runner.layout
    assert (
        (lay.kind, lay.num_kv_heads, lay.head_dim)
        == ("mla", 1, mla.kv_lora_rank + mla.qk_rope_head_dim)
        == (
            "mla",
            1,
            20,
        )
    )
    # layers x page_size x (kv_lora_rank + qk_rope_head_dim) x 4 bytes: no V half
    layers = runner.arch.num_layers
    assert lay.page_bytes == runner.kv.bytes_per_page == layers * PAGE * (16 + 4) * 4 == layers * 320
    assert runner.kv.nbytes == runner.kv.num_pages * layers * 320
    assert runner.kv.page_view(0).shape == (layers, 1, PAGE, 1, 20)
    with pytest.raises(ValueError, match="latent rows only"):
        runner.kv.v(0)


def test_mixed_lengths_in_one_forward(runner: ModelRunner, hf) -> None:
    pages = Pages(runner.num_pages)
    prompts = [prompt(i, n, runner.vocab_size) for i, n in enumerate([1, 5, 8, 13, 30])]
    seqs = tuple(ScheduledSeq(f"r{i}", tuple(p), 0, pages.take(npages(len(p))), True) for i, p in enumerate(prompts))
    logits = runner.forward(SchedulerOutput(seqs))
    for i, p in enumerate(prompts):
        check(runner, logits[i], hf_logits(hf, p)[-1])


def test_chunked_prefill_and_prefix_hit(runner: ModelRunner, hf) -> None:
    """Chunks starting mid-page read the previous chunks' latent rows; a second prompt reuses 3 cached pages."""
    pages = Pages(runner.num_pages)
    p = prompt(11, 23, runner.vocab_size)
    ref = hf_logits(hf, p)
    ids = pages.take(npages(len(p)))
    start = 0
    for n in (6, 9, 8):
        end = start + n
        logits = runner.forward(
            SchedulerOutput((ScheduledSeq("c", tuple(p[start:end]), start, ids[: npages(end)], True),))
        )
        check(runner, logits[0], ref[end - 1])
        start = end
    b = p[:12] + prompt(12, 9, runner.vocab_size)
    b_pages = ids[:3] + pages.take(npages(len(b)) - 3)
    logits = runner.forward(SchedulerOutput((ScheduledSeq("b", tuple(b[12:]), 12, b_pages, True),)))
    check(runner, logits[0], hf_logits(hf, b)[-1])


def test_prefill_then_decode_steps(runner: ModelRunner, hf) -> None:
    """A batch of three prompts of different lengths, then 10 decode steps; greedy tokens fed back."""
    pages = Pages(runner.num_pages)
    seqs = {f"d{i}": prompt(30 + i, n, runner.vocab_size) for i, n in enumerate([2, 9, 16])}
    steps = 10
    room = {r: pages.take(npages(len(p) + steps + 1)) for r, p in seqs.items()}
    logits = runner.forward(
        SchedulerOutput(tuple(ScheduledSeq(r, tuple(p), 0, room[r], True) for r, p in seqs.items()))
    )
    for _ in range(steps):
        for i, p in enumerate(seqs.values()):
            check(runner, logits[i], hf_logits(hf, p)[-1])
            p.append(int(logits[i].argmax()))
        out = SchedulerOutput(tuple(ScheduledSeq(r, (p[-1],), len(p) - 1, room[r], True) for r, p in seqs.items()))
        assert out.is_decode_only
        logits = runner.forward(out)
    for i, p in enumerate(seqs.values()):
        check(runner, logits[i], hf_logits(hf, p)[-1])


def test_decode_and_prefill_in_one_step(runner: ModelRunner, hf) -> None:
    pages = Pages(runner.num_pages)
    a = prompt(41, 10, runner.vocab_size)
    a_pages = pages.take(4)
    first = runner.forward(SchedulerOutput((ScheduledSeq("a", tuple(a), 0, a_pages, True),)))
    a.append(int(first[0].argmax()))
    b = prompt(42, 11, runner.vocab_size)
    out = SchedulerOutput(
        (ScheduledSeq("b", tuple(b), 0, pages.take(3), True), ScheduledSeq("a", (a[-1],), len(a) - 1, a_pages, True))
    )
    logits = runner.forward(out)
    check(runner, logits[0], hf_logits(hf, b)[-1])
    check(runner, logits[1], hf_logits(hf, a)[-1])


def test_engine_greedy_matches_hf_generate(runner: ModelRunner, hf) -> None:
    """The whole engine (continuous batch, chunked prefill, prefix cache): greedy tokens identical to HF generate."""
    from transformers import GenerationConfig

    g = torch.Generator().manual_seed(7)
    shared = torch.randint(3, runner.vocab_size, (8,), generator=g).tolist()
    prompts = [
        shared[: 8 * (i % 2)] + torch.randint(3, runner.vocab_size, (n,), generator=g).tolist()
        for i, n in enumerate([3, 11, 17, 7])
    ]
    new = 16
    gen = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0)
    hf.generation_config.eos_token_id = None
    ref = []
    for p in prompts:
        with torch.no_grad():
            ref.append(hf.generate(torch.tensor([p]), generation_config=gen)[0, len(p) :].tolist())
    engine = Engine(
        runner,
        cache=CacheConfig(page_size=PAGE, disable_radix_cache=False),
        scheduler=SchedulerConfig(max_running_requests=4, chunked_prefill_size=8, max_prefill_tokens=16),
    )
    got = engine.generate(prompts, SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True))
    for i, (c, toks) in enumerate(zip(got, ref, strict=True)):
        assert list(c.token_ids) == toks, f"prompt {i} (len {len(prompts[i])}) diverged from HF"


def test_decode_steps_attend_in_the_latent_space(runner: ModelRunner, hf, monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode-only step takes weight absorption (no per-token decompression), and gives the reference's logits."""
    import shared.engine.models.deepseek as ds

    calls: list[int] = []
    real = ds.mla_attention_absorbed
    monkeypatch.setattr(ds, "mla_attention_absorbed", lambda *a: calls.append(1) or real(*a))
    pages = Pages(runner.num_pages)
    seqs = {f"x{i}": prompt(70 + i, n, runner.vocab_size) for i, n in enumerate([3, 14])}
    room = {r: pages.take(npages(len(p) + 2)) for r, p in seqs.items()}
    logits = runner.forward(
        SchedulerOutput(tuple(ScheduledSeq(r, tuple(p), 0, room[r], True) for r, p in seqs.items()))
    )
    assert not calls  # a prefill step: the reference
    for i, p in enumerate(seqs.values()):
        p.append(int(logits[i].argmax()))
    step = SchedulerOutput(tuple(ScheduledSeq(r, (p[-1],), len(p) - 1, room[r], True) for r, p in seqs.items()))
    absorbed = runner.forward(step)
    assert len(calls) == runner.arch.num_layers
    monkeypatch.setattr(runner.model, "absorb_decode", False)
    reference = runner.forward(step)  # the same step again: the same latent rows rewritten, then the reference
    assert len(calls) == runner.arch.num_layers
    assert (absorbed - reference).abs().max().item() <= 1e-5
    for i, p in enumerate(seqs.values()):
        check(runner, absorbed[i], hf_logits(hf, p)[-1])


@pytest.mark.parametrize("variant", ["v2", "v3", "v3-moe"])
def test_bfloat16_runs_and_tracks_float32(variant: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """bf16 weights and bf16 latent pages (a prefill, then a decode step in the latent space)."""
    d = _dir(variant, tmp_path_factory)
    r32 = ModelRunner(d, num_pages=16, page_size=PAGE)
    r16 = ModelRunner(d, dtype="bfloat16", num_pages=16, page_size=PAGE)
    assert r16.layout.kind == "mla" and r16.layout.page_bytes * 2 == r32.layout.page_bytes
    p = prompt(51, 13, r32.vocab_size)
    for out in (
        SchedulerOutput((ScheduledSeq("x", tuple(p), 0, (0, 1, 2, 3), True),)),
        SchedulerOutput((ScheduledSeq("x", (p[-1],), len(p), (0, 1, 2, 3), True),)),
    ):
        l32, l16 = r32.forward(out), r16.forward(out)
        assert l16.dtype == torch.float32 and not l16.isnan().any()
        assert (l16 - l32).abs().max().item() < 0.15  # bf16 keeps ~3 significant digits
