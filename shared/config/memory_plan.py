"""The memory plan of one engine process on a GPU: weights + activation workspace + CUDA-graph pool + KV pool must
fit in --mem-fraction-static x the device memory free when the process starts.

    plan = plan_memory(inputs, device="cuda:3", free=80 << 30, total=80 << 30)
    plan.problem()      # None, or one line naming the numbers and the flag to change

Everything is arithmetic over numbers known before any weight is loaded (config.json, the safetensors headers and
the resolved config), so a plan that does not fit fails at resolution (`pdrelay up`, `config show --plan`) and again
at engine start (where the free memory is measured on the process's own device), never inside the KV allocation.

The estimates (per TP rank, in the serving dtype):
    weights     the checkpoint's parameter count x dtype bytes / tp
    workspace   the largest step's activations (step_tokens x per-token bytes, see _token_bytes), the sampler's
                rows (max_running_requests x vocab x SAMPLER_BYTES_PER_LOGIT) and the RoPE tables (fp32 cos/sin)
    graphs      the decode CUDA graphs' shared pool: the largest captured batch's activations and its fp32 logits,
                plus the scratch page padded rows write to
    kv          what is left, in whole pages (or the user's --num-pages / --kv-cache-memory-bytes)
A plan fits when the KV pool holds at least one sequence of the context length (vLLM's rule: every admitted
request can run to its end).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from shared.config.checkpoint import ModelShape

# Sampling a step's rows: fp32 logits, probabilities, a sorted copy for top-p/top-k and its int64 indices.
SAMPLER_BYTES_PER_LOGIT = 4 + 4 + 4 + 8
_FP32 = 4


def gib(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB"


class KVSource(enum.StrEnum):
    """Who sized the KV pool of a plan."""

    PLAN = "plan"
    KV_BYTES = "--kv-cache-memory-bytes"
    NUM_PAGES = "--num-pages"


@dataclass(frozen=True)
class PlanInputs:
    """What a memory plan depends on, as numbers (plan_inputs() reads them off a resolved config)."""

    shape: ModelShape
    dtype_bytes: int
    kv_dtype_bytes: int
    page_size: int
    tp_size: int
    step_tokens: int  # tokens of the largest forward pass
    max_rows: int  # sequences in one step (rows of logits the sampler holds)
    graph_max_bs: int  # largest decode batch captured in a CUDA graph; 0: no graphs
    context_length: int
    fraction: float
    user_kv_bytes: int = 0
    user_num_pages: int = 0


@dataclass(frozen=True)
class MemoryPlan:
    """One process's plan on one device (the first of its GPUs; TP ranks plan alike)."""

    model: str
    device: str
    free: int
    total: int
    fraction: float
    weights: int
    workspace: int
    graphs: int
    kv: int
    page_bytes: int
    page_size: int
    context_length: int
    kv_source: KVSource = KVSource.PLAN

    @property
    def budget(self) -> int:
        return int(self.fraction * self.free)

    @property
    def num_pages(self) -> int:
        return self.kv // self.page_bytes

    @property
    def used(self) -> int:
        return self.weights + self.workspace + self.graphs + self.kv

    @property
    def fixed(self) -> int:
        """Everything but the KV pool."""
        return self.weights + self.workspace + self.graphs

    @property
    def kv_tokens(self) -> int:
        return self.num_pages * self.page_size

    def _need_pages(self) -> int:
        return -(-self.context_length // self.page_size)

    def problem(self) -> str | None:
        """None when the plan fits; else one line: the numbers, and the flag to change."""
        head = (
            f"{self.model} does not fit on {self.device}: --mem-fraction-static {self.fraction:g} x "
            f"{gib(self.free)} free = {gib(self.budget)}, but"
        )
        parts = f"weights {gib(self.weights)} + workspace {gib(self.workspace)} + CUDA graphs {gib(self.graphs)}"
        if self.fixed > self.budget:
            return (
                f"{head} {parts} = {gib(self.fixed)} leave nothing for the KV pool; raise --tp-size (weights split "
                "over the GPUs), use GPUs with more free memory, or lower --chunked-prefill-size / "
                "--cuda-graph-max-bs if the workspace is the larger part"
            )
        if self.kv_source != KVSource.PLAN and self.used > self.budget:
            return (
                f"{head} {parts} + the KV pool of {self.kv_source} {gib(self.kv)} = {gib(self.used)}; "
                f"lower {self.kv_source} (at most {gib(self.budget - self.fixed)} is left) or drop it"
            )
        need = self._need_pages()
        if self.num_pages < need:
            left = self.budget - self.fixed
            return (
                f"{head} {parts} leave {gib(left)} for the KV pool, which needs {gib(need * self.page_bytes)} to hold "
                f"one {self.context_length}-token sequence; lower --context-length to {self.kv_tokens} or less, "
                "or raise --tp-size"
                + ("" if self.kv_source == KVSource.PLAN else f" or {self.kv_source}")
                + (" or --mem-fraction-static" if self.fraction < 0.95 else "")
            )
        return None

    def summary(self) -> str:
        """The derivation of the KV budget, for provenance and logs."""
        return (
            f"memory plan on {self.device}: --mem-fraction-static {self.fraction:g} x {gib(self.free)} free "
            f"- weights {gib(self.weights)} - workspace {gib(self.workspace)} - CUDA graphs {gib(self.graphs)} "
            f"= {self.num_pages} pages of {self.page_bytes} bytes"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "free_bytes": self.free,
            "total_bytes": self.total,
            "mem_fraction_static": self.fraction,
            "budget_bytes": self.budget,
            "weights_bytes": self.weights,
            "workspace_bytes": self.workspace,
            "cuda_graph_bytes": self.graphs,
            "kv_bytes": self.kv,
            "kv_pages": self.num_pages,
            "page_bytes": self.page_bytes,
            "kv_tokens": self.kv_tokens,
            "kv_source": str(self.kv_source),
            "context_length": self.context_length,
            "fits": self.problem() is None,
        }


def _token_bytes(inp: PlanInputs) -> int:
    """Activation bytes one token holds at the peak of a decoder layer: residual, normed input and attention
    output projection ([hidden] each), q and the attention output ([heads x head_dim] each), k and v, the gate/up
    projection ([2 x intermediate]) and its activation ([intermediate])."""
    s, tp = inp.shape, inp.tp_size
    q = s.num_heads * s.head_dim // tp
    kv = s.kv_heads_per_rank(tp) * s.head_dim
    return inp.dtype_bytes * (3 * s.hidden_size + 2 * q + 2 * kv + 3 * s.intermediate_size // tp)


def page_bytes(inp: PlanInputs) -> int:
    s = inp.shape
    return (
        s.num_layers * s.kv_planes * inp.page_size * s.kv_heads_per_rank(inp.tp_size) * s.head_dim * inp.kv_dtype_bytes
    )


def plan_memory(inp: PlanInputs, *, device: str, free: int, total: int) -> MemoryPlan:
    """The plan of one engine process whose device has `free` of `total` bytes free at its start."""
    s = inp.shape
    per_token = _token_bytes(inp)
    rope = inp.context_length * s.head_dim * _FP32  # cos and sin, [context, head_dim / 2] each
    workspace = inp.step_tokens * per_token + inp.max_rows * s.vocab_size * SAMPLER_BYTES_PER_LOGIT + rope
    page = page_bytes(inp)
    graphs = inp.graph_max_bs * (per_token + s.vocab_size * _FP32) + page if inp.graph_max_bs else 0
    weights = s.weights_bytes(inp.dtype_bytes, inp.tp_size)
    budget = int(inp.fraction * free)
    if inp.user_num_pages:
        kv, source = inp.user_num_pages * page, KVSource.NUM_PAGES
    elif inp.user_kv_bytes:
        kv, source = inp.user_kv_bytes // page * page, KVSource.KV_BYTES
    else:
        kv, source = max(0, budget - weights - workspace - graphs) // page * page, KVSource.PLAN
    return MemoryPlan(
        model=s.name,
        device=device,
        free=free,
        total=total,
        fraction=inp.fraction,
        weights=weights,
        workspace=workspace,
        graphs=graphs,
        kv=kv,
        page_bytes=page,
        page_size=inp.page_size,
        context_length=inp.context_length,
        kv_source=source,
    )
