"""Launching a Triton kernel by the device of its tensors: compiled on CUDA, Triton's interpreter on CPU.

`triton.jit` decides between the two once, at decoration time, from the TRITON_INTERPRET environment variable;
a process serving on a GPU while its tests check the same kernels on CPU needs both. So kernels are written as
plain functions and wrapped here: `kernel.on(device)[grid](...)` builds (once) and returns the compiled
`triton.jit` kernel for CUDA or an interpreted one for CPU. No kernel calls another @jit function, because a
helper can only be one of the two kinds.

Interpreter facts the kernels are written around (measured with triton 3.9 on CPU):
  - bf16 values must be upcast to float32 right after loading, and float32 -> bf16 casts truncate instead of
    rounding to nearest even, so kernels round by hand before a bf16 store (`ROUND_BF16` blocks);
  - there are no bounds checks: every load and store is masked;
  - tl.arange sizes are powers of two, and tl.dot wants every dimension >= 16 (as on the GPU);
  - triton.language's own @jit helpers (tl.sum, tl.max, tl.cdiv, tl.zeros, tl.sigmoid, ...) are compiled-only
    objects unless TRITON_INTERPRET was set before triton was imported, so kernels use builtins only and reduce
    with `tl.reduce(x, axis, tl.standard._sum_combine)` / `tl.standard._elementwise_max`: exactly what tl.sum and
    tl.max expand to when compiled, and what the interpreter maps to numpy's sum and max.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class TritonKernel:
    """A kernel body (a plain function written in triton.language) launchable on CUDA or CPU tensors."""

    def __init__(self, fn: Callable[..., None]) -> None:
        self.fn = fn
        self._compiled: Any = None
        self._interpreted: Any = None

    @property
    def __name__(self) -> str:
        return self.fn.__name__

    def on(self, device: torch.device) -> Any:
        """The launchable kernel for tensors on `device`: index it with the grid and call it."""
        if device.type == "cpu":
            if self._interpreted is None:
                from triton.runtime.interpreter import InterpretedFunction

                self._interpreted = InterpretedFunction(self.fn)
            return self._interpreted
        if device.type != "cuda":
            raise ValueError(f"Triton kernels run on cuda or cpu tensors, not {device.type}; use the torch backend")
        if self._compiled is None:
            import triton

            self._compiled = triton.jit(self.fn)
        return self._compiled


def triton_kernel(fn: Callable[..., None]) -> TritonKernel:
    """Decorator: see TritonKernel."""
    return TritonKernel(fn)


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (>= 1)."""
    return 1 << max(0, int(n) - 1).bit_length()


def block_dim(n: int) -> int:
    """A tl.arange / tl.dot extent covering n: a power of two, at least 16 (tl.dot's minimum on the GPU)."""
    return max(16, next_pow2(n))


def check_float(name: str, t: torch.Tensor) -> None:
    """Kernels handle float32, bfloat16 and float16 and want their last dimension contiguous."""
    if t.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"{name} has dtype {t.dtype}; the Triton kernels take float32, bfloat16 or float16")
    if t.dim() and t.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dimension (stride {t.stride(-1)}); pass .contiguous()")


def round_mode(dtype: torch.dtype, device: torch.device) -> bool:
    """True when a kernel must round float32 -> bf16 to nearest even by hand: bf16 output under the interpreter.

    On the GPU the native cast already rounds to nearest even, so the hand-rounding is skipped there.
    """
    return dtype == torch.bfloat16 and device.type == "cpu"


@functools.cache
def sm_count(device_index: int) -> int:
    """Streaming multiprocessors of a CUDA device (sizes the split-KV decode grid)."""
    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)
