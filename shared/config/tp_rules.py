"""How a model's attention heads, KV heads and MLP split over --tp-size ranks: the one rule the config pass (at
start, from config.json) and the engine (when it shards the model) both apply, so they never disagree.

Query heads and the MLP's intermediate size split evenly. KV heads split when num_kv_heads % tp == 0; with fewer KV
heads than ranks each KV head is replicated on tp / num_kv_heads ranks (tp % num_kv_heads == 0), so every rank's
query heads still read one KV head of their own group; any other pair is refused.
"""

from __future__ import annotations

# Sizes the error may suggest (the flag's range).
_MAX_TP = 64


def kv_heads_replicated(num_kv_heads: int, tp: int) -> bool:
    """True when each rank holds one KV head shared with other ranks (fewer KV heads than ranks)."""
    return num_kv_heads % tp != 0 and tp % num_kv_heads == 0


def _problem(num_heads: int, num_kv_heads: int, intermediate_size: int, tp: int) -> str | None:
    if num_heads % tp:
        return f"does not divide the model's {num_heads} attention heads ({num_heads} % {tp} = {num_heads % tp})"
    if num_kv_heads % tp and tp % num_kv_heads:
        return (
            f"fits neither way with the model's {num_kv_heads} KV heads (split needs {num_kv_heads} % {tp} == 0, "
            f"replication needs {tp} % {num_kv_heads} == 0)"
        )
    if intermediate_size % tp:
        return (
            f"does not divide the model's MLP intermediate size {intermediate_size} "
            f"({intermediate_size} % {tp} = {intermediate_size % tp})"
        )
    return None


def tp_layout_problem(num_heads: int, num_kv_heads: int, intermediate_size: int, tp: int) -> str | None:
    """None when `tp` ranks can shard the model, else one line naming the numbers and the sizes that work."""
    why = _problem(num_heads, num_kv_heads, intermediate_size, tp)
    if why is None:
        return None
    ok = [t for t in range(1, _MAX_TP + 1) if _problem(num_heads, num_kv_heads, intermediate_size, t) is None]
    return f"--tp-size {tp} {why}; use --tp-size {', '.join(map(str, ok))}"
