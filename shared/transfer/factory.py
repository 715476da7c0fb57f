"""create_engine(backend, name=..., host=...): the only place that maps a backend name to its class."""

from __future__ import annotations

from shared.config.choices import TransferBackend
from shared.transfer.base import TransferEngine
from shared.transfer.options import TransferOptions

BACKENDS: tuple[str, ...] = ("nixl", "mooncake")


def create_engine(backend: str, *, name: str, host: str, options: TransferOptions | None = None) -> TransferEngine:
    """A started engine of `backend` ("nixl" | "mooncake") named `name` (unique per cluster: the instance id),
    advertising `host` (cfg.transfer.transfer_host) to peers, reaching them as `options` say (default: TCP / UCX's
    own choice). Raises BackendUnavailable with the install command when the backend cannot be imported, ValueError
    for an unknown backend name."""
    options = options or TransferOptions()
    if backend == TransferBackend.NIXL:
        from shared.transfer.nixl_backend import NixlEngine

        return NixlEngine(name, host, options)
    if backend == TransferBackend.MOONCAKE:
        from shared.transfer.mooncake_backend import MooncakeEngine

        return MooncakeEngine(name, host, options.protocol, options.ib_devices)
    raise ValueError(f"--transfer-backend {backend!r} is not one of {BACKENDS}; try --transfer-backend nixl")
