"""Paged decode attention (one query token per sequence) as a split-KV ("flash decoding") Triton kernel.

Stage 1, grid (batch, kv_heads, num_splits): each program takes one sequence's keys in one contiguous range of
positions (its split), reads them through the page table straight out of the paged cache, and runs an online
softmax for all the query heads that share the kv head (GQA: the group's heads form the rows of one tl.dot, padded
to 16). It writes the split's normalised partial output and its log-sum-exp. Stage 2, grid (batch, heads), merges
the splits. Splitting the context keeps every SM busy when batch * kv_heads is small, which a memory-bound kernel
needs to reach copy bandwidth.

Everything the host decides (grid, num_splits, block sizes) depends on tensor shapes only, never on the values in
seq_lens, so a call can be captured in a CUDA graph and replayed with other lengths. The torch reference is
shared.kernels.decode_attention.paged_decode_attention.
"""

from __future__ import annotations

import torch
import triton.language as tl

from shared.kernels.decode_attention import paged_decode_attention as reference
from shared.kernels.triton.launch import block_dim, check_float, next_pow2, round_mode, sm_count, triton_kernel

__all__ = ["default_num_splits", "launch_config", "paged_decode_attention", "reference"]

MIN_TOKENS_PER_SPLIT = 256  # below this a split's fixed cost (q load, merge traffic) outweighs the parallelism


@triton_kernel
def _decode_partial_kernel(
    Q,
    K,
    V,
    PageTable,
    SeqLens,
    MidO,
    MidLse,
    scale,
    num_heads,
    num_splits,
    stride_qb,
    stride_qh,
    stride_kp,
    stride_ks,
    stride_kh,
    stride_vp,
    stride_vs,
    stride_vh,
    stride_pt,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    F32_DOT: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(SeqLens + b).to(tl.int32)
    split_len = (seq_len + num_splits - 1) // num_splits
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    hs = tl.arange(0, BLOCK_H)
    heads = kvh * GROUP + hs  # [BLOCK_H] query heads of this kv head; rows >= GROUP are padding
    hmask = hs < GROUP
    d = tl.arange(0, BLOCK_D)
    dmask = d < HEAD_DIM
    qmask = hmask[:, None] & dmask[None, :]
    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=qmask, other=0.0)
    if F32_DOT:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)  # running max of the scores
    l_i = tl.full([BLOCK_H], 0.0, tl.float32)  # running sum of exp(score - m_i)
    acc = tl.full([BLOCK_H, BLOCK_D], 0.0, tl.float32)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)  # [BLOCK_N] token positions
        nmask = n < end
        page = tl.load(PageTable + b * stride_pt + n // PAGE_SIZE, mask=nmask, other=0).to(tl.int64)
        slot = n % PAGE_SIZE
        kvmask = nmask[:, None] & dmask[None, :]
        k = tl.load(
            K + page[:, None] * stride_kp + slot[:, None] * stride_ks + kvh * stride_kh + d[None, :],
            mask=kvmask,
            other=0.0,
        )  # [BLOCK_N, BLOCK_D]
        if F32_DOT:
            s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(nmask[None, :], s * scale, float("-inf"))  # [BLOCK_H, BLOCK_N]
        # every block holds at least one valid position, so m_new is finite and exp() never sees inf - inf
        m_new = tl.maximum(m_i, tl.reduce(s, 1, tl.standard._elementwise_max))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine)
        v = tl.load(
            V + page[:, None] * stride_vp + slot[:, None] * stride_vs + kvh * stride_vh + d[None, :],
            mask=kvmask,
            other=0.0,
        )
        if F32_DOT:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    has = l_i > 0.0  # an empty split (seq_len < num_splits) contributes nothing to the merge
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
    mid = (b * num_heads + heads) * num_splits + split  # [BLOCK_H] rows of MidLse / MidO
    tl.store(MidO + mid[:, None] * HEAD_DIM + d[None, :], out, mask=qmask)
    tl.store(MidLse + mid, lse, mask=hmask)


@triton_kernel
def _decode_merge_kernel(
    MidO,
    MidLse,
    Out,
    num_heads,
    num_splits,
    stride_ob,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    ROUND_BF16: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    smask = s < num_splits
    base = (b * num_heads + h) * num_splits
    lse = tl.load(MidLse + base + s, mask=smask, other=float("-inf"))  # [BLOCK_S]
    w = tl.exp(lse - tl.reduce(lse, 0, tl.standard._elementwise_max))  # empty splits weigh 0
    d = tl.arange(0, BLOCK_D)
    dmask = d < HEAD_DIM
    o = tl.load(MidO + (base + s)[:, None] * HEAD_DIM + d[None, :], mask=smask[:, None] & dmask[None, :], other=0.0)
    out = tl.reduce(o * w[:, None], 0, tl.standard._sum_combine) / tl.reduce(w, 0, tl.standard._sum_combine)
    if ROUND_BF16:  # round to nearest even by hand (the interpreter's cast truncates)
        u = out.to(tl.uint32, bitcast=True)
        out = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).to(tl.float32, bitcast=True)
    tl.store(Out + b * stride_ob + h * stride_oh + d, out.to(Out.dtype.element_ty), mask=dmask)


