"""Wiring an engine service (prefill, decode, the colocated worker) to the cluster's kvstore: its KVStoreClient,
built from the service's config once its engine and transfer engine exist."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.config.choices import KVStoreUse
from shared.serving.kv_transfer import KVTransfer, transfer_options
from shared.serving.kvstore_client import KVStoreClient

if TYPE_CHECKING:
    from shared.serving.engine_service import EngineService


async def attach_kvstore(svc: EngineService, transfer: KVTransfer | None) -> KVStoreClient | None:
    """The client of an engine service (after its engine and transfer engine exist); None with --kvstore-use off.
    Without a transfer engine of its own (the colocated worker) it builds one over the KV pool once a store shows
    up, with the backend the store advertises."""
    cfg = svc.cfg
    kc = cfg.kvstore_client
    if kc.kvstore_use == KVStoreUse.OFF or svc.etcd is None or svc.aengine is None:
        return None
    from shared.service import advertised_host

    engine = svc.aengine.engine
    host = cfg.transfer.transfer_host if cfg.has("transfer") else advertised_host(cfg.grpc.host)

    options = transfer_options(cfg.transfer) if cfg.has("transfer") else None

    def make_transfer(backend: str) -> KVTransfer:
        return KVTransfer(backend, svc.instance_id, host, engine.runner.kv, options)

    client = KVStoreClient(
        kc,
        instance_id=svc.instance_id,
        model=cfg.model.served_model_name or cfg.model.model,
        etcd=svc.etcd,
        cluster=svc.cluster,
        aengine=svc.aengine,
        transfer=transfer,
        make_transfer=None if transfer is not None else make_transfer,
        telemetry=svc.telemetry,
        tls=svc.tls,
    )
    await client.start()
    if transfer is not None:
        transfer.start_progress()  # the store writes into our pool: the receive side must progress
    return client
