"""Where a checkpoint tensor goes in our parameters (the weight loader's map, built by each model)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WeightSlot:
    """Where one checkpoint tensor goes: rows [start, end) of our parameter `param` (all rows if start is None).
    broadcast: the tensor fills every row of the slice (Qwen3's q_norm/k_norm [D] -> [heads, D]).
    row_block: the tensor has one row per `row_block` rows of the slice (fp8 block scales), repeated at load.
    transpose: the checkpoint holds the tensor transposed (AWQ's [in, out] layouts, models/quant_params.py).
    source: (dim, start, end) to read only that slice of the checkpoint tensor (a tensor-parallel rank's part)."""

    param: str
    start: int | None = None
    end: int | None = None
    broadcast: bool = False
    row_block: int = 0
    transpose: bool = False
    source: tuple[int, int, int] | None = None