def default_num_splits(batch: int, kv_heads: int, max_len: int, device: torch.device) -> int:
    """Splits per sequence: enough programs for ~4 per SM, each split >= MIN_TOKENS_PER_SPLIT of the longest
    possible context (max_len, from the page table's width: a shape, so CUDA-graph safe). CPU (the interpreter,
    for tests): 2 once there are enough tokens, so the merge path is exercised."""
    if device.type != "cuda":
        return 2 if max_len > 64 else 1
    want = -(-4 * sm_count(device.index or 0) // max(1, batch * kv_heads))
    return max(1, min(want, -(-max_len // MIN_TOKENS_PER_SPLIT), 64))


def launch_config(head_dim: int, dtype: torch.dtype) -> tuple[int, int]:
    """(BLOCK_N, num_warps) for the split kernel on a GPU, from sm_90 builds (cuobjdump, 16-divisible strides):
    none spills (float32 at 4 warps would: 255 registers + stack); head_dim 128 takes 8 warps at 74 registers
    rather than 4 at 115, for more resident warps per SM. bench/gpu_check sweeps the alternatives."""
    if dtype == torch.float32:
        return 32, 8
    if head_dim <= 64:
        return 64, 4
    return (64, 8) if head_dim <= 128 else (32, 8)


def _checked_out(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """The shapes and dtypes checked (ValueError naming them); the output tensor, allocated unless given."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_float(name, t)
    bs, heads, head_dim = q.shape
    _, _, kv_heads, kd = k_cache.shape
    if kd != head_dim or v_cache.shape != k_cache.shape or k_cache.dtype != v_cache.dtype:
        raise ValueError(
            f"k_cache {tuple(k_cache.shape)} / v_cache {tuple(v_cache.shape)} do not fit q "
            f"{tuple(q.shape)}: want [num_pages, page_size, kv_heads, {head_dim}] each"
        )
    if heads % kv_heads:
        raise ValueError(f"heads {heads} is not a multiple of kv_heads {kv_heads}")
    if page_table.dim() != 2 or page_table.shape[0] != bs or seq_lens.shape != (bs,):
        raise ValueError(
            f"page_table {tuple(page_table.shape)} / seq_lens {tuple(seq_lens.shape)} must be "
            f"[{bs}, max_pages] / [{bs}]"
        )
    if out is None:
        return torch.empty((bs, heads, head_dim), dtype=q.dtype, device=q.device)
    if out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1:
        raise ValueError(f"out must be a {q.dtype} tensor of shape {tuple(q.shape)} with a contiguous last dim")
    return out


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    num_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of one new token per sequence over its cached keys/values.

    q: [bs, heads, head_dim] (any batch/head strides); k_cache, v_cache: [num_pages, page_size, kv_heads, head_dim]
    (strided views of the pool are fine, the last dim contiguous); page_table: [bs, max_pages] int; seq_lens: [bs]
    int, >= 1, the tokens to attend to including the current one (already written). heads % kv_heads == 0.
    Returns [bs, heads, head_dim] in q's dtype (`out` if given). Entries of page_table past a sequence's last page
    are never read. num_splits, block_n, num_warps override the tuned defaults (launch_config).
    """
    out = _checked_out(q, k_cache, v_cache, page_table, seq_lens, out)
    bs, heads, head_dim = q.shape
    _, page_size, kv_heads, _ = k_cache.shape
    if bs == 0:
        return out
    max_len = page_table.shape[1] * page_size
    splits = num_splits or default_num_splits(bs, kv_heads, max_len, q.device)
    group = heads // kv_heads
    default_n, default_warps = launch_config(head_dim, q.dtype)
    block_n = block_n or default_n
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two >= 16, got {block_n}")
    mid_o = torch.empty((bs, heads, splits, head_dim), dtype=torch.float32, device=q.device)
    mid_lse = torch.empty((bs, heads, splits), dtype=torch.float32, device=q.device)
    dev = q.device
    f32_dot = q.dtype == torch.float32 or dev.type == "cpu"  # the interpreter computes bf16 only after upcasting
    _decode_partial_kernel.on(dev)[(bs, kv_heads, splits)](
        q,
        k_cache,
        v_cache,
        page_table,
        seq_lens,
        mid_o,
        mid_lse,
        float(scale),
        heads,
        splits,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        page_table.stride(0),
        GROUP=group,
        HEAD_DIM=head_dim,
        PAGE_SIZE=page_size,
        BLOCK_H=block_dim(group),
        BLOCK_N=block_n,
        BLOCK_D=block_dim(head_dim),
        F32_DOT=f32_dot,
        num_warps=num_warps or default_warps,
    )
    _decode_merge_kernel.on(dev)[(bs, heads)](
        mid_o,
        mid_lse,
        out,
        heads,
        splits,
        out.stride(0),
        out.stride(1),
        HEAD_DIM=head_dim,
        BLOCK_S=max(2, next_pow2(splits)),
        BLOCK_D=block_dim(head_dim),
        ROUND_BF16=round_mode(out.dtype, dev),
    )
    return out
