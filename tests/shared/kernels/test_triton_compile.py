"""Every Triton kernel compiles for a Hopper GPU (sm_90, the H200) down to a cubin, on a machine without one, and
the launch configurations the wrappers pick need no register spills.

The interpreter tests run the kernels' Python; this catches what only the compiler sees (types, loop-carried
values, tl.dot shapes and precisions, reductions) in the constexpr configurations the wrappers launch: bf16 and
float32, the head sizes of the bundled model and of Llama-3-8B. Pointers and strides are marked 16-divisible, as
Triton's launcher specialises them for real pool and activation tensors. Compilation uses the ptxas and cuobjdump
that ship with triton; no driver is needed."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from shared.kernels.triton import activation, decode_attention, extend_attention, kv_pack, rms_norm, rotary
from shared.kernels.triton.launch import TritonKernel

I32 = "i32"
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
Case = tuple[TritonKernel, dict[str, str], dict[str, Any], int]  # kernel, signature, constexprs, num_warps
# integer arguments that are multiples of 16 in real launches (page_table's row stride and counts may not be)
ALIGNED = re.compile(r"stride_(?!pt$)\w+|d|inter|half|words|src_stride|dst_stride")


def _attention_strides(prefix: str) -> dict[str, str]:
    return {f"stride_{prefix}p": I32, f"stride_{prefix}s": I32, f"stride_{prefix}h": I32}


def decode_partial(dt: str, group: int, d: int) -> Case:
    block_n, warps = decode_attention.launch_config(d, DTYPES[dt])
    sig = {
        "Q": f"*{dt}",
        "K": f"*{dt}",
        "V": f"*{dt}",
        "PageTable": "*i64",
        "SeqLens": "*i64",
        "MidO": "*fp32",
        "MidLse": "*fp32",
        "scale": "fp32",
        "num_heads": I32,
        "num_splits": I32,
        "stride_qb": I32,
        "stride_qh": I32,
        **_attention_strides("k"),
        **_attention_strides("v"),
        "stride_pt": I32,
    }
    const = {
        "GROUP": group,
        "HEAD_DIM": d,
        "PAGE_SIZE": 16,
        "BLOCK_H": max(16, group),
        "BLOCK_N": block_n,
        "BLOCK_D": d,
        "F32_DOT": dt == "fp32",
    }
    return decode_attention._decode_partial_kernel, sig, const, warps


def decode_merge(dt: str, d: int) -> Case:
    sig = {
        "MidO": "*fp32",
        "MidLse": "*fp32",
        "Out": f"*{dt}",
        "num_heads": I32,
        "num_splits": I32,
        "stride_ob": I32,
        "stride_oh": I32,
    }
    return (
        decode_attention._decode_merge_kernel,
        sig,
        {"HEAD_DIM": d, "BLOCK_S": 4, "BLOCK_D": d, "ROUND_BF16": False},
        4,
    )


def extend(dt: str, group: int, d: int) -> Case:
    block_m, block_n, warps = extend_attention.launch_config(d, DTYPES[dt], torch.device("cuda"))
    sig = {
        "Q": f"*{dt}",
        "K": f"*{dt}",
        "V": f"*{dt}",
        "Out": f"*{dt}",
        "PageTable": "*i64",
        "Rows": "*i64",
        "TokenStarts": "*i64",
        "PrefixLens": "*i64",
        "ExtendLens": "*i64",
        "scale": "fp32",
        "stride_qt": I32,
        "stride_qh": I32,
        **_attention_strides("k"),
        **_attention_strides("v"),
        "stride_ot": I32,
        "stride_oh": I32,
        "stride_pt": I32,
    }
    const = {
        "GROUP": group,
        "HEAD_DIM": d,
        "PAGE_SIZE": 16,
        "BLOCK_M": block_m,
        "BLOCK_N": block_n,
        "BLOCK_D": d,
        "F32_DOT": dt == "fp32",
        "ROUND_BF16": False,
    }
    return extend_attention._extend_kernel, sig, const, warps


def norm(dt: str, residual: bool) -> Case:
    sig = {
        "X": f"*{dt}",
        "R": f"*{dt}",
        "W": f"*{dt}",
        "Out": f"*{dt}",
        "ResOut": f"*{dt}",
        "d": I32,
        "w_rows": I32,
        "eps": "fp32",
        "stride_x": I32,
        "stride_r": I32,
        "stride_o": I32,
        "stride_ro": I32,
        "stride_w": I32,
    }
    return (
        rms_norm._rms_norm_kernel,
        sig,
        {"BLOCK_D": 1024, "HAS_RESIDUAL": residual, "ROUND_X_BF16": False, "ROUND_OUT_BF16": False},
        4,
    )


def rope(dt: str) -> Case:
    sig = {
        "X": f"*{dt}",
        "Cos": f"*{dt}",
        "Sin": f"*{dt}",
        "Out": f"*{dt}",
        "heads": I32,
        "half": I32,
        "stride_xt": I32,
        "stride_xh": I32,
        "stride_ct": I32,
        "stride_st": I32,
        "stride_ot": I32,
        "stride_oh": I32,
    }
    return rotary._rotary_kernel, sig, {"BLOCK_H": 64, "BLOCK_HALF": 64, "ROUND_BF16": False}, 4


def silu(dt: str) -> Case:
    sig = {"X": f"*{dt}", "Out": f"*{dt}", "inter": I32, "stride_x": I32, "stride_o": I32}
    return activation._silu_and_mul_kernel, sig, {"BLOCK": 1024, "ROUND_BF16": False}, 4


def pack(direction: bool) -> Case:
    sig = {"Src": "*i32", "Dst": "*i32", "Ids": "*i64", "words": I32, "src_stride": I32, "dst_stride": I32}
    return kv_pack._copy_pages_kernel, sig, {"BLOCK": 2048, "PACK": direction}, 4


CASES = {
    "decode bf16 9/3x64": decode_partial("bf16", 3, 64),
    "decode bf16 32/8x128": decode_partial("bf16", 4, 128),
    "decode fp32 4/2x16": decode_partial("fp32", 2, 16),
    "decode fp32 32/8x128": decode_partial("fp32", 4, 128),
    "decode merge bf16": decode_merge("bf16", 128),
    "extend bf16 32/8x128": extend("bf16", 4, 128),
    "extend fp32 9/3x64": extend("fp32", 3, 64),
    "extend fp32 32/8x128": extend("fp32", 4, 128),
    "rms_norm bf16 + residual": norm("bf16", True),
    "rms_norm fp32": norm("fp32", False),
    "rotary bf16": rope("bf16"),
    "silu_and_mul bf16": silu("bf16"),
    "kv pack": pack(True),
    "kv unpack": pack(False),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_kernel_compiles_for_sm90_without_spills(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # a real compile, not a hit in the user's cache
    kernel, sig, const, warps = CASES[case]
    fn = triton.jit(kernel.fn)
    assert set(sig) | set(const) == set(fn.arg_names), "the signature lists every kernel argument"
    full = {**sig, **{k: "constexpr" for k in const}}
    attrs = {
        (fn.arg_names.index(k),): [["tt.divisibility", 16]]
        for k, v in sig.items()
        if v.startswith("*") or ALIGNED.fullmatch(k)
    }
    compiled = triton.compile(
        ASTSource(fn, full, const, attrs), target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}
    )
    assert ".entry " + kernel.fn.__name__ in compiled.asm["ptx"]
    cubin = tmp_path / "kernel.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    tool = Path(os.path.dirname(triton.__file__)) / "backends" / "nvidia" / "bin" / "cuobjdump"
    usage = subprocess.run([str(tool), "-res-usage", str(cubin)], capture_output=True, text=True, check=True).stdout
    match = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    assert match is not None, usage
    assert int(match.group(2)) == 0, f"{case} spills registers ({match.group(0)}); pick smaller tiles or more warps"
