"""The native kernels' C ABI: pdr_kernels.h declares every exported function once, the C definitions match it, and
the loaded library's ctypes restype / argtypes are the header's."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import types
from pathlib import Path

import pytest

from shared.kernels.native import abi, build

NATIVE = Path(build.__file__).parent
SOURCES = sorted(NATIVE.glob("*.c"))


def signature_mismatches(expected: dict[str, abi.Signature], actual: dict[str, abi.Signature]) -> list[str]:
    """What differs between two sets of signatures, one line each (empty: none)."""
    out = [f"{n}: declared in the header, not defined" for n in sorted(expected.keys() - actual.keys())]
    out += [f"{n}: defined, not declared in the header" for n in sorted(actual.keys() - expected.keys())]
    out += [
        f"{n}: {actual[n]} != {expected[n]}"
        for n in sorted(expected.keys() & actual.keys())
        if actual[n] != expected[n]
    ]
    return out


def ctypes_mismatches(lib: object, expected: dict[str, abi.Signature]) -> list[str]:
    """Where `lib`'s functions carry other ctypes types than the header gives (empty: none)."""
    out = []
    for sig in expected.values():
        fn = getattr(lib, sig.name)
        if fn.restype is not sig.restype or tuple(fn.argtypes or ()) != sig.argtypes:
            out.append(f"{sig.name}: restype {fn.restype}, argtypes {fn.argtypes}; the header says {sig}")
    return out


def definitions() -> dict[str, abi.Signature]:
    out: dict[str, abi.Signature] = {}
    for src in SOURCES:
        found = abi.parse(src.read_text(), definitions=True)
        assert not found.keys() & out.keys(), f"{src.name} defines {found.keys() & out.keys()} again"
        out |= found
    return out


def test_header_declares_every_kernel() -> None:
    declared = abi.declared()
    assert len(declared) == 22  # 11 fp32 kernels, 8 bf16 forms, pdr_bf16_kernels and 2 dequantizers
    assert declared["pdr_bf16_kernels"] == abi.Signature("pdr_bf16_kernels", ctypes.c_int, ())
    assert declared["pdr_gemm_vector_bits"] == abi.Signature("pdr_gemm_vector_bits", ctypes.c_int, ())
    assert declared["pdr_silu_mul_f32"].argtypes == (
        *(ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p),
        *(ctypes.c_int64, ctypes.c_int64, ctypes.c_int),
    )


def test_every_source_includes_the_header() -> None:
    assert {s.name for s in SOURCES} == {s.name for s in build._SOURCES}
    for src in SOURCES:
        assert '#include "pdr_kernels.h"' in src.read_text(), f"{src.name} must include pdr_kernels.h"


def test_definitions_match_the_header() -> None:
    assert signature_mismatches(abi.declared(), definitions()) == []


def test_loaded_library_carries_the_header_types() -> None:
    assert ctypes_mismatches(build.load_library(), abi.declared()) == []


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm (binutils)")
def test_library_exports_exactly_the_header() -> None:
    lib = build.load_library()
    res = subprocess.run(["nm", "-D", "--defined-only", lib._name], capture_output=True, text=True, check=True)
    exported = {line.split()[-1] for line in res.stdout.splitlines() if line.split()[-1].startswith("pdr_")}
    assert exported == set(abi.declared())


def test_a_changed_declaration_is_a_mismatch() -> None:
    """The checks above fail when the header and a definition, or the header and ctypes, disagree."""
    header = abi.HEADER.read_text()
    decl = "const float *wp, int64_t n, const float *bias"
    assert header.count(decl) == 1  # in pdr_gemm_f32
    changed = abi.parse(header.replace(decl, "const float *wp, int n, const float *bias"))
    [line] = signature_mismatches(changed, definitions())
    assert line.startswith("pdr_gemm_f32: ")
    dropped = abi.parse(header.replace("int pdr_gemm_vector_bits(void);", ""))
    assert signature_mismatches(dropped, definitions()) == ["pdr_gemm_vector_bits: defined, not declared in the header"]

    lib = build.load_library()
    stale = types.SimpleNamespace(**{n: getattr(lib, n) for n in abi.declared()})
    stale.pdr_gemm_f32 = types.SimpleNamespace(restype=None, argtypes=list(abi.declared()["pdr_gemm_f32"].argtypes))
    stale.pdr_gemm_f32.argtypes[-1] = ctypes.c_int64
    [line] = ctypes_mismatches(stale, abi.declared())
    assert line.startswith("pdr_gemm_f32: ")


def test_parser_takes_only_the_plain_form() -> None:
    sigs = abi.parse("/* pdr_x(int a); */\nfloat pdr_y(const int64_t *a, int64_t b);\nstatic int pdr_z(int a) {")
    assert sigs == {"pdr_y": abi.Signature("pdr_y", ctypes.c_float, (ctypes.c_void_p, ctypes.c_int64))}
    assert set(abi.parse("int pdr_a(void) {\n}\nstatic int pdr_b(int x) {", definitions=True)) == {"pdr_a"}
    with pytest.raises(ValueError, match="'unsigned n' is not one of"):
        abi.parse("void pdr_w(unsigned n);")
    with pytest.raises(ValueError, match="declared twice"):
        abi.parse("void pdr_w(int n);\nvoid pdr_w(int n);")
