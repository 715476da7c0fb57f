"""Can a model directory be served? The config.json checks the engine makes at start, and the checkpoint's tensor
names and shapes against the model built from it, read from the safetensors headers (no weights are loaded and
no memory is allocated: the model is built on the meta device)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from shared.engine.models.config import ModelArchConfig, load_model_config
from shared.engine.weights import IGNORED_SUFFIXES, checkpoint_files


@dataclass(frozen=True)
class ModelCheck:
    ok: bool
    reason: str  # why not, or what will be served
    arch: ModelArchConfig | None = None


def _describe(cfg: ModelArchConfig) -> str:
    windows = sorted({w for w in cfg.layer_windows if w})
    parts = [f"{cfg.architecture} ({cfg.model_type}): {cfg.num_layers} layers, {cfg.num_heads} heads"]
    if cfg.mla is not None:  # the cache holds one latent row per token, not KV heads
        m = cfg.mla
        parts.append(
            f"MLA: kv_lora_rank {m.kv_lora_rank} + qk_rope_head_dim {m.qk_rope_head_dim} cached per token, "
            f"q_lora_rank {m.q_lora_rank or 'none'}, qk_nope_head_dim {m.qk_nope_head_dim}, v_head_dim {m.v_head_dim}"
        )
        if m.yarn is not None:
            parts.append("rope yarn")
    else:
        parts.append(f"{cfg.num_kv_heads} KV heads, head_dim {cfg.head_dim}")
    if windows:
        n = sum(1 for w in cfg.layer_windows if w)
        parts.append(f"sliding window {'/'.join(map(str, windows))} on {n} of {cfg.num_layers} layers")
    if cfg.num_experts:
        dense = cfg.num_layers - len(cfg.moe_layers)
        parts.append(
            f"{cfg.num_experts} experts top-{cfg.experts_per_token} of size {cfg.moe_intermediate_size}"
            + (f" + {cfg.shared_experts} shared" if cfg.shared_experts else "")
            + (f" ({dense} dense layer{'s' * (dense > 1)})" if dense else "")
        )
    if cfg.rope_scaling:
        parts.append(f"rope {cfg.rope_scaling.get('rope_type', cfg.rope_scaling.get('type'))}")
    return ", ".join(parts)


def _checkpoint_shapes(model_dir: Path) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for path in checkpoint_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


def _tensor_problems(cfg: ModelArchConfig, model_dir: Path) -> list[str]:
    from shared.engine.models import build_model

    model = build_model(cfg, torch.float32, max_positions=1, device=torch.device("meta"))
    params = dict(model.named_parameters())
    have = _checkpoint_shapes(model_dir)
    problems = []
    want = model.hf_weight_map()
    missing = sorted(set(want) - set(have))
    if missing:
        problems.append(f"missing tensor(s) {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")
    extra = sorted(
        n
        for n in set(have) - set(want)
        if not (n.endswith(IGNORED_SUFFIXES) or (cfg.tie_word_embeddings and n == "lm_head.weight"))
    )
    if extra:
        problems.append(f"unexpected tensor(s) {', '.join(extra[:4])}{' ...' if len(extra) > 4 else ''}")
    for name, slot in want.items():
        if name not in have:
            continue
        target = params[slot.param].shape
        rows = target[0] if slot.start is None else (slot.end or 0) - slot.start
        expect = (rows, *target[1:]) if not slot.broadcast else tuple(target[1:])
        if tuple(have[name]) != tuple(expect):
            problems.append(f"{name} has shape {list(have[name])}, the config implies {list(expect)}")
            break
    return problems


def _bert_check(d: Path) -> ModelCheck | None:
    """A BERT embedding model is the encoder's (--encoder-model), not an LLM role's; None for any other model."""
    path = d / "config.json"
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # load_model_config says what is wrong
    if raw.get("model_type") != "bert":
        return None
    from shared.engine.models.bert import BertConfig

    try:
        bert = BertConfig.from_dict(raw, where=str(path))
    except ValueError as e:
        return ModelCheck(False, str(e))
    return ModelCheck(
        True,
        f"{', '.join(raw.get('architectures') or ['BertModel'])}: an embedding model ({bert.num_layers} layers, "
        f"hidden {bert.hidden_size}), served by the encoder (--encoder-model DIR), not by prefill/decode/worker",
    )


def check_model_dir(model_dir: str | Path) -> ModelCheck:
    """Whether `model_dir` can be served, and why not (the first problem found)."""
    d = Path(model_dir)
    bert = _bert_check(d)
    if bert is not None:
        return bert
    try:
        cfg = load_model_config(d)
    except ValueError as e:
        return ModelCheck(False, str(e))
    if (d / "config.json").read_text().find('"llava"') >= 0:  # the tower's tensors are checked when it loads
        return ModelCheck(True, _describe(cfg) + " (vision-language: the text decoder's config checked)", cfg)
    try:
        problems = _tensor_problems(cfg, d)
    except ValueError as e:
        return ModelCheck(False, str(e), cfg)
    if problems:
        return ModelCheck(False, f"{d}: {'; '.join(problems)}", cfg)
    return ModelCheck(True, _describe(cfg), cfg)
