"""The paged KV pool: one contiguous tensor holding every layer's K and V, page-major.

    buffer: [num_pages, num_layers, 2 (K, V), page_size, num_kv_heads, head_dim]

(An "mla" layout holds one plane per layer, the latent rows, instead of K and V: [.., num_layers, 1, page_size, 1,
latent width]; `k(layer)` reads it and there is no `v(layer)`.)

Page-major means one page of one sequence (all layers, K and V) is one contiguous region of `layout.page_bytes`
bytes at `data_ptr + page_id * bytes_per_page`: a transfer engine moves a page with one descriptor, and a
checksum of a page is a checksum of one byte range. Attention reads a layer through the strided views `k(layer)`
and `v(layer)`.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Sequence

import torch

from shared.modelspec.kv_layout import KVLayout

log = logging.getLogger(__name__)


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    """'float32' | 'bfloat16' | 'float16' -> torch dtype."""
    if name not in _DTYPES:
        raise ValueError(f"dtype {name!r} is not supported; use one of: {', '.join(_DTYPES)}")
    return _DTYPES[name]


_KV_DTYPES = {**_DTYPES, "fp8_e4m3": torch.float8_e4m3fn}
FP8_E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max: casting past it gives NaN, so writes clamp first


def kv_torch_dtype(name: str) -> torch.dtype:
    """A KV layout's dtype name -> torch dtype: the model dtypes, or 'fp8_e4m3'."""
    if name not in _KV_DTYPES:
        raise ValueError(f"KV cache dtype {name!r} is not supported; use one of: {', '.join(_KV_DTYPES)}")
    return _KV_DTYPES[name]


def num_pages_for_budget(layout: KVLayout, budget_bytes: int) -> int:
    """How many whole pages fit in `budget_bytes`."""
    pages = budget_bytes // layout.page_bytes
    if pages < 1:
        raise ValueError(
            f"KV budget of {budget_bytes} bytes holds no page of {layout.page_bytes} bytes "
            f"(page_size {layout.page_size}, {layout.num_layers} layers); raise the budget or lower --page-size"
        )
    return int(pages)


