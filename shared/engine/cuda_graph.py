"""CUDA-graph decode runner: capture the model's decode step once per batch size, replay it every step.

A decode step of a small model is hundreds of tiny kernel launches whose CPU cost dwarfs the GPU work at small
batch sizes; a CUDA graph replays them all with one launch. Layout, as SGLang and vLLM do it:
  - static input buffers sized for the largest batch (token ids, positions, K/V write slots, page table [max_bs,
    max_pages_per_seq], sequence lengths); graphs read these addresses on every replay, so a step copies its
    batch into them first;
  - one graph per configured batch size, captured largest first into one shared memory pool (a smaller graph
    reuses the larger one's activation memory);
  - a batch is padded up to the nearest captured size: padding rows decode one token at position 0 of a scratch
    page no sequence owns, so their K/V writes touch nothing real; past the largest size the step runs eagerly.
Only all-decode steps (one token per sequence, all wanting logits) are captured; prefill runs eagerly. Never on
CPU, and never for a role that does not decode: the config derives those switches (cuda_graph group).

The attention backend must plan a decode step from device tensors alone (`decode_metadata`): the Triton backend
does; the torch backend's gather buffers are not graph-safe, so with it the runner is not built.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from shared.engine.forward_batch import ForwardBatch
from shared.engine.kv_pool import KVPool
from shared.kernels.attention_plan import AttentionMetadata
from shared.kernels.dispatch import AttentionBackend

log = logging.getLogger(__name__)


@runtime_checkable
class GraphSafeBackend(Protocol):
    """An attention backend whose all-decode plan needs no host sync and no host data."""

    def decode_metadata(
        self, page_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int
    ) -> AttentionMetadata: ...

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor: ...


def capture_order(batch_sizes: Sequence[int]) -> tuple[int, ...]:
    """Distinct batch sizes, largest first (the order they are captured in)."""
    sizes = sorted({int(b) for b in batch_sizes}, reverse=True)
    if not sizes or sizes[-1] < 1:
        raise ValueError(f"cuda_graph_bs {tuple(batch_sizes)} must list batch sizes >= 1, e.g. 1 2 4 8 16")
    return tuple(sizes)


def padded_batch_size(bs: int, sizes: Sequence[int]) -> int | None:
    """The smallest captured size >= bs, or None when bs is past the largest (the step runs eagerly)."""
    fits = [s for s in sizes if s >= bs]
    return min(fits) if fits else None


class CudaGraphDecodeRunner:
    """Captured decode steps of one model over one KV pool.

    model: LlamaForCausalLM-like (`model(batch, kv, attn, meta) -> hidden [bs, hidden]`, `compute_logits`).
    scratch_page: a pool page the scheduler never hands out; padding rows write their K/V there.
    use_graphs=False keeps everything but the capture: each "replay" re-runs the step eagerly over the static
    buffers. CPU tests use it to check the buffers, padding and fallbacks; only the capture itself needs CUDA.
    """

    def __init__(
        self,
        model: Any,
        kv: KVPool,
        attn: AttentionBackend,  # refused (ValueError) unless it is a GraphSafeBackend
        *,
        batch_sizes: Sequence[int],
        max_pages_per_seq: int,
        page_size: int,
        scratch_page: int,
        use_graphs: bool = True,
    ) -> None:
        if not isinstance(attn, GraphSafeBackend):
            raise ValueError(
                f"attention backend {getattr(attn, 'name', attn)!r} cannot be captured in a CUDA "
                "graph; use --attention-backend triton or --disable-cuda-graph"
            )
        if not 0 <= scratch_page < kv.buffer.shape[0]:
            raise ValueError(f"scratch_page {scratch_page} is outside the KV pool [0, {kv.buffer.shape[0]})")
        if use_graphs and kv.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a cuda device, the KV pool is on {kv.device}; use --disable-cuda-graph")
        self.model, self.kv, self.attn = model, kv, attn
        self.sizes = capture_order(batch_sizes)
        self.max_bs = self.sizes[0]
        self.max_pages = max_pages_per_seq
        self.page_size = page_size
        self.scratch_page = scratch_page
        self.use_graphs = use_graphs
        self.replays = 0  # steps served by a captured size (benchmarks and tests check the path taken)
        n, dev = self.max_bs, kv.device
        i64: dict[str, Any] = {"dtype": torch.int64, "device": dev}
        # Static inputs; rows past the current batch hold padding (see _pad).
        self.input_ids = torch.zeros(n, **i64)  # [max_bs]
        self.positions = torch.zeros(n, **i64)  # [max_bs]
        self.out_pages = torch.full((n,), scratch_page, **i64)  # [max_bs] page of each token's K/V
        self.out_offsets = torch.zeros(n, **i64)  # [max_bs] slot in that page
        self.seq_lens = torch.ones(n, **i64)  # [max_bs] keys to attend to, the new token included
        self.page_table = torch.full((n, max_pages_per_seq), scratch_page, **i64)  # [max_bs, max_pages]
        self.logits_indices = torch.arange(n, **i64)  # [max_bs] every row wants logits
        self._dirty = 0  # rows [0, _dirty) may hold a previous batch's values instead of padding
        self._steps: dict[int, Callable[[], torch.Tensor]] = {}
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, torch.Tensor] = {}  # [bs, vocab] float32 logits written by each graph

    # ---- capture ------------------------------------------------------------------------------------------------
    def _static_batch(self, bs: int) -> ForwardBatch:
        return ForwardBatch(
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            page_table=self.page_table[:bs],
            out_pages=self.out_pages[:bs],
            out_offsets=self.out_offsets[:bs],
            logits_indices=self.logits_indices[:bs],
            prefix_lens=np.zeros(bs, np.int64),
            extend_lens=np.ones(bs, np.int64),
            token_starts=np.arange(bs, dtype=np.int64),
            page_size=self.page_size,
        )

    def _step_fn(self, bs: int) -> Callable[[], torch.Tensor]:
        batch = self._static_batch(bs)
        pt, lens = self.page_table[:bs], self.seq_lens[:bs]

        def step() -> torch.Tensor:
            meta = self.attn.decode_metadata(pt, lens, self.page_size)  # inside the capture: device views only
            hidden = self.model(batch, self.kv, self.attn, meta)  # [bs, hidden]
            return self.model.compute_logits(hidden)  # [bs, vocab] float32

        return step

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every batch size, largest first, into one memory pool. Warm-up steps compile the Triton kernels
        and let cuBLAS choose its algorithms outside the capture; they write K/V into the scratch page only."""
        self._pad(0, self.max_bs)
        if not self.use_graphs:
            self._steps = {bs: self._step_fn(bs) for bs in self.sizes}
            return
        pool = torch.cuda.graph_pool_handle()
        for bs in self.sizes:
            step = self._step_fn(bs)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    step()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._outputs[bs] = step()
            self._graphs[bs] = graph
        torch.cuda.synchronize()
        log.info("captured decode CUDA graphs for batch sizes %s", sorted(self.sizes))

    def close(self) -> None:
        """Drop the graphs and their memory pool (before anything they reference, e.g. communicators, goes)."""
        self._graphs.clear()
        self._outputs.clear()
        self._steps.clear()

    # ---- replay -------------------------------------------------------------------------------------------------
    def can_run(self, batch: ForwardBatch) -> bool:
        """An all-decode step with logits for every row that fits a captured size and the static page table."""
        bs = batch.batch_size
        return (
            bool(self._graphs or self._steps)
            and batch.is_decode
            and bs <= self.max_bs
            and batch.page_table.shape[1] <= self.max_pages
            and batch.logits_indices.shape[0] == bs
        )

    def _pad(self, start: int, end: int) -> None:
        """Rows [start, end) decode token 0 at position 0 of the scratch page, attending to that one slot."""
        if end <= start:
            return
        self.input_ids[start:end].zero_()
        self.positions[start:end].zero_()
        self.out_pages[start:end].fill_(self.scratch_page)
        self.out_offsets[start:end].zero_()
        self.seq_lens[start:end].fill_(1)
        self.page_table[start:end, 0].fill_(self.scratch_page)

    @torch.inference_mode()
    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """Copy the step into the static buffers, replay the nearest captured size and return float32 logits
        [bs, vocab] (a fresh tensor, as an eager forward returns). Call only when can_run(batch)."""
        bs = batch.batch_size
        size = padded_batch_size(bs, self.sizes)
        assert size is not None and self.can_run(batch), "run() a batch that can_run() accepted"
        width = batch.page_table.shape[1]
        self.input_ids[:bs].copy_(batch.input_ids)
        self.positions[:bs].copy_(batch.positions)
        self.out_pages[:bs].copy_(batch.out_pages)
        self.out_offsets[:bs].copy_(batch.out_offsets)
        # columns past `width` keep stale page ids: the kernel never reads past a sequence's own last page
        self.page_table[:bs, :width].copy_(batch.page_table)
        torch.add(batch.positions, 1, out=self.seq_lens[:bs])  # a decode token at position p sees p + 1 keys
        self._pad(bs, self._dirty)  # rows a larger previous batch left behind go back to padding
        self._dirty = bs
        self.replays += 1
        if not self.use_graphs:
            return self._steps[size]()[:bs].clone()
        self._graphs[size].replay()
        return self._outputs[size][:bs].clone()


def build_decode_graphs(
    model: Any,
    kv: KVPool,
    attn: AttentionBackend,
    *,
    batch_sizes: Sequence[int],
    context_length: int,
    page_size: int,
    scratch_page: int,
) -> CudaGraphDecodeRunner | None:
    """Capture decode graphs for a model runner; None (with a warning) when its attention backend cannot be
    captured. The static page table covers a whole context: ceil(context_length / page_size) pages a sequence."""
    if not isinstance(attn, GraphSafeBackend):
        log.warning(
            "decode CUDA graphs are off: attention backend %r cannot be captured; use "
            "--attention-backend triton (or --disable-cuda-graph to silence this)",
            getattr(attn, "name", attn),
        )
        return None
    runner = CudaGraphDecodeRunner(
        model,
        kv,
        attn,
        batch_sizes=batch_sizes,
        max_pages_per_seq=-(-context_length // page_size),
        page_size=page_size,
        scratch_page=scratch_page,
    )
    runner.capture()
    return runner
