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
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field

from shared.config.cpu_features import parse_cpu_flags
from shared.config.devices import SIMULATE_ENV, SimulatedGpus, local_gpu_index, simulated_from_env

IB_SYSFS = "/sys/class/infiniband"


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

    def gpu_memory(self, gpu: int) -> tuple[int, int]:
        """(free, total) bytes of GPU `gpu` (the host's numbering) now; memory other processes hold is not free.

        nvidia-smi answers without creating a CUDA context in this process (a supervisor that planned eight
        engines would otherwise hold a context on each of their GPUs); torch answers where it is missing."""
        smi = _nvidia_smi_memory(gpu)
        if smi is not None:
            return smi
        import torch

        free, total = torch.cuda.mem_get_info(local_gpu_index(gpu, os.environ))
        return int(free), int(total)

    def describe(self) -> str:
        """How the devices were learnt, for plans and messages."""
        return "this host"

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

    def ib_devices(self) -> tuple[str, ...]:
        """The RDMA devices of this host (the names in /sys/class/infiniband, e.g. mlx5_0)."""
        try:
            return tuple(sorted(os.listdir(IB_SYSFS)))
        except OSError:
            return ()

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


def _nvidia_smi_memory(gpu: int) -> tuple[int, int] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    query = [exe, f"--id={gpu}", "--query-gpu=memory.free,memory.total", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=10, check=True).stdout
        free, total = (int(float(v)) << 20 for v in out.strip().splitlines()[0].split(","))  # MiB
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    return free, total


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
    free_bytes: int | None = None  # free memory of each GPU (default: memory_bytes, nothing else on them)
    cores: int = 2
    modules: frozenset[str] = field(default_factory=frozenset)  # dotted names that count as installed
    libraries: frozenset[str] = field(default_factory=frozenset)
    rdma: tuple[str, ...] = ()  # RDMA devices (/sys/class/infiniband)
    flags: frozenset[str] = field(default_factory=frozenset)  # CPU flags: none, so --dtype auto is float32 on cpu
    compiler: bool = True

    def cuda_available(self) -> bool:
        return self.cuda

    def cuda_device_count(self) -> int:
        return self.gpus if self.cuda else 0

    def device_memory(self, device: str) -> tuple[int, str]:
        return self.memory_bytes, ("CUDA device memory" if device == "cuda" else "MemAvailable host RAM")

    def gpu_memory(self, gpu: int) -> tuple[int, int]:
        return (self.memory_bytes if self.free_bytes is None else self.free_bytes), self.memory_bytes

    def describe(self) -> str:
        return "a described host"

    def cpu_count(self) -> int:
        return self.cores

    def module_available(self, dotted: str) -> bool:
        return dotted in self.modules

    def shared_library_available(self, name: str) -> bool:
        return name in self.libraries

    def ib_devices(self) -> tuple[str, ...]:
        return self.rdma

    def cpu_flags(self) -> frozenset[str]:
        return self.flags

    def c_compiler_available(self) -> bool:
        return self.compiler


@dataclass(frozen=True)
class SimulatedProbe(HostProbe):
    """This host with the GPUs of PDRELAY_SIMULATE_DEVICES instead of its own (all free): plans for a machine one
    does not have (`pdrelay up --dry-run`, `pdrelay config show --plan`). Cores and installed modules are this
    host's."""

    simulated: SimulatedGpus = field(default_factory=lambda: SimulatedGpus(1, 80 << 30))

    def cuda_available(self) -> bool:
        return True

    def cuda_device_count(self) -> int:
        return self.simulated.count

    def device_memory(self, device: str) -> tuple[int, str]:
        if device == "cuda":
            return self.simulated.memory_bytes, f"simulated GPU memory ({SIMULATE_ENV})"
        return super().device_memory(device)

    def gpu_memory(self, gpu: int) -> tuple[int, int]:
        assert 0 <= gpu < self.simulated.count, f"GPU {gpu} of {self.simulated.count} simulated"
        return self.simulated.memory_bytes, self.simulated.memory_bytes

    def describe(self) -> str:
        return f"simulated: {SIMULATE_ENV}={self.simulated.describe()}"


def probe_from_env(env: Mapping[str, str]) -> HostProbe:
    """The probe a command uses: simulated GPUs when PDRELAY_SIMULATE_DEVICES is set, else the real host."""
    simulated = simulated_from_env(env)
    return HostProbe() if simulated is None else SimulatedProbe(simulated)
