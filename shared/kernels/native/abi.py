"""The native kernels' C ABI as ctypes types, read from pdr_kernels.h (the one place each signature is written).

build.py sets every exported function's restype and argtypes from `declared()`, so a wrapper's call is checked
against the C declaration (ctypes raises on a wrong argument count or type), and the compiler checks each C
definition against the same declaration (every kernel source includes the header). The header keeps the plain form
this module parses: one declaration per function, `RET pdr_NAME(TYPE NAME, ...);`, with the types in _SCALARS or
pointers (passed as addresses: ctypes.c_void_p takes the ints `tensor.data_ptr()` returns).
"""

from __future__ import annotations

import ctypes
import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

HEADER = Path(__file__).with_name("pdr_kernels.h")

CType: TypeAlias = "type[ctypes._SimpleCData[Any]]"  # c_int, c_int64, c_float, c_void_p

_SCALARS: dict[str, CType | None] = {
    "void": None,
    "int": ctypes.c_int,
    "int64_t": ctypes.c_int64,
    "float": ctypes.c_float,
}
_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)
# RET pdr_NAME(PARAMS) followed by `;` (a declaration) or `{` (a definition); `static` functions are not exported
_SIGNATURE = re.compile(
    r"^(?!static\b)(?P<ret>[A-Za-z_][\w\s*]*?)\s*\b(?P<name>pdr_\w+)\s*\((?P<params>[^()]*)\)\s*(?P<end>[;{])",
    re.MULTILINE,
)


@dataclass(frozen=True)
class Signature:
    """One exported function: the ctypes restype (None: void) and argtypes its declaration gives."""

    name: str
    restype: CType | None
    argtypes: tuple[CType, ...]


def _ctype(decl: str, where: str) -> CType | None:
    """`const float *x` -> c_void_p, `int64_t n` -> c_int64, `void` -> None (a return type, or no parameters)."""
    if "*" in decl:
        return ctypes.c_void_p
    words = [w for w in decl.split() if w != "const"]
    if len(words) > 2 or not words or words[0] not in _SCALARS:
        raise ValueError(
            f"{HEADER.name}: {where}: {decl.strip()!r} is not one of {sorted(_SCALARS)} or a pointer; "
            "pass other values through a pointer, or add the type to abi._SCALARS"
        )
    return _SCALARS[words[0]]


def parse(text: str, *, definitions: bool = False) -> dict[str, Signature]:
    """The `pdr_*` declarations in C source `text` (with definitions=True: the non-static definitions instead)."""
    out: dict[str, Signature] = {}
    for m in _SIGNATURE.finditer(_COMMENT.sub(" ", text)):
        if (m["end"] == "{") != definitions:
            continue
        name, params = m["name"], m["params"].strip()
        args = [] if params in ("", "void") else [_ctype(p, f"{name}'s parameters") for p in params.split(",")]
        if name in out:
            raise ValueError(f"{HEADER.name}: {name} is declared twice; declare each function once")
        out[name] = Signature(name, _ctype(m["ret"], f"{name}'s return type"), tuple(a for a in args if a))
    return out


@functools.lru_cache(maxsize=1)
def declared() -> dict[str, Signature]:
    """Every function pdr_kernels.h declares, by name."""
    return parse(HEADER.read_text(encoding="utf-8"))


def bind(lib: ctypes.CDLL) -> None:
    """Sets each declared function's restype and argtypes on `lib` (AttributeError: a declared function is missing)."""
    for sig in declared().values():
        fn = getattr(lib, sig.name)
        fn.restype = sig.restype
        fn.argtypes = list(sig.argtypes)
