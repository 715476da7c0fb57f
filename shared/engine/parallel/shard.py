"""What one tensor-parallel rank holds of a Llama-family model, and which slice of each checkpoint tensor it reads.

The model is built from `local_arch` (the per-rank head counts, intermediate size and vocab rows), so llama.py's
DecoderLayer keeps its shapes code: q/k/v and gate/up are column-parallel (each rank computes its own heads and its
own part of the intermediate), o and down are row-parallel (each rank's partial sums, all-reduced), the embedding
and the LM head are vocab-parallel (rows of the vocabulary; the logits are gathered).

Why a vocab-parallel LM head rather than a replicated one with a gather of the hidden states: the LM head is the
largest single matrix of a small model (the bundled model's is 136M of its 494M parameters), so replicating it
would cost each rank that memory and the full GEMM; the gather of [n, vocab / tp] logits per step is small by
comparison at decode batch sizes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from shared.config.tp_rules import kv_heads_replicated, tp_layout_problem
from shared.engine.models.config import ModelArchConfig
from shared.engine.models.llama import LlamaForCausalLM, WeightSlot
from shared.engine.parallel.comm import GroupHandle, TensorParallel

# checkpoint name suffix -> (which split, the dimension of the checkpoint tensor it splits)
_SPLITS = {
    "self_attn.q_proj.weight": ("q", 0),
    "self_attn.q_proj.bias": ("q", 0),
    "self_attn.k_proj.weight": ("kv", 0),
    "self_attn.k_proj.bias": ("kv", 0),
    "self_attn.v_proj.weight": ("kv", 0),
    "self_attn.v_proj.bias": ("kv", 0),
    "self_attn.o_proj.weight": ("q", 1),
    "mlp.gate_proj.weight": ("inter", 0),
    "mlp.up_proj.weight": ("inter", 0),
    "mlp.down_proj.weight": ("inter", 1),
    "embed_tokens.weight": ("vocab", 0),
    "lm_head.weight": ("vocab", 0),
}


@dataclass(frozen=True)
class ShardSpec:
    """Rank `rank` of `tp_size`: its query heads [head_start, + heads), KV heads [kv_head_start, + kv_heads),
    intermediate columns [rank x inter, + inter), vocab rows [vocab_start, + vocab_rows) in a table of `vocab`
    rows (ceil(vocab_size / tp): the last rank's is padded with zero rows)."""

    tp_size: int
    rank: int
    head_dim: int
    heads: int
    head_start: int
    kv_heads: int
    kv_head_start: int
    inter: int
    vocab: int
    vocab_start: int
    vocab_rows: int

    @classmethod
    def for_rank(cls, arch: ModelArchConfig, tp_size: int, rank: int) -> ShardSpec:
        """ValueError naming the numbers when the model cannot be split over tp_size ranks."""
        problem = tp_layout_problem(arch.num_heads, arch.num_kv_heads, arch.intermediate_size, tp_size)
        if problem is not None:
            raise ValueError(problem)
        heads = arch.num_heads // tp_size
        if kv_heads_replicated(arch.num_kv_heads, tp_size):
            # rank r's query heads all belong to one KV group: KV head r // (ranks per KV head)
            kv_heads, kv_start = 1, rank // (tp_size // arch.num_kv_heads)
        else:
            kv_heads = arch.num_kv_heads // tp_size
            kv_start = rank * kv_heads
        per = -(-arch.vocab_size // tp_size)
        start = min(rank * per, arch.vocab_size)
        return cls(
            tp_size=tp_size,
            rank=rank,
            head_dim=arch.head_dim,
            heads=heads,
            head_start=rank * heads,
            kv_heads=kv_heads,
            kv_head_start=kv_start,
            inter=arch.intermediate_size // tp_size,
            vocab=per,
            vocab_start=start,
            vocab_rows=min(per, arch.vocab_size - start),
        )

    def local_arch(self, arch: ModelArchConfig) -> ModelArchConfig:
        """The config a rank's model is built from: its own head counts, intermediate size and vocab rows."""
        return dataclasses.replace(
            arch, num_heads=self.heads, num_kv_heads=self.kv_heads, intermediate_size=self.inter, vocab_size=self.vocab
        )

    def _source(self, kind: str) -> tuple[int, int]:
        d = self.head_dim
        if kind == "q":
            return self.head_start * d, (self.head_start + self.heads) * d
        if kind == "kv":
            return self.kv_head_start * d, (self.kv_head_start + self.kv_heads) * d
        if kind == "inter":
            return self.rank * self.inter, (self.rank + 1) * self.inter
        return self.vocab_start, self.vocab_start + self.vocab_rows

    def weight_map(self, full: dict[str, WeightSlot]) -> dict[str, WeightSlot]:
        """The model's weight map (built from local_arch: slots sized per rank) with the checkpoint slice each
        split tensor is read from; norms and q/k norm weights are whole on every rank."""
        out = {}
        for name, slot in full.items():
            split = next((s for suffix, s in _SPLITS.items() if name.endswith(suffix)), None)
            if split is None:
                out[name] = slot
                continue
            kind, dim = split
            start, end = self._source(kind)
            if kind == "vocab" and self.vocab_rows < self.vocab:  # fill the real rows, the padding stays zero
                slot = dataclasses.replace(slot, start=0, end=self.vocab_rows)
            out[name] = dataclasses.replace(slot, source=(dim, start, end))
        return out

    def prepare(self, model: LlamaForCausalLM) -> None:
        """Before loading: zero the padding rows of the vocab table(s) (the loader fills only the real rows)."""
        if self.vocab_rows < self.vocab:
            with torch.no_grad():
                model.embed_tokens[self.vocab_rows :].zero_()
                model.lm_head[self.vocab_rows :].zero_()

    def finish(self, model: LlamaForCausalLM) -> None:
        """After loading: the o projection's bias (a row-parallel output) is added by rank 0 alone, so the
        all-reduce sums it once."""
        if self.rank == 0:
            return
        with torch.no_grad():
            for layer in model.layers:
                bias = getattr(layer, "o_bias", None)
                if bias is not None:
                    bias.zero_()


@dataclass(frozen=True)
class RankShard:
    """One rank's ModelShard (shared/engine/models/tp_hooks.py): what it holds and its collectives."""

    spec: ShardSpec
    comm: TensorParallel

    @property
    def size(self) -> int:
        return self.spec.tp_size

    def local_arch(self, arch: ModelArchConfig) -> ModelArchConfig:
        return self.spec.local_arch(arch)

    def weight_map(self, full: dict[str, WeightSlot]) -> dict[str, WeightSlot]:
        return self.spec.weight_map(full)

    def prepare(self, model: LlamaForCausalLM) -> None:
        self.spec.prepare(model)

    def finish(self, model: LlamaForCausalLM) -> None:
        self.spec.finish(model)


def rank_shard(arch: ModelArchConfig, handle: GroupHandle) -> RankShard:
    """The shard of rank handle.rank of handle.size for a model of `arch` (ValueError: it does not split)."""
    spec = ShardSpec.for_rank(arch, handle.size, handle.rank)
    return RankShard(spec, TensorParallel(handle, spec.vocab_start, spec.vocab_rows, arch.vocab_size))
