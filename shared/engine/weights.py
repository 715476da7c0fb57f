"""Load a Hugging Face safetensors checkpoint (one file or a sharded index) into our modules, strictly.

Every tensor the model needs must be found exactly once and with the right shape; a tensor the model does not
know is an error too (it usually means a different architecture or a broken conversion), except for a few
harmless extras listed in _IGNORED (RoPE caches some old exports store, a tied lm_head stored anyway).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from shared.engine.models.llama import WeightSlot

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")


def checkpoint_files(model_dir: str | Path) -> list[Path]:
    """The safetensors files of a model directory, in a stable order."""
    d = Path(model_dir)
    index = d / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = sorted({d / f for f in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ValueError(f"{index} lists shards that are not in {d}: {', '.join(missing)}")
        return files
    single = d / "model.safetensors"
    if single.is_file():
        return [single]
    files = sorted(d.glob("*.safetensors"))
    if files:
        return files
    if any(d.glob("*.bin")):
        raise ValueError(f"{d} holds PyTorch .bin weights only; convert them to safetensors (save_pretrained)")
    raise ValueError(f"{d} has no *.safetensors weights; point --model at a Hugging Face model directory")


def iter_checkpoint(model_dir: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor in the checkpoint, one at a time (memory-mapped, then copied by the caller)."""
    for path in checkpoint_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                yield name, f.get_tensor(name)


def _first(names: list[str], n: int = 8) -> str:
    return ", ".join(names[:n]) + (" ..." if len(names) > n else "")


def load_weights(
    model: nn.Module,
    weight_map: dict[str, WeightSlot],
    model_dir: str | Path,
    *,
    tied_lm_head: bool = False,
    rename: Callable[[str], str] | None = None,
    skip_prefixes: tuple[str, ...] = (),
) -> None:
    """Copy the checkpoint into `model`'s parameters following `weight_map` (HF name -> slot).

    rename: maps each checkpoint name to the spelling weight_map uses (LLaVA's several layouts); skip_prefixes:
    (renamed) checkpoint tensors that are expected but not loaded (e.g. the vision half in a text-only process).

    Raises ValueError listing missing, unexpected or wrongly shaped tensors.
    """
    params = dict(model.named_parameters())
    seen: set[str] = set()
    unexpected: list[str] = []
    bad_shape: list[str] = []
    with torch.no_grad():
        for name, tensor in iter_checkpoint(model_dir):
            if rename is not None:
                name = rename(name)
            if skip_prefixes and name.startswith(skip_prefixes):
                continue
            slot = weight_map.get(name)
            if slot is None:
                if name.endswith(_IGNORED_SUFFIXES) or (tied_lm_head and name == "lm_head.weight"):
                    continue
                unexpected.append(name)
                continue
            if name in seen:
                raise ValueError(f"{model_dir}: tensor {name} appears in more than one shard")
            target: torch.Tensor = params[slot.param]
            if slot.start is not None:
                target = target[slot.start : slot.end]
            want = target.shape[1:] if slot.broadcast else target.shape
            if tuple(tensor.shape) != tuple(want):
                bad_shape.append(f"{name}: checkpoint {tuple(tensor.shape)}, model expects {tuple(want)}")
                continue
            target.copy_(tensor)  # converts dtype; broadcast slots repeat the tensor over their rows
            seen.add(name)
    missing = sorted(set(weight_map) - seen)
    problems = []
    if missing:
        problems.append(f"missing {len(missing)} tensor(s): {_first(missing)}")
    if unexpected:
        problems.append(f"unexpected {len(unexpected)} tensor(s): {_first(unexpected)}")
    if bad_shape:
        problems.append("wrong shape: " + "; ".join(bad_shape[:8]))
    if problems:
        raise ValueError(
            f"{model_dir}: the checkpoint does not match the model built from its config.json ("
            + "; ".join(problems)
            + "). Is config.json from the same model as the weights?"
        )
