"""Which native kernel set a CPU runs, as a pure function of its flags (the `flags` line of /proc/cpuinfo).

The native kernels are built with -march=native (shared/kernels/native/build.py), so the compiler sees the same
flags: AVX-512 tiles where the CPU has avx512f (+ bw, vl), AVX2 + FMA tiles on AVX2-only CPUs, and the bf16 kernels
(vdpbf16ps) only where it has avx512_bf16. `--dtype auto` on cpu follows the same decision (resolve_dtype): bf16
where the bf16 kernels run, as vLLM-cpu downcasts to bf16 there, float32 elsewhere, where a bf16 model would fall
back to the slow torch reference ops.
"""

from __future__ import annotations

import enum

from shared.config.choices import Dtype

BF16_FLAGS = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512_bf16"})


class CpuKernelSet(enum.Enum):
    """The vector path of the native kernels on a CPU."""

    AVX512_BF16 = "avx512_bf16"  # AVX-512 tiles, bf16 kernels (vdpbf16ps)
    AVX512 = "avx512"  # AVX-512 tiles, float32 only
    AVX2 = "avx2"  # AVX2 + FMA tiles, float32 only
    PLAIN = "plain"  # plain C loops


def parse_cpu_flags(line: str) -> frozenset[str]:
    """`flags : fpu vme ... avx512_bf16` (a /proc/cpuinfo line, or just the words) -> the set of flags."""
    return frozenset(line.split(":", 1)[-1].split())


def cpu_kernel_set(flags: frozenset[str]) -> CpuKernelSet:
    """The kernel set a CPU with these flags runs."""
    if BF16_FLAGS <= flags:
        return CpuKernelSet.AVX512_BF16
    if {"avx512f", "avx512bw", "avx512vl"} <= flags:
        return CpuKernelSet.AVX512
    if {"avx2", "fma"} <= flags:
        return CpuKernelSet.AVX2
    return CpuKernelSet.PLAIN


def cpu_auto_dtype(flags: frozenset[str], compiler: bool) -> tuple[Dtype, str]:
    """(dtype, why) for `--dtype auto` on a CPU with these flags, where a C compiler is (or is not) installed."""
    kernels = cpu_kernel_set(flags)
    if kernels is CpuKernelSet.AVX512_BF16 and compiler:
        amx = " (AMX-BF16 present, not used yet)" if "amx_bf16" in flags else ""
        return Dtype.BFLOAT16, f"auto: bfloat16 on cpu: avx512_bf16 runs the native bf16 kernels{amx}"
    if kernels is CpuKernelSet.AVX512_BF16:
        return Dtype.FLOAT32, "auto: float32 on cpu: no C compiler to build the native bf16 kernels (install gcc)"
    return Dtype.FLOAT32, f"auto: float32 on cpu: no avx512_bf16 ({kernels.value} kernels run float32)"
