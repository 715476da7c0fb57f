"""Qwen3-MoE, Mixtral and gpt-oss against transformers on tiny random checkpoints (fp32, max abs logit diff <= 1e-4,
greedy tokens identical): 8 experts top-2, 9 query heads over 3 KV heads, an expert size that is not a multiple of
8; Qwen3-MoE with q/k norm, a dense last layer (mlp_only_layers) and norm_topk_prob off; Mixtral (always
renormalised) with a sliding window shorter than the prompts; gpt-oss with yarn RoPE, windowed and full layers in
turn, attention sinks, q/k/v/o, router and expert biases and a SwiGLU clamp that bites. Each on the torch reference
kernels and on the CPU default (native); gpt-oss also on the Triton backend and its norm / RoPE kernels (under the
interpreter here: its sink layers take the torch window path there too).

HF runs its eager experts (a loop over experts) and eager attention, recomputing each whole sequence: an
independent reference for the grouped GEMMs and the paged cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shared.config.groups import CacheConfig, SchedulerConfig
from shared.engine.engine import Engine
from shared.engine.model_runner import ModelRunner
from shared.engine.models.moe_model import MoeDecoderLayer
from shared.engine.types import ScheduledSeq, SchedulerOutput
from shared.modelspec.sampling import SamplingParams
from tests.helpers.paged_parity import Pages, Worst, hf_logits, prompt
from tests.helpers.tiny_models import MOE_FAMILIES, WINDOW, make_tiny_model

PAGE = 4
TOL = 1e-4
WORST = Worst(TOL)  # the largest difference per (family, backend), printed at the end (pytest -s)
CASES = [(f, b) for f in MOE_FAMILIES for b in ("torch", "native")] + [("gpt_oss", "triton")]
_DIRS: dict[str, Path] = {}
_HF: dict[str, torch.nn.Module] = {}


def _family_dir(family: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if family not in _DIRS:
        _DIRS[family] = make_tiny_model(tmp_path_factory.mktemp("moe"), family, hidden=72, heads=9, kv_heads=3)
    return _DIRS[family]


def load_hf(model_dir: Path) -> torch.nn.Module:
    """transformers' model in fp32 with eager attention and eager experts (its grouped_mm path needs 16-byte
    aligned sizes, which the test's expert size is not on purpose)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    ).eval()


@pytest.fixture(scope="module", params=CASES, ids=lambda c: "-".join(c))
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelRunner, object]:
    family, backend = request.param
    d = _family_dir(family, tmp_path_factory)
    if family not in _HF:
        _HF[family] = load_hf(d)
    r = ModelRunner(d, num_pages=160, page_size=PAGE, attention_backend=backend)
    assert r.attn.name == backend
    return r, _HF[family]


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
    WORST.check(f"{runner.model_dir.name} [{runner.attn.name}]", ours, ref)


def test_config_has_the_moe_features(runner: ModelRunner) -> None:
    a = runner.arch
    assert a.num_experts == 8 and a.experts_per_token == 2 and a.moe_intermediate_size == 38
    assert a.num_heads == 9 and a.num_kv_heads == 3
    layers = [layer for layer in runner.model.layers if isinstance(layer, MoeDecoderLayer)]
    assert len(layers) == 2
    if a.model_type == "qwen3_moe":
        assert a.moe_layers == (0,) and not a.norm_topk_prob and a.qk_norm and not any(a.layer_windows)
        assert layers[0].moe is not None and layers[1].moe is None  # mlp_only_layers: a dense last layer
    elif a.model_type == "mixtral":
        assert a.moe_layers == (0, 1) and a.norm_topk_prob and a.layer_windows == (WINDOW, WINDOW)
    else:
        assert a.moe_layers == (0, 1) and a.moe_kind == "gpt_oss" and a.layer_windows == (WINDOW, 0)
        assert a.attn_sinks and a.qkv_bias and a.o_bias and a.swiglu_limit == 0.5 and a.swiglu_alpha == 1.702
        assert a.rope_scaling is not None and a.rope_scaling["rope_type"] == "yarn"
        sinks = layers[0].sinks
        assert sinks is not None and sinks.abs().max().item() > 0.5  # large enough to move the softmax
    assert runner.model.fused_decode is None  # the one-call native decode has no experts


