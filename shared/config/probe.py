"""What resolution passes may ask about the host: CUDA, memory, cores, installed modules and libraries.

Passes never look at the machine directly; they ask a probe, so tests (and `config show` for another machine)
can pass a `StaticProbe` instead. torch is imported lazily: the gateway and `pdrelay --help` should not pay for it
unless a device has to be auto-detected.
"""

from __future__ import annotations

import ctypes.util
import importlib.machinery
import importlib.util
import os
import shutil
from dataclasses import dataclass, field

from shared.config.cpu_features import parse_cpu_flags


class HostProbe:
    """The real machine."""

    def cuda_available(self) -> bool:
        if importlib.util.find_spec("torch") is None:
            return False
        import torch

        return bool(torch.cuda.is_available())

    def cuda_device_count(self) -> int:
        if not self.cuda_available():
            return 0
        import torch

        return int(torch.cuda.device_count())

    def device_memory(self, device: str) -> tuple[int, str]:
        """(bytes, what was measured): total memory of CUDA device 0, or MemAvailable host RAM on cpu."""
        if device == "cuda":
            import torch

            _free, total = torch.cuda.mem_get_info()
            return int(total), "CUDA device memory"
        return _mem_available(), "MemAvailable host RAM"

    def cpu_count(self) -> int:
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

    def module_available(self, dotted: str) -> bool:
        """Whether `dotted` (e.g. "nixl_cu12._api") can be found, without importing it or its parent packages.

        importlib.util.find_spec("a.b") would import package `a` (for nixl that loads native libraries and logs),
        so submodules are looked up in the parent's search path instead.
        """
        first, *rest = dotted.split(".")
        spec = importlib.util.find_spec(first)
        for part in rest:
            if spec is None or not spec.submodule_search_locations:
                return False
            spec = importlib.machinery.PathFinder.find_spec(part, list(spec.submodule_search_locations))
        return spec is not None

    def shared_library_available(self, name: str) -> bool:
        """Whether the dynamic loader knows lib<name> (e.g. "ibverbs" for mooncake's engine)."""
        return ctypes.util.find_library(name) is not None

    def cpu_flags(self) -> frozenset[str]:
        """The CPU's feature flags (/proc/cpuinfo's first `flags` line; empty where there is none)."""
        try:
            with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
                for line in f:
                    if line.startswith("flags"):
                        return parse_cpu_flags(line)
        except OSError:
            pass
        return frozenset()

    def c_compiler_available(self) -> bool:
        """Whether a C compiler is installed to build the native CPU kernels ($CC, cc, gcc or clang)."""
        return any(name and shutil.which(name) for name in (os.environ.get("CC"), "cc", "gcc", "clang"))


def _mem_available() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the file speaks kB
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class StaticProbe(HostProbe):
    """A described machine: for tests, and for resolving a config meant for another host."""

    cuda: bool = False
    gpus: int = 0
    memory_bytes: int = 16 << 30
    cores: int = 2
    modules: frozenset[str] = field(default_factory=frozenset)  # dotted names that count as installed
    libraries: frozenset[str] = field(default_factory=frozenset)
    flags: frozenset[str] = field(default_factory=frozenset)  # CPU flags: none, so --dtype auto is float32 on cpu
    compiler: bool = True

    def cuda_available(self) -> bool:
        return self.cuda

    def cuda_device_count(self) -> int:
        return self.gpus if self.cuda else 0

    def device_memory(self, device: str) -> tuple[int, str]:
        return self.memory_bytes, ("CUDA device memory" if device == "cuda" else "MemAvailable host RAM")

    def cpu_count(self) -> int:
        return self.cores

    def module_available(self, dotted: str) -> bool:
        return dotted in self.modules

    def shared_library_available(self, name: str) -> bool:
        return name in self.libraries

    def cpu_flags(self) -> frozenset[str]:
        return self.flags

    def c_compiler_available(self) -> bool:
        return self.compiler
