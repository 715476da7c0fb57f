"""The native kernels' dispatch as a pure function of the CPU's flags, and this host's build agreeing with it."""

from __future__ import annotations

import pytest

from shared.config.cpu_features import CpuKernelSet, cpu_auto_dtype, cpu_kernel_set, parse_cpu_flags
from shared.config.probe import HostProbe

BF16 = "flags\t\t: fpu sse2 avx2 fma avx512f avx512dq avx512bw avx512vl avx512_bf16 avx512_vnni"
AVX512 = "flags\t\t: fpu sse2 avx2 fma avx512f avx512dq avx512bw avx512vl"
AVX2 = "flags\t\t: fpu sse2 avx avx2 fma"


@pytest.mark.parametrize(
    ("line", "kernels", "dtype"),
    [
        (BF16, CpuKernelSet.AVX512_BF16, "bfloat16"),
        (AVX512, CpuKernelSet.AVX512, "float32"),
        (AVX2, CpuKernelSet.AVX2, "float32"),
        ("flags : fpu sse2", CpuKernelSet.PLAIN, "float32"),
        ("flags : fpu avx512_bf16", CpuKernelSet.PLAIN, "float32"),  # bf16 without AVX-512 tiles: no kernels for it
    ],
)
def test_dispatch_is_a_function_of_the_flags(line: str, kernels: CpuKernelSet, dtype: str) -> None:
    flags = parse_cpu_flags(line)
    assert cpu_kernel_set(flags) is kernels
    assert cpu_auto_dtype(flags, compiler=True)[0] == dtype
    assert cpu_auto_dtype(flags, compiler=False)[0] == "float32"  # no compiler, no native kernels at all


def test_this_hosts_build_agrees_with_its_flags() -> None:
    """The library is built with -march=native: the compiler's view of the CPU is the dispatch's."""
    from shared.kernels.native.build import native_available

    if not native_available()[0]:
        pytest.skip("native kernels unavailable here")
    from shared.kernels.native import gemm

    kernels = cpu_kernel_set(HostProbe().cpu_flags())
    assert gemm.bf16_kernels() == (kernels is CpuKernelSet.AVX512_BF16)
    bits = {CpuKernelSet.AVX512_BF16: 512, CpuKernelSet.AVX512: 512, CpuKernelSet.AVX2: 256, CpuKernelSet.PLAIN: 0}
    assert gemm.vector_bits() == bits[kernels]