def test_mixed_lengths_in_one_forward(runner: ModelRunner, hf) -> None:
    pages = Pages(runner.num_pages)
    prompts = [prompt(i, n, runner.vocab_size) for i, n in enumerate([1, 5, 8, 13, 30])]
    seqs = tuple(ScheduledSeq(f"r{i}", tuple(p), 0, pages.take(npages(len(p))), True) for i, p in enumerate(prompts))
    logits = runner.forward(SchedulerOutput(seqs))
    for i, p in enumerate(prompts):
        check(runner, logits[i], hf_logits(hf, p)[-1])


def test_decode_steps_in_a_batch(runner: ModelRunner, hf) -> None:
    """Prefill three prompts of different lengths together, then decode them together (3 routed tokens a step:
    most experts have no rows)."""
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


def test_chunked_prefill_and_prefix_hit(runner: ModelRunner, hf) -> None:
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
    b = p[:12] + prompt(12, 9, runner.vocab_size)  # shares 3 pages with p: computes only its own tail
    b_pages = ids[:3] + pages.take(npages(len(b)) - 3)
    logits = runner.forward(SchedulerOutput((ScheduledSeq("b", tuple(b[12:]), 12, b_pages, True),)))
    check(runner, logits[0], hf_logits(hf, b)[-1])


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


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_bfloat16_runs_and_tracks_float32(family: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    d = _family_dir(family, tmp_path_factory)
    r32 = ModelRunner(d, num_pages=16, page_size=PAGE)
    r16 = ModelRunner(d, dtype="bfloat16", num_pages=16, page_size=PAGE)
    p = prompt(51, 13, r32.vocab_size)
    out = SchedulerOutput((ScheduledSeq("x", tuple(p), 0, (0, 1, 2, 3), True),))
    l32, l16 = r32.forward(out), r16.forward(out)
    assert l16.dtype == torch.float32 and not l16.isnan().any()
    assert (l16 - l32).abs().max().item() < 0.15  # bf16 keeps ~3 significant digits


def test_refused_with_quantization(tmp_path_factory: pytest.TempPathFactory) -> None:
    d = _family_dir("mixtral", tmp_path_factory)
    with pytest.raises(ValueError, match=r"--quantization fp8: mixture-of-experts models \(MixtralForCausalLM\)"):
        ModelRunner(d, num_pages=16, page_size=PAGE, quantization="fp8")


def test_refused_at_tensor_parallel(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The stacked experts are not split per rank: --tp-size > 1 is refused in one line naming the flag, before
    any rank process starts."""
    from shared.config.groups import DeviceConfig, ModelConfig, ParallelConfig
    from shared.engine.parallel import ranks

    started: list[object] = []
    d = _family_dir("qwen3_moe", tmp_path_factory)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ranks.RankProcesses, "__init__", lambda self, args: started.append(args))
        with pytest.raises(ValueError, match=r"^--tp-size 2: mixture-of-experts models \(Qwen3MoeForCausalLM\) run"):
            Engine.from_groups(
                model=ModelConfig(model=str(d)),
                cache=CacheConfig(num_pages=16, page_size=PAGE),
                scheduler=SchedulerConfig(),
                device=DeviceConfig(device="cpu", threads=2),
                parallel=ParallelConfig(tp_size=2),
            )
    assert started == []


def test_gpt_oss_sinks_and_clamp_change_the_logits(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The parity above would not catch a sink or a clamp that does nothing if they changed nothing: each, undone,
    moves the logits well past the tolerance."""
    d = _family_dir("gpt_oss", tmp_path_factory)
    r = ModelRunner(d, num_pages=16, page_size=PAGE, attention_backend="torch")
    p = prompt(61, 13, r.vocab_size)
    out = SchedulerOutput((ScheduledSeq("x", tuple(p), 0, (0, 1, 2, 3), True),))
    base = r.forward(out)
    layers = [layer for layer in r.model.layers if isinstance(layer, MoeDecoderLayer)]
    sinks = [layer.sinks for layer in layers]
    for layer in layers:
        layer.sinks = None
    assert (r.forward(out) - base).abs().max().item() > 100 * TOL
    for layer, s in zip(layers, sinks, strict=True):
        layer.sinks = s
    for layer in layers:
        assert layer.moe is not None
        layer.moe.limit = 1e9
    assert (r.forward(out) - base).abs().max().item() > 100 * TOL
