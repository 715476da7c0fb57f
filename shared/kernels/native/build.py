"""Build and load the native CPU kernels (plain C, loaded with ctypes: no Python headers, no torch headers).

The shared library is compiled on first use with the host's C compiler, for the host's CPU (-march=native), into a
cache directory keyed by the source, the compiler and the CPU flags, so a second process (or a second service on the
same box) loads it in milliseconds. Concurrent first uses build once: an exclusive file lock around the build, the
result moved into place atomically. Without a C compiler the kernels are reported unavailable (with the reason) and
callers keep the torch reference path.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from shared.kernels.native import abi

log = logging.getLogger(__name__)

_SOURCES = tuple(
    Path(__file__).with_name(n)
    for n in (
        "paged_decode.c",
        "paged_extend.c",
        "skinny_gemm.c",
        "skinny_gemm_bf16.c",
        "elementwise.c",
        "decode_layers.c",
        "dequant.c",
    )
)
_HEADERS = (abi.HEADER, abi.HEADER.with_name("bf16.h"))  # included by the sources: part of the cache key
# -ffast-math: lets the compiler vectorise the dot-product sums and call glibc's vector expf (the kernel keeps every
# value finite, which fast-math assumes). Compile only: linking with -ffast-math adds crtfastmath.o, whose constructor
# turns on flush-to-zero for the whole process when the library loads (torch's and Python's subnormals would vanish),
# so the link step below runs without it. -fopenmp links libgomp.so.1: loaded after torch, the dynamic loader binds
# it to torch's already loaded copy of that soname, so the kernel's parallel loop shares torch's thread pool.
# -Wmissing-prototypes makes every exported function come from pdr_kernels.h, the declarations ctypes is set up from
# (abi.py). `make lint` builds the AVX-512, AVX2 and plain x86-64 paths with these flags plus -Werror whatever the
# host runs (scripts/check_native.py), so no warning lands. The build on a user's machine keeps warnings warnings:
# another compiler's new warning must not turn the native kernels off there (a definition that contradicts the
# header is an error under any flags).
WARNINGS = ("-Wall", "-Wextra", "-Wmissing-prototypes")
CFLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC", *WARNINGS, "-c")
LDFLAGS = ("-shared", "-fopenmp", "-lm")


def cache_dir() -> Path:
    """$PDRELAY_KERNEL_CACHE, else $XDG_CACHE_HOME/pdrelay/kernels, else ~/.cache/pdrelay/kernels."""
    env = os.environ.get("PDRELAY_KERNEL_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pdrelay" / "kernels"


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return line
    except OSError:
        pass
    return os.uname().machine


def _key(cc: str) -> str:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    h = hashlib.sha256()
    parts = [src.read_bytes() for src in (*_SOURCES, *_HEADERS)] + [
        " ".join(CFLAGS + LDFLAGS).encode(),
        version.encode(),
    ]
    for part in (*parts, _cpu_flags().encode()):
        h.update(part)
    return h.hexdigest()[:16]


def _build(cc: str, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building the same library
        if out.exists():
            return
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
        os.close(fd)
        objs = [f"{tmp[:-3]}.{src.stem}.o" for src in _SOURCES]
        try:
            cmds = [[cc, *CFLAGS, "-o", obj, str(src)] for src, obj in zip(_SOURCES, objs, strict=True)]
            for cmd in [*cmds, [cc, "-o", tmp, *objs, *LDFLAGS]]:
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
                if res.returncode != 0:
                    raise RuntimeError(f"{' '.join(cmd[:2])} failed: {res.stderr.strip()[-500:]}")
            os.replace(tmp, out)
        finally:
            for leftover in (tmp, *objs):
                if os.path.exists(leftover):
                    os.unlink(leftover)


class NativeUnavailable(RuntimeError):
    """The native kernels cannot be built or loaded here; the message says why."""


@functools.lru_cache(maxsize=1)
def load_library() -> ctypes.CDLL:
    """The compiled kernels (built on first use). Raises NativeUnavailable with the reason."""
    import torch  # noqa: F401  (loaded first, so the kernels bind to torch's OpenMP runtime, not a second one)

    cc = _compiler()
    if cc is None:
        raise NativeUnavailable("no C compiler found (install gcc, or set CC)")
    try:
        path = cache_dir() / f"pdrelay_kernels_{_key(cc)}.so"
        if not path.exists():
            log.info("building native CPU kernels with %s into %s", cc, path.parent)
            _build(cc, path)
        lib = ctypes.CDLL(str(path))
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        raise NativeUnavailable(f"building the native CPU kernels failed: {e}") from e
    abi.bind(lib)  # every exported function's restype and argtypes, from pdr_kernels.h
    return lib


def native_available() -> tuple[bool, str]:
    """(True, "") or (False, why)."""
    try:
        load_library()
    except NativeUnavailable as e:
        return False, str(e)
    return True, ""
