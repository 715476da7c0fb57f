"""Load a Hugging Face safetensors checkpoint (one file or a sharded index) into our modules, strictly.

Every tensor the model needs must be found exactly once and with the right shape; a tensor the model does not
know is an error too (it usually means a different architecture or a broken conversion), except for a few
harmless extras listed in _IGNORED (RoPE caches some old exports store, a tied lm_head stored anyway).

Tensors go straight into the model's parameters wherever those live (a model built on its GPU gets each tensor
copied from the memory-mapped file to the device, one at a time: no host copy of the whole model). The work is
split into pieces (a shard, or a slice of a large shard's tensor names) read by a thread pool: safetensors and the
copies release the GIL, so pieces overlap their file reads and copies. Every tensor has its own destination, so
the result does not depend on the order; tests check it equals the sequential load.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from shared.engine.kv_scales import KV_SCALE_SUFFIXES
from shared.engine.models.llama import WeightSlot

# fp8 KV scales are read by kv_scales.py, for an fp8 KV pool only; compressed-tensors' static activation scales
# (input_scale) are not used: the engine runs activations unquantized (shared/config/compressed_tensors.py)
IGNORED_SUFFIXES = (
    "rotary_emb.inv_freq",
    "rotary_emb.cos_cached",
    "rotary_emb.sin_cached",
    "_proj.input_scale",
    *KV_SCALE_SUFFIXES,
)
# Most threads a load uses: reads of one NVMe and host-to-device copies saturate well before this.
MAX_LOAD_THREADS = 8


def default_load_threads() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(MAX_LOAD_THREADS, cores))


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


@dataclass
class _Found:
    """What one piece of the checkpoint held (merged after all pieces ran)."""

    loaded: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    bad_shape: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Rules:
    weight_map: dict[str, WeightSlot]
    params: dict[str, torch.Tensor]
    tied_lm_head: bool
    rename: Callable[[str], str] | None
    skip_prefixes: tuple[str, ...]


def _pieces(files: list[Path], threads: int) -> list[tuple[Path, list[str]]]:
    """(file, tensor names) units of work: each shard, split in up to `threads` slices when there are fewer shards
    than threads (a single-file checkpoint still loads in parallel)."""
    pieces = []
    split = max(1, threads // max(1, len(files)))
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            names = list(f.keys())
        step = -(-len(names) // split) if names else 1
        pieces += [(path, names[i : i + step]) for i in range(0, len(names), step)]
    return pieces


def _read(f: Any, name: str, source: tuple[int, int, int] | None) -> torch.Tensor:
    """The tensor `name`, or only its slice `source` = (dim, start, end) (a tensor-parallel rank's part: the other
    ranks' rows or columns are never read). Memory-mapped: only the pages read are touched."""
    if source is None:
        return f.get_tensor(name)
    dim, start, end = source
    part = f.get_slice(name)
    return part[start:end] if dim == 0 else part[:, start:end]


def _load_piece(path: Path, names: list[str], rules: _Rules) -> _Found:
    found = _Found()
    with torch.no_grad(), safe_open(str(path), framework="pt") as f:
        for raw in names:
            name = rules.rename(raw) if rules.rename is not None else raw
            if rules.skip_prefixes and name.startswith(rules.skip_prefixes):
                continue
            slot = rules.weight_map.get(name)
            if slot is None:
                if not (name.endswith(IGNORED_SUFFIXES) or (rules.tied_lm_head and name == "lm_head.weight")):
                    found.unexpected.append(name)
                continue
            target = rules.params[slot.param]
            if slot.start is not None:
                target = target[slot.start : slot.end]
            want = target.shape[1:] if slot.broadcast else target.shape
            tensor = _read(f, raw, slot.source)  # memory-mapped: only the pages read are touched
            if slot.transpose:
                tensor = tensor.t()
            if slot.row_block and tensor.dim() < 2:
                tensor = tensor.reshape(-1, 1)  # a per-tensor scale ([] or [1]) or a flat per-channel one
            if slot.row_block and tensor.dim() == 2 and tensor.shape[0] == -(-want[0] // slot.row_block):
                # block scales -> one row per row (a per-tensor scale's huge row block: its one row, want[0] times)
                tensor = tensor.repeat_interleave(min(slot.row_block, want[0]), 0)[: want[0]]
            if tuple(tensor.shape) != tuple(want):
                found.bad_shape.append(f"{name}: checkpoint {tuple(tensor.shape)}, model expects {tuple(want)}")
                continue
            # converts dtype and moves to the parameter's device; broadcast slots repeat the tensor over their rows
            target.copy_(tensor, non_blocking=False)
            found.loaded.append(name)
    return found


def load_weights(
    model: nn.Module,
    weight_map: dict[str, WeightSlot],
    model_dir: str | Path,
    *,
    tied_lm_head: bool = False,
    rename: Callable[[str], str] | None = None,
    skip_prefixes: tuple[str, ...] = (),
    threads: int | None = None,
) -> None:
    """Copy the checkpoint into `model`'s parameters (on whatever device they are) following `weight_map` (HF name
    -> slot), with `threads` readers (default: default_load_threads(); 1: sequential).

    rename: maps each checkpoint name to the spelling weight_map uses (LLaVA's several layouts); skip_prefixes:
    (renamed) checkpoint tensors that are expected but not loaded (e.g. the vision half in a text-only process).

    Raises ValueError listing missing, duplicated, unexpected or wrongly shaped tensors.
    """
    threads = threads or default_load_threads()
    rules = _Rules(weight_map, dict(model.named_parameters()), tied_lm_head, rename, skip_prefixes)
    pieces = _pieces(checkpoint_files(model_dir), threads)
    if threads == 1 or len(pieces) == 1:
        results = [_load_piece(path, names, rules) for path, names in pieces]
    else:
        with ThreadPoolExecutor(min(threads, len(pieces)), thread_name_prefix="load-weights") as pool:
            results = list(pool.map(lambda piece: _load_piece(piece[0], piece[1], rules), pieces))
    seen: set[str] = set()
    for r in results:
        twice = seen.intersection(r.loaded)
        if twice:
            raise ValueError(f"{model_dir}: tensor {min(twice)} appears in more than one shard")
        seen.update(r.loaded)
    unexpected = [n for r in results for n in r.unexpected]
    bad_shape = [n for r in results for n in r.bad_shape]
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
