"""Prefill / extend attention over a cached prefix plus new tokens (causal), as one Triton kernel.

Sequence i computes extend_lens[i] new tokens at positions [prefix_lens[i], prefix_lens[i] + extend_lens[i]); the
model writes their K/V into the paged cache before attention, so the kernel reads every key (prefix and new)
through the page table and applies one bottom-right aligned causal mask: new token j sees keys 0..prefix + j.
A decode token is an extend of length 1, so a batch mixing prefill chunks and decode tokens is one launch.

Grid (sequences, heads, query blocks of BLOCK_M tokens); query blocks past a sequence's length exit at once. Each
program runs an online softmax over key blocks of BLOCK_N up to its last row's position. The torch reference is
shared.kernels.extend_attention.extend_attention.
"""

from __future__ import annotations

import torch
import triton.language as tl

from shared.kernels.extend_attention import extend_attention as reference
from shared.kernels.triton.launch import block_dim, check_float, round_mode, triton_kernel

__all__ = ["extend_attention", "launch_config", "reference"]


@triton_kernel
def _extend_kernel(
    Q,
    K,
    V,
    Out,
    PageTable,
    Rows,
    TokenStarts,
    PrefixLens,
    ExtendLens,
    scale,
    stride_qt,
    stride_qh,
    stride_kp,
    stride_ks,
    stride_kh,
    stride_vp,
    stride_vs,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_pt,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    F32_DOT: tl.constexpr,
    ROUND_BF16: tl.constexpr,
):
    i = tl.program_id(0)
    h = tl.program_id(1)
    m0 = tl.program_id(2) * BLOCK_M
    ext = tl.load(ExtendLens + i).to(tl.int32)
    if m0 < ext:
        prefix = tl.load(PrefixLens + i).to(tl.int32)
        t0 = tl.load(TokenStarts + i).to(tl.int64)
        row = tl.load(Rows + i).to(tl.int64)
        kvh = h // GROUP
        mi = m0 + tl.arange(0, BLOCK_M)  # [BLOCK_M] index among the sequence's new tokens
        mmask = mi < ext
        d = tl.arange(0, BLOCK_D)
        dmask = d < HEAD_DIM
        qmask = mmask[:, None] & dmask[None, :]
        q = tl.load(Q + (t0 + mi)[:, None] * stride_qt + h * stride_qh + d[None, :], mask=qmask, other=0.0)
        if F32_DOT:
            q = q.to(tl.float32)
        q_pos = prefix + mi  # [BLOCK_M] absolute positions of the queries
        end = prefix + tl.minimum(m0 + BLOCK_M, ext)  # keys this block needs: [0, end)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.full([BLOCK_M], 0.0, tl.float32)
        acc = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)
        for n0 in range(0, end, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            nmask = n < end
            page = tl.load(PageTable + row * stride_pt + n // PAGE_SIZE, mask=nmask, other=0).to(tl.int64)
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
            keep = (n[None, :] <= q_pos[:, None]) & nmask[None, :]
            s = tl.where(keep, s * scale, float("-inf"))  # [BLOCK_M, BLOCK_N]
            # key 0 is visible to every row, so after the first block every row's max is finite
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
        out = acc / l_i[:, None]
        if ROUND_BF16:  # round to nearest even by hand (the interpreter's cast truncates)
            u = out.to(tl.uint32, bitcast=True)
            out = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).to(tl.float32, bitcast=True)
        tl.store(
            Out + (t0 + mi)[:, None] * stride_ot + h * stride_oh + d[None, :], out.to(Out.dtype.element_ty), mask=qmask
        )


def launch_config(head_dim: int, dtype: torch.dtype, device: torch.device) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps). GPU: chosen from sm_90 builds (cuobjdump register counts), the largest
    tiles that fit without spills. CPU: the interpreter pays per program and per tile op, not per element."""
    if device.type == "cpu":
        return 32, 32, 4
    if dtype == torch.float32 or head_dim > 128:
        return 32, 32, 8
    return 64, 64, 8


def extend_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    rows: torch.Tensor,
    token_starts: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    scale: float,
    *,
    max_extend_len: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over (cached prefix + new tokens), all read from the cache.

    q: [T, heads, head_dim] (any token/head strides); k_cache, v_cache: [num_pages, page_size, kv_heads, head_dim]
    holding every position up to each sequence's end (new tokens included); page_table: [bs, max_pages] int.
    rows, token_starts, prefix_lens, extend_lens: [n] int on q's device: sequence i uses page_table row rows[i]
    and owns q rows [token_starts[i], token_starts[i] + extend_lens[i]). max_extend_len >= every extend_lens[i]
    (a host int: it sizes the grid). Returns [T, heads, head_dim] in q's dtype (`out` if given); rows of q no
    sequence owns are left as they were.
    """
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_float(name, t)
    tokens, heads, head_dim = q.shape
    _, page_size, kv_heads, kd = k_cache.shape
    if kd != head_dim or v_cache.shape != k_cache.shape or k_cache.dtype != v_cache.dtype:
        raise ValueError(
            f"k_cache {tuple(k_cache.shape)} / v_cache {tuple(v_cache.shape)} do not fit q "
            f"{tuple(q.shape)}: want [num_pages, page_size, kv_heads, {head_dim}] each"
        )
    if heads % kv_heads:
        raise ValueError(f"heads {heads} is not a multiple of kv_heads {kv_heads}")
    n = rows.shape[0]
    if not (token_starts.shape == prefix_lens.shape == extend_lens.shape == (n,)):
        raise ValueError("rows, token_starts, prefix_lens and extend_lens must all be [num_sequences]")
    if out is None:
        out = torch.empty((tokens, heads, head_dim), dtype=q.dtype, device=q.device)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1:
        raise ValueError(f"out must be a {q.dtype} tensor of shape {tuple(q.shape)} with a contiguous last dim")
    if n == 0 or tokens == 0 or max_extend_len < 1:
        return out
    dev = q.device
    block_m, block_n, num_warps = launch_config(head_dim, q.dtype, dev)
    grid = (n, heads, -(-max_extend_len // block_m))
    _extend_kernel.on(dev)[grid](
        q,
        k_cache,
        v_cache,
        out,
        page_table,
        rows,
        token_starts,
        prefix_lens,
        extend_lens,
        float(scale),
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        out.stride(0),
        out.stride(1),
        page_table.stride(0),
        GROUP=heads // kv_heads,
        HEAD_DIM=head_dim,
        PAGE_SIZE=page_size,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=block_dim(head_dim),
        F32_DOT=q.dtype == torch.float32 or dev.type == "cpu",
        ROUND_BF16=round_mode(out.dtype, dev),
        num_warps=num_warps,
    )
    return out