class KVPool:
    """Owns the KV buffer; page ids index its first dimension."""

    def __init__(self, layout: KVLayout, num_pages: int, device: torch.device | str = "cpu") -> None:
        if num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {num_pages}")
        self.layout = layout
        self.num_pages = num_pages
        self.device = torch.device(device)
        self.dtype = kv_torch_dtype(layout.dtype)
        self.quantized = self.dtype == torch.float8_e4m3fn
        # per-layer dequantization scales of fp8 pages (set_scales); 1.0 for unquantized pools
        self.k_scales = [1.0] * layout.num_layers
        self.v_scales = [1.0] * layout.num_layers
        # zeros, not empty: a never-written page must read as finite numbers (masked attention multiplies it by 0,
        # and 0 * NaN would poison the output).
        planes = layout.planes  # 2 (K, V), or 1 for an mla layout's latent rows
        shape = (num_pages, layout.num_layers, planes, layout.page_size, layout.num_kv_heads, layout.head_dim)
        if self.device.type == "cpu":
            # Huge-page-advised anonymous memory: zero without a fill pass (fast start), fewer TLB misses for
            # attention, and memcpy-speed page writes between processes (see shared/engine/hostmem.py).
            from shared.engine.hostmem import alloc_host_buffer

            self.buffer = alloc_host_buffer(shape, self.dtype)
        else:
            self.buffer = torch.zeros(shape, dtype=self.dtype, device=self.device)
        # [num_pages, num_layers * 2, page_size * kv_heads * head_dim]: row (page, 2*layer + kv) is one page's K or V
        # of one layer, contiguous; decode attention gathers these rows with one index_select.
        self._rows = self.buffer.view(num_pages, layout.num_layers * planes, -1)
        # Per-layer views made once: slicing the buffer anew on every call is measurable dispatch overhead per
        # layer per decode step.
        self._k = [self.buffer[:, i, 0] for i in range(layout.num_layers)]
        self._v = [self.buffer[:, i, 1] for i in range(layout.num_layers)] if planes == 2 else []
        # Pages known to be backed by memory (populated or written): host pools start unbacked (see prefault()).
        self._resident = bytearray(num_pages) if self.device.type == "cpu" else bytearray(b"\x01" * num_pages)
        self._populating: threading.Thread | None = None

    def set_scales(self, k_scales: Sequence[float], v_scales: Sequence[float]) -> None:
        """Per-layer K and V scales of an fp8 pool (a checkpoint's k_scale / v_scale); both ends of a hand-off must
        use the same ones, as they load the same checkpoint."""
        n = self.layout.num_layers
        if len(k_scales) != n or len(v_scales) != n or min(*k_scales, *v_scales) <= 0:
            raise ValueError(f"KV scales must be {n} positive numbers per K and V")
        self.k_scales, self.v_scales = [float(x) for x in k_scales], [float(x) for x in v_scales]

    def quantize(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """fp8 pools: (k / k_scale, v / v_scale) rounded to e4m3 as the pages will hold them, in k's dtype."""
        k8 = (k / self.k_scales[layer]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(self.dtype)
        v8 = (v / self.v_scales[layer]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(self.dtype)
        return k8.to(k.dtype), v8.to(v.dtype)

    @property
    def bytes_per_page(self) -> int:
        return self.layout.page_bytes

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def data_ptr(self) -> int:
        return self.buffer.data_ptr()

    def k(self, layer: int) -> torch.Tensor:
        """[num_pages, page_size, kv_heads, head_dim] view of layer `layer`'s keys (strided, no copy)."""
        return self._k[layer]

    def v(self, layer: int) -> torch.Tensor:
        """[num_pages, page_size, kv_heads, head_dim] view of layer `layer`'s values (strided, no copy)."""
        if not self._v:
            raise ValueError("an mla KV pool holds latent rows only (k); values are decompressed from them")
        return self._v[layer]

    def k_rows(self, layer: int) -> torch.Tensor:
        """[num_pages, page_size * kv_heads * head_dim]: layer's keys, one contiguous row per page."""
        return self._rows[:, self.layout.planes * layer]

    def v_rows(self, layer: int) -> torch.Tensor:
        """[num_pages, page_size * kv_heads * head_dim]: layer's values, one contiguous row per page."""
        if not self._v:
            raise ValueError("an mla KV pool holds latent rows only (k); values are decompressed from them")
        return self._rows[:, 2 * layer + 1]

    def write(
        self,
        layer: int,
        slots_pages: torch.Tensor,
        slots_offsets: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> None:
        """Store K/V of T tokens: token i goes to (page slots_pages[i], offset slots_offsets[i]).

        slots_pages, slots_offsets: [T] int64; k, v: [T, kv_heads, head_dim].
        """
        idx = (slots_pages, slots_offsets)
        if self.quantized:  # in page units already (quantize); clamped so no value casts to NaN
            k, v = k.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX), v.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
        self._k[layer].index_put_(idx, k.to(self.dtype))  # fp32 activations into a bf16 pool: rounded here
        self._v[layer].index_put_(idx, v.to(self.dtype))

    def write_latent(
        self, layer: int, slots_pages: torch.Tensor, slots_offsets: torch.Tensor, rows: torch.Tensor
    ) -> None:
        """An mla pool: store T tokens' latent rows [T, 1, head_dim] at (slots_pages[i], slots_offsets[i])."""
        assert self.layout.kind == "mla", self.layout.kind
        self._k[layer].index_put_((slots_pages, slots_offsets), rows.to(self.dtype))

    def populate_in_background(self) -> threading.Thread | None:
        """Fault the whole host pool in, in page order, on a daemon thread at the lowest CPU priority; None on GPU.

        Why: a fresh pool's first write into each 2 MiB huge page allocates (and, with THP defrag "madvise",
        compacts) it, ~2.9 s per GiB here. Left to the forward pass, that cost landed in the K/V cache write of
        the steps that first touch a page: 1.2 s of a 13 s benchmark of 64 requests on a fresh worker (the K/V
        write 8.5x slower than on a resident pool). Populated up front, the cost is spent while the service warms
        up and waits for its first requests, at nice 19 so it yields to the engine's threads when they run. The
        thread holds the pool, so the mapping outlives every madvise on it.
        """
        if self.device.type != "cpu":
            return None
        if self._populating is None:  # once: a later call (a transfer engine over the pool) finds it started
            self._populating = threading.Thread(target=self._populate_all, name="kv-populate", daemon=True)
            self._populating.start()
        return self._populating

    def _populate_all(self) -> None:
        from shared.engine.hostmem import POPULATE_CHUNK_BYTES, lower_this_thread

        lower_this_thread()
        start = time.monotonic()
        per = max(1, POPULATE_CHUNK_BYTES // self.bytes_per_page)
        for first in range(0, self.num_pages, per):
            last = min(self.num_pages, first + per)
            self.prefault(range(first, last))
            if not all(self._resident[first:last]):
                return  # unsupported here: first writes fault pages in themselves
        log.info("KV pool resident: %d MiB in %.1f s", self.nbytes >> 20, time.monotonic() - start)

    def prefault(self, page_ids: Sequence[int]) -> int:
        """Back the pages with memory before a peer writes into them; returns how many pages that newly faulted.

        A host pool is fresh anonymous memory: its first write faults each huge page in, and when that write is a
        peer's KV transfer the kernel does it inside the transfer (~10x slower than into resident pages here).
        Each page is populated once in the pool's life (contents untouched, see hostmem.populate); call it from
        any thread, e.g. while the peer still computes. A no-op on GPU pools.
        """
        from shared.engine.hostmem import populate

        todo = sorted({p for p in page_ids if not self._resident[p]})
        done = 0
        i = 0
        while i < len(todo):  # one madvise per run of consecutive pages
            j = i
            while j + 1 < len(todo) and todo[j + 1] == todo[j] + 1:
                j += 1
            if not populate(self.page_ptr(todo[i]), (j - i + 1) * self.bytes_per_page):
                return done  # unsupported here: the transfer faults them in itself
            for p in todo[i : j + 1]:
                self._resident[p] = 1
            done += j - i + 1
            i = j + 1
        return done

    def page_view(self, page_id: int) -> torch.Tensor:
        """[num_layers, planes, page_size, kv_heads, head_dim]: one page, contiguous (a view, writes go to the pool)."""
        return self.buffer[page_id]

    def copy_pages(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole pages (all layers, K and V or the latent): pairs of (src page, dst page)."""
        src = torch.tensor([a for a, _ in pairs], device=self.device)
        dst = torch.tensor([b for _, b in pairs], device=self.device)
        buf = self.buffer.view(torch.uint8) if self.quantized else self.buffer  # torch has no fp8 index_copy_
        buf.index_copy_(0, dst, buf.index_select(0, src))

    def page_ptr(self, page_id: int) -> int:
        """Address of page `page_id` (for transfer descriptors)."""
        return self.data_ptr() + page_id * self.bytes_per_page

    def pages_bytes(self, page_ids: Sequence[int]) -> torch.Tensor:
        """The pages' raw bytes, in the given order, as one uint8 tensor [len(page_ids) * bytes_per_page] (a copy)."""
        idx = torch.as_tensor(list(page_ids), dtype=torch.int64, device=self.device)
        return self.buffer.index_select(0, idx).contiguous().view(torch.uint8).reshape(-1)

    def pages_checksum(self, page_ids: Sequence[int]) -> str:
        """sha256 hex digest of the pages' bytes in order; both ends of a hand-off compute it the same way."""
        return hashlib.sha256(self.pages_bytes(page_ids).cpu().numpy().tobytes()).hexdigest()
