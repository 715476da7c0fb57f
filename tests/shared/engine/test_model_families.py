"""The families beyond Llama/Qwen against transformers on tiny random checkpoints (fp32, max abs logit diff <= 1e-4,
greedy tokens identical): Mistral and Qwen2 with a sliding window, Phi-3 (fused checkpoint tensors, partial RoPE,
a window), Gemma 2 (alternating local/global layers, attention and final soft-capping, pre/post norms, GeGLU) and
Gemma 3 (q/k norm, local and global RoPE bases, linear scaling on global layers).

Every checkpoint has a window (6 tokens) shorter than the prompts and not page-aligned, 9 query heads over 3 KV
heads, and is run with the torch reference kernels and the CPU default (native attention, whose windowed layers take
the torch path); Phi-3 and Gemma 3 also with the Triton backend and its norm / RoPE / activation kernels (under the
interpreter here). HF (eager attention) recomputes each whole sequence, an independent reference; the decode test
runs well past the window."""

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
from tests.helpers.tiny_models import FAMILIES, WINDOW, make_tiny_model

PAGE = 4
TOL = 1e-4
# Triton's own ops meet new inputs in these two: partial RoPE (Phi-3), Gemma's four norms and q/k norm (Gemma 3)
TRITON_FAMILIES = ("phi3", "gemma3")
# the largest difference seen per (family, backend), printed at the end of the module (pytest -s) for the record
WORST = Worst(TOL)


# (family, attention backend): every family on the reference and the CPU default, two of them on Triton
CASES = [(f, b) for f in FAMILIES for b in ("torch", "native")] + [(f, "triton") for f in TRITON_FAMILIES]
_DIRS: dict[str, Path] = {}
_HF: dict[str, torch.nn.Module] = {}


def _family_dir(family: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if family not in _DIRS:
        _DIRS[family] = make_tiny_model(tmp_path_factory.mktemp("families"), family, hidden=72, heads=9, kv_heads=3)
    return _DIRS[family]


@pytest.fixture(scope="module", params=FAMILIES)
def family_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _family_dir(request.param, tmp_path_factory)


@pytest.fixture(scope="module", params=CASES, ids=lambda c: "-".join(c))
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelRunner, object]:
    """(our runner, HF's model in fp32 with eager attention) for one (family, backend)."""
    from transformers import AutoModelForCausalLM

    family, backend = request.param
    d = _family_dir(family, tmp_path_factory)
    if family not in _HF:
        _HF[family] = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
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


def test_config_has_the_family_features(runner: ModelRunner) -> None:
    arch = runner.arch
    assert WINDOW in arch.layer_windows and arch.num_kv_heads == 3 and arch.num_heads == 9
    if arch.model_type == "phi3":
        assert arch.rotary_dim == arch.head_dim // 2
    if arch.model_type == "gemma2":
        assert arch.attn_softcap == 2.0 and arch.final_softcap == 3.0 and arch.layer_windows == (WINDOW, 0)
    if arch.model_type == "gemma3_text":
        assert arch.local_rope_theta == 10000.0 and arch.rope_scaling is not None and arch.qk_norm


def test_mixed_lengths_in_one_forward(runner: ModelRunner, hf) -> None:
    pages = Pages(runner.num_pages)
    prompts = [prompt(i, n, runner.vocab_size) for i, n in enumerate([1, 5, 8, 13, 30])]
    seqs = tuple(ScheduledSeq(f"r{i}", tuple(p), 0, pages.take(npages(len(p))), True) for i, p in enumerate(prompts))
    logits = runner.forward(SchedulerOutput(seqs))
    for i, p in enumerate(prompts):
        check(runner, logits[i], hf_logits(hf, p)[-1])


def test_prompts_within_the_window(runner: ModelRunner, hf, monkeypatch: pytest.MonkeyPatch) -> None:
    """No sequence longer than the window: windowed layers run the backend's own kernels (needs_window_path), and a
    decode step on the CPU default all layers in one C call, until a sequence passes the window."""
    fused = runner.model.fused_decode
    calls: list[int] = []
    if fused is not None:
        monkeypatch.setattr(fused, "run", lambda *a, run=fused.run: calls.append(1) or run(*a))
    pages = Pages(runner.num_pages)
    prompts = [prompt(60 + i, n, runner.vocab_size) for i, n in enumerate([1, 3, WINDOW - 1])]
    room = [pages.take(npages(WINDOW + 2)) for _ in prompts]
    logits = runner.forward(
        SchedulerOutput(tuple(ScheduledSeq(f"w{i}", tuple(p), 0, room[i], True) for i, p in enumerate(prompts)))
    )
    for step in range(2):  # the longest reaches WINDOW, then WINDOW + 1 tokens
        for i, p in enumerate(prompts):
            check(runner, logits[i], hf_logits(hf, p)[-1])
            p.append(int(logits[i].argmax()))
        out = SchedulerOutput(
            tuple(ScheduledSeq(f"w{i}", (p[-1],), len(p) - 1, room[i], True) for i, p in enumerate(prompts))
        )
        logits = runner.forward(out)
        assert len(calls) == (1 if fused is not None else 0)  # step 2 passes the window: the layers one by one
    for i, p in enumerate(prompts):
        check(runner, logits[i], hf_logits(hf, p)[-1])
    # the one-call decode is built for windowed models on the CPU default (not with partial RoPE or soft-capping)
    a = runner.arch
    assert (fused is not None) == (
        runner.attn.name == "native"
        and not (a.rotary_dim or a.attn_softcap or a.qk_norm)
        and a.model_type not in ("gemma2", "gemma3_text")
    )


def test_chunked_prefill_and_prefix_hit(runner: ModelRunner, hf) -> None:
    """Chunks that start mid-window and mid-page: each chunk's first tokens see keys of the previous chunk only."""
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
    # a second prompt sharing the first 12 tokens (3 pages) computes only its own tail
    b = p[:12] + prompt(12, 9, runner.vocab_size)
    b_pages = ids[:3] + pages.take(npages(len(b)) - 3)
    logits = runner.forward(SchedulerOutput((ScheduledSeq("b", tuple(b[12:]), 12, b_pages, True),)))
    check(runner, logits[0], hf_logits(hf, b)[-1])


def test_decode_steps_past_the_window(runner: ModelRunner, hf) -> None:
    pages = Pages(runner.num_pages)
    seqs = {f"d{i}": prompt(30 + i, n, runner.vocab_size) for i, n in enumerate([2, 9, 16])}
    steps = 14  # the 2-token prompt ends 16 tokens long: well past the window of 6
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
    new = 20
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


def test_bfloat16_runs_and_tracks_float32(family_dir: Path) -> None:
    r32 = ModelRunner(family_dir, num_pages=16, page_size=PAGE)
    r16 = ModelRunner(family_dir, dtype="bfloat16", num_pages=16, page_size=PAGE)
    p = prompt(51, 13, r32.vocab_size)
    out = SchedulerOutput((ScheduledSeq("x", tuple(p), 0, (0, 1, 2, 3), True),))
    l32, l16 = r32.forward(out), r16.forward(out)
    assert l16.dtype == torch.float32 and not l16.isnan().any()
    assert (l16 - l32).abs().max().item() < 0.15  # bf16 keeps ~3 significant digits
