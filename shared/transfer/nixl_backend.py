"""NIXL (UCX) backend: one NIXL agent per engine, no progress thread, no listener thread.

Metadata travels through pdrelay's own protocol (endpoint() / connect()), so the agent never opens NIXL's metadata
listener (it binds 0.0.0.0 and needs a listen thread on both sides). With the progress thread off, both sides
must call into the agent for UCX to progress: the writer through poll()/wait(), the receiver through
progress()/notifications(). Between processes on one host UCX picks `cma` (process_vm_writev): one copy.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shared.transfer.base import TransferEngine, TransferStatus
from shared.transfer.descs import RegionHandle
from shared.transfer.endpoint import EndpointInfo
from shared.transfer.errors import BackendUnavailable, PeerError, RegionError, TransferError
from shared.transfer.options import TransferOptions
from shared.transfer.plan import BoundDescs

INSTALL_HINT = (
    "install it with `pip install torch==2.13.0` (CPU torch first, or pip pulls a CUDA build) and then "
    "`pip install nixl-cu12` (the module is nixl_cu12), or run scripts/install.sh"
)
_MEM = {"cpu": "DRAM", "cuda": "VRAM"}


def import_nixl() -> tuple[Any, Any]:
    """(nixl_agent, nixl_agent_config) or BackendUnavailable; tests monkeypatch this to simulate a missing wheel."""
    try:
        from nixl_cu12._api import nixl_agent, nixl_agent_config
    except ImportError as e:
        raise BackendUnavailable(f"transfer backend 'nixl' is not installed ({e}); {INSTALL_HINT}") from None
    return nixl_agent, nixl_agent_config


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def prepare_ucx_env(host: str, options: TransferOptions | None = None) -> None:
    """Choose UCX interfaces and modules before the agent (and with it UCX's config) is created.

    Environment variables are how UCX is configured (NIXL's `ucx_devices` backend parameter did not change the
    advertised interfaces here); a value the operator already set always wins.
    - UCX_NET_DEVICES=lo when we advertise a loopback host: otherwise UCX also advertises and may pick the external
      interface for a peer that is, by our own config, on this host.
    - UCX_MODULES=^ib when the host has no RDMA device: the InfiniBand module loads the wheel's bundled
      libibverbs/libnl, whose library destructor segfaults at process exit (exit code 139 on every clean shutdown),
      and without an RDMA device the module has nothing to offer.
    - UCX_LOG_FILE=stderr: UCX logs (warnings, UCX_PROTO_INFO tables) go to stdout by default, where services
      speak their ready-line protocol.
    - UCX_CMA_SEG_SIZE=16m: cma copies a put in 512 KiB process_vm_writev segments by default; one 16 MiB
      segment per call moved a coalesced 16 MiB write at 0.81x memcpy instead of 0.68x (medians of 3 A/B runs),
      and allocator-placed 16/64 MiB batches at 0.72-0.81x instead of 0.68-0.77x (2 A/B runs; 64m: no better).
    - UCX_TLS / UCX_NET_DEVICES from --ucx-transports / --ib-device (TransferOptions.ucx_env): e.g. rc, cuda_copy
      and cuda_ipc for a GPU pool over RDMA, so KV moves NIC <-> VRAM; unset, UCX picks among what it has.
    Tried and left unset (bench/transfer.py, 16 and 64 MiB, allocator and scattered layouts): UCX_RNDV_THRESH=inf
    and UCX_MAX_RMA_LANES=1 are within noise (a put to host memory is one cma zero-copy, no rendezvous, one
    lane); UCX_PROTO_ENABLE=n makes NIXL's transfers fail ("Unsupported operation"). No knob cuts the ~5.5 us each
    descriptor costs (one process_vm_writev per descriptor): fewer descriptors do, see PageAllocator.
    """
    os.environ.setdefault("UCX_LOG_FILE", "stderr")
    os.environ.setdefault("UCX_CMA_SEG_SIZE", "16m")
    for key, value in (options or TransferOptions()).ucx_env().items():
        os.environ.setdefault(key, value)
    if is_loopback(host):
        os.environ.setdefault("UCX_NET_DEVICES", "lo")
    ib = Path("/sys/class/infiniband")
    if not (ib.is_dir() and any(ib.iterdir())):
        os.environ.setdefault("UCX_MODULES", "^ib")


@contextlib.contextmanager
def ucx_env_for_agent(host: str, options: TransferOptions | None = None) -> Iterator[None]:
    """prepare_ucx_env's choices in force while an agent is created (UCX reads them then), the process's UCX_*
    variables as they were afterwards.

    Left set, they would be inherited by every process this one starts: a test or tool that made a loopback engine
    (UCX_NET_DEVICES=lo) and then starts services on other network namespaces would have them advertise loopback
    only, unreachable from their peers (every hand-off to them rejected with NIXL_ERR_BACKEND).
    """
    before = {k: v for k, v in os.environ.items() if k.startswith("UCX_")}
    prepare_ucx_env(host, options)
    try:
        yield
    finally:
        for key in [k for k in os.environ if k.startswith("UCX_") and k not in before]:
            del os.environ[key]
        os.environ.update(before)


def quiet_nixl_logging() -> None:
    """NIXL's Python logger writes INFO lines to stdout, which would break services' stdout ready-line protocol:
    send them to stderr, at WARNING unless NIXL_LOG_LEVEL (NIXL's own knob) asks for something else."""
    lg = logging.getLogger("nixl")
    for h in lg.handlers:
        if type(h) is logging.StreamHandler and h.stream is not sys.stderr:
            # Assigned, not setStream(): that flushes the old stream first, which may already be closed (an earlier
            # engine in the same process set it to a stderr that was since replaced, as pytest's capture does).
            h.stream = sys.stderr
    if not os.environ.get("NIXL_LOG_LEVEL"):
        lg.setLevel(logging.WARNING)


def _nixl_error(what: str, e: Exception) -> str:
    return f"{what}: {type(e).__name__}: {e}"


class NixlEngine(TransferEngine):
    backend = "nixl"

    def __init__(self, name: str, host: str, options: TransferOptions | None = None) -> None:
        super().__init__(name, host)
        # before the import: UCX reads its global options when its library loads, the rest when the agent is made
        with ucx_env_for_agent(host, options):
            nixl_agent, nixl_agent_config = import_nixl()
            quiet_nixl_logging()
            cfg = nixl_agent_config(enable_prog_thread=False, enable_listen_thread=False, backends=["UCX"])
            try:
                self._agent = nixl_agent(name, cfg)
            except Exception as e:
                why = _nixl_error(f"cannot create NIXL agent {name!r}", e)
                raise BackendUnavailable(f"{why}; {INSTALL_HINT}") from e
        if "UCX" not in self._agent.backends:
            raise BackendUnavailable(f"NIXL agent {name!r} has no UCX backend (plugins: {self._agent.plugin_list})")

    # memory
    def _register_region(self, region: RegionHandle) -> Any:
        try:
            return self._agent.register_memory(
                [(region.addr, region.nbytes, region.device_id, "")], _MEM[region.device]
            )
        except Exception as e:
            raise RegionError(
                _nixl_error(f"NIXL could not register {region.nbytes} bytes on {region.device}", e)
            ) from e

    def _deregister_region(self, token: Any, region: RegionHandle) -> None:
        try:
            self._agent.deregister_memory(token)
        except Exception as e:
            raise RegionError(_nixl_error(f"NIXL could not deregister region {region.region_id}", e)) from e

    # peers
    def _endpoint_payload(self) -> bytes:
        return bytes(self._agent.get_agent_metadata())

    def _load_peer(self, info: EndpointInfo, previous: Any | None) -> Any:
        if previous is not None:  # NIXL keeps the first metadata it loaded for a name: drop it to load the new one
            self._forget_peer(previous)
        try:
            loaded = self._agent.add_remote_agent(info.payload)
        except Exception as e:
            raise PeerError(_nixl_error(f"NIXL rejected the metadata of peer {info.name!r}", e)) from e
        loaded = loaded.decode() if isinstance(loaded, bytes) else str(loaded)
        if loaded != info.name:
            self._forget_peer(loaded)
            raise PeerError(f"peer endpoint says {info.name!r} but its NIXL metadata is agent {loaded!r}")
        return loaded

    def _forget_peer(self, token: Any) -> None:
        try:
            self._agent.remove_remote_agent(token)
        except Exception:  # noqa: BLE001 - already gone is fine
            pass

    # transfers
    def _start_write(self, peer: Any, src: BoundDescs, dst: BoundDescs, notify: bytes) -> Any:
        try:
            local = self._agent.get_xfer_descs(src.descs, _MEM[src.device])
            remote = self._agent.get_xfer_descs(dst.descs, _MEM[dst.device])
            handle = self._agent.initialize_xfer("WRITE", local, remote, peer, notify)
        except Exception as e:
            raise TransferError(_nixl_error(f"NIXL could not prepare a write to {peer!r}", e)) from e
        state = self._agent.transfer(handle)
        if state == "ERR":
            handle.release()
            raise TransferError(f"NIXL refused to post a write to {peer!r}; is the peer still alive?")
        return handle

    def _check_xfer(self, token: Any) -> tuple[TransferStatus, str]:
        try:
            state = self._agent.check_xfer_state(token)
        except Exception as e:  # noqa: BLE001
            return "error", _nixl_error("NIXL transfer failed", e)
        if state == "DONE":
            return "done", ""
        if state == "PROC":
            return "pending", ""
        return "error", "NIXL reported the transfer failed (peer gone or memory invalid)"

    def _release_xfer(self, token: Any) -> None:
        try:
            token.release()  # cancels it when still in flight
        except Exception:  # noqa: BLE001 - NIXL defers a failed release to agent teardown
            pass

    def _drain_notifs(self) -> list[tuple[str, bytes]]:
        out: list[tuple[str, bytes]] = []
        for sender, msgs in self._agent.get_new_notifs().items():
            sender = sender.decode() if isinstance(sender, bytes) else str(sender)
            out.extend((sender, bytes(m)) for m in msgs)
        return out

    def _shutdown(self) -> None:
        del self._agent
