"""Device names and GPU numbering: `--device cuda:N`, `--base-gpu-id` / `--gpu-id-step`, CUDA_VISIBLE_DEVICES and
the simulated GPUs of PDRELAY_SIMULATE_DEVICES.

GPU ids in configs are the host's ids (what `nvidia-smi` and the dry-run plan print as cuda:N). A process started
with CUDA_VISIBLE_DEVICES sees only its own GPUs, renumbered from 0: `local_gpu_index` maps a host id to the index
torch uses inside that process.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass

from shared.config.errors import ConfigError

SIMULATE_ENV = "PDRELAY_SIMULATE_DEVICES"
VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"

_UNITS = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40, "kb": 10**3, "mb": 10**6, "gb": 10**9}
_SIMULATE_RE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+(?:\.\d+)?)\s*([A-Za-z]+)\s*$")
_DEVICE_RE = re.compile(r"^cuda:(\d+)$")


class DeviceKind(enum.StrEnum):
    """What --device may say before resolution (after it: cpu or cuda)."""

    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"


@dataclass(frozen=True)
class DeviceName:
    """--device parsed: its kind and, for 'cuda:N', the GPU N."""

    kind: DeviceKind
    gpu: int | None = None


def parse_device(text: str) -> DeviceName:
    """'auto' | 'cpu' | 'cuda' | 'cuda:N'; ConfigError naming the value otherwise."""
    if text in tuple(DeviceKind):
        return DeviceName(DeviceKind(text))
    m = _DEVICE_RE.match(text)
    if m:
        return DeviceName(DeviceKind.CUDA, int(m.group(1)))
    raise ConfigError(f"--device {text} is not a device; use auto, cpu, cuda or cuda:N (e.g. cuda:0)")


def process_gpus(base_gpu_id: int, gpu_id_step: int, count: int) -> tuple[int, ...]:
    """The host GPU ids of a process's `count` ranks: base, base + step, ... (SGLang's placement rule)."""
    return tuple(base_gpu_id + i * gpu_id_step for i in range(count))


def cuda_name(gpu: int) -> str:
    return f"cuda:{gpu}"


def visible_devices_env(gpus: tuple[int, ...]) -> str:
    """CUDA_VISIBLE_DEVICES for a process that owns exactly `gpus`."""
    return ",".join(str(g) for g in gpus)


def local_gpu_index(gpu: int, env: Mapping[str, str]) -> int:
    """The torch index of host GPU `gpu` in a process with this environment: its position in
    CUDA_VISIBLE_DEVICES when that lists it, else the id itself (all GPUs visible)."""
    visible = env.get(VISIBLE_ENV)
    if visible is None or not visible.strip():
        return gpu
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if str(gpu) in ids:
        return ids.index(str(gpu))
    if gpu < len(ids):
        return gpu  # not listed (or listed by UUID): the id is read in this process's own numbering
    raise ConfigError(
        f"--base-gpu-id {gpu} is not among this process's GPUs ({VISIBLE_ENV}={visible}); "
        f"use one of {', '.join(ids)} or unset {VISIBLE_ENV}"
    )


@dataclass(frozen=True)
class SimulatedGpus:
    """PDRELAY_SIMULATE_DEVICES=8x80GiB: 8 GPUs of 80 GiB each, all free."""

    count: int
    memory_bytes: int

    def describe(self) -> str:
        return f"{self.count}x{self.memory_bytes / (1 << 30):g}GiB"


def parse_simulated(text: str) -> SimulatedGpus:
    """'8x80GiB' (count x memory per GPU; units KiB..TiB, KB..GB) -> SimulatedGpus; ConfigError otherwise."""
    m = _SIMULATE_RE.match(text)
    unit = m.group(3).lower() if m else ""
    if m is None or unit not in _UNITS or int(m.group(1)) < 1:
        raise ConfigError(
            f"{SIMULATE_ENV}={text!r} is not COUNTxMEMORY; write it as e.g. 8x80GiB (8 GPUs of 80 GiB each)"
        )
    return SimulatedGpus(int(m.group(1)), int(float(m.group(2)) * _UNITS[unit]))


def simulated_from_env(env: Mapping[str, str]) -> SimulatedGpus | None:
    text = env.get(SIMULATE_ENV, "")
    return parse_simulated(text) if text.strip() else None


def torch_device(device: str, base_gpu_id: int, env: Mapping[str, str]) -> str:
    """The torch device string of a resolved --device: 'cpu', or 'cuda:k' for host GPU base_gpu_id as this process
    numbers it."""
    return f"cuda:{local_gpu_index(base_gpu_id, env)}" if device == DeviceKind.CUDA else str(device)
