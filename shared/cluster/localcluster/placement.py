"""Which GPUs each process of `pdrelay up` gets: every engine process its own, the host's GPUs filled in start
order from --base-gpu-id in steps of --gpu-id-step (a process with tp_size x dp_size ranks takes that many), then
the encoders (their own GPU, a GPU shared with an engine, or none: --encoder-gpu).

A layout that needs more GPUs than the host has is refused with the counts, before anything starts. Processes get
CUDA_VISIBLE_DEVICES (their GPUs only) and CUDA_DEVICE_ORDER=PCI_BUS_ID (so cuda:N means what nvidia-smi calls N);
processes without a GPU get an empty CUDA_VISIBLE_DEVICES, so none of them opens a context on GPU 0.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from shared.config.devices import VISIBLE_ENV, cuda_name, visible_devices_env

ENGINE_ROLES = ("prefill", "decode", "worker")
ENCODER_ROLE = "encoder"
# What an encoder that shares an engine's GPU is expected to hold there (an embedding model or a vision tower with
# its activations); the engine's memory plan leaves it free.
SHARED_ENCODER_BYTES = 2 << 30


class EncoderGpu(enum.StrEnum):
    """Where `pdrelay up` puts encoders on a GPU host (--encoder-gpu)."""

    OWN = "own"  # a GPU of their own, after the engines'
    SHARED = "shared"  # the first GPU of an engine process (round robin), which plans around it
    CPU = "cpu"  # no GPU: --device cpu


@dataclass(frozen=True)
class GpuLayout:
    """The host's GPUs and how `pdrelay up` fills them."""

    count: int
    base: int = 0
    step: int = 1
    encoder: EncoderGpu = EncoderGpu.OWN


@dataclass(frozen=True)
class Request:
    """A process that wants GPUs: its instance id, role and number of GPUs (its tp_size x dp_size ranks)."""

    iid: str
    role: str
    ranks: int = 1


@dataclass(frozen=True)
class Placement:
    """The GPUs of one process (host ids; empty: none) and, for a shared encoder, the engine it shares with."""

    gpus: tuple[int, ...] = ()
    shares_with: str = ""
    cpu: bool = False  # run on the CPU (an encoder with --encoder-gpu cpu)

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(cuda_name(g) for g in self.gpus) or (("cpu",) if self.cpu else ())

    def env(self) -> dict[str, str]:
        """The child's CUDA environment."""
        return {VISIBLE_ENV: visible_devices_env(self.gpus), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def _describe(requests: Sequence[Request]) -> str:
    counts: dict[tuple[str, int], int] = {}
    for r in requests:
        counts[(r.role, r.ranks)] = counts.get((r.role, r.ranks), 0) + 1
    parts = [f"{n} {role}" + (f" x {ranks} GPUs" if ranks > 1 else "") for (role, ranks), n in counts.items()]
    return " + ".join(parts)


def place(requests: Sequence[Request], layout: GpuLayout) -> dict[str, Placement]:
    """Placements of every request (engines first, in the given order, then encoders). ValueError naming the
    counts when the host has too few GPUs."""
    engines = [r for r in requests if r.role in ENGINE_ROLES]
    encoders = [r for r in requests if r.role == ENCODER_ROLE]
    own = engines + (encoders if layout.encoder == EncoderGpu.OWN else [])
    need = sum(r.ranks for r in own)
    last = layout.base + (need - 1) * layout.step
    if need and last >= layout.count:
        step = f" in steps of {layout.step} (--gpu-id-step)" if layout.step != 1 else ""
        hint = " or run encoders with --encoder-gpu shared (or cpu)" if encoders and own is not engines else ""
        raise ValueError(
            f"{_describe(own)} process(es) need {need} GPUs from cuda:{layout.base}{step}, up to cuda:{last}, but "
            f"this host has {layout.count}; start fewer instances, lower --tp-size / --dp-size{hint}"
        )
    out: dict[str, Placement] = {}
    cursor = layout.base
    for r in own:
        out[r.iid] = Placement(tuple(cursor + i * layout.step for i in range(r.ranks)))
        cursor += r.ranks * layout.step
    for k, r in enumerate(encoders):
        if layout.encoder == EncoderGpu.CPU:
            out[r.iid] = Placement(cpu=True)
        elif layout.encoder == EncoderGpu.SHARED:
            if not engines:
                raise ValueError("--encoder-gpu shared: no engine process to share a GPU with; use own or cpu")
            host = engines[k % len(engines)]
            out[r.iid] = Placement((out[host.iid].gpus[0],), shares_with=host.iid)
    return out


def shared_bytes(placements: dict[str, Placement], iid: str) -> int:
    """Memory that encoders sharing `iid`'s GPU will hold there."""
    return SHARED_ENCODER_BYTES * sum(1 for p in placements.values() if p.shares_with == iid)


def next_free(layout: GpuLayout, used: set[int], ranks: int) -> tuple[int, ...]:
    """GPUs for a process started later (`pdrelay scale`): the first `ranks` free ones of the layout's sequence."""
    free = [g for g in range(layout.base, layout.count, layout.step) if g not in used]
    if len(free) < ranks:
        raise ValueError(
            f"no free GPU left for another process ({ranks} needed, {len(used)} of {layout.count} in use); "
            "scale another role down first"
        )
    return tuple(free[:ranks])
