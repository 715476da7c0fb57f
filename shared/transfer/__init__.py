"""KV transfer backends behind one interface (`TransferEngine`): NIXL (UCX) and the Mooncake Transfer Engine.

    from shared.transfer import create_engine
    eng = create_engine(cfg.transfer.transfer_backend, name=instance_id, host=cfg.transfer.transfer_host)

Backends are imported lazily by create_engine, so importing this package needs neither wheel.
"""

from __future__ import annotations

from shared.transfer.base import PeerId, TransferEngine, TransferHandle, TransferStatus
from shared.transfer.checksum import checksum_buffers, checksum_pages
from shared.transfer.descs import PageDesc, RegionHandle, coalesce, coalesce_pairs, describe, describe_pages
from shared.transfer.errors import BackendUnavailable, PeerError, RegionError, TransferError, TransferTimeout
from shared.transfer.factory import BACKENDS, create_engine
from shared.transfer.plan import BoundDescs, WritePlan, plan_write

__all__ = [
    "BACKENDS",
    "BackendUnavailable",
    "BoundDescs",
    "PageDesc",
    "PeerError",
    "PeerId",
    "RegionError",
    "RegionHandle",
    "TransferEngine",
    "TransferError",
    "TransferHandle",
    "TransferStatus",
    "TransferTimeout",
    "WritePlan",
    "checksum_buffers",
    "checksum_pages",
    "coalesce",
    "coalesce_pairs",
    "create_engine",
    "describe",
    "describe_pages",
    "plan_write",
]
