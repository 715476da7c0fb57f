"""An instance's registration in etcd: a key under a lease, kept alive, with an epoch that grows on re-registration.

register():  grant a lease; one transaction bumps the cluster epoch counter and writes the instance key
             under the lease, so the epoch and the key appear atomically.
keep-alive:  a background task renews the lease every ttl/3 s. While etcd is unreachable it keeps trying
             (the key stays as long as etcd does not expire the lease). When etcd answers that the lease is
             gone (expired during a partition, or a replaced etcd), it registers again with a new lease and a
             higher epoch, so peers can fence work from the old incarnation.
deregister(): revoke the lease: the key disappears at once instead of after the TTL.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable

import grpc
import msgspec
from etcd3aio import Etcd3Client, EtcdError
from etcd3aio.kv import KVService

from shared.cluster.instance import InstanceInfo, InstanceState, encode_instance, epoch_counter_key

log = logging.getLogger(__name__)

EpochCallback = Callable[[int], Awaitable[None] | None]

_RPC_TIMEOUT_S = 2.0
_RETRY_S = 0.5  # keep-alive / re-registration retry interval while etcd is unreachable


class Registrar:
    """Registers one instance and keeps it registered until `deregister()`."""

    def __init__(
        self, client: Etcd3Client, info: InstanceInfo, *, ttl_s: int = 5, on_epoch: EpochCallback | None = None
    ) -> None:
        if ttl_s < 1:
            raise ValueError(f"lease TTL must be >= 1 s (got {ttl_s}); etcd rounds small TTLs up to ~2 s anyway")
        self._client = client
        self._info = info
        self._ttl_s = ttl_s
        self._on_epoch = on_epoch
        self._lease_id = 0
        self._last_epoch = 0  # floor for the next epoch, in case etcd lost its counter (a replaced etcd)
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.registrations = 0  # how many times a key was written under a new lease
        self.lease_losses = 0
        self.last_keepalive = 0.0  # monotonic time of the last acknowledged keep-alive

    @property
    def info(self) -> InstanceInfo:
        """The value as last written (or to be written once etcd is back)."""
        return self._info

    @property
    def epoch(self) -> int:
        return self._info.epoch

    @property
    def lease_id(self) -> int:
        return self._lease_id

    @property
    def key(self) -> str:
        return self._info.key

    async def register(self) -> int:
        """Write the key under a new lease with a new epoch and start keeping it alive; returns the epoch."""
        async with self._lock:
            await self._register_locked()
        if self._task is None:
            self._task = asyncio.create_task(self._keepalive_loop(), name=f"keepalive-{self._info.instance_id}")
        await self._notify_epoch()
        return self._info.epoch

    async def update(self, **changes: object) -> None:
        """Change fields of the registered value (same lease, same epoch), e.g. `update(state=...)`.

        While etcd is unreachable the change is kept and written by the next successful (re-)registration.
        """
        async with self._lock:
            self._info = msgspec.structs.replace(self._info, **changes)
            if not self._lease_id:
                return
            try:
                await self._kv().put(
                    self.key, encode_instance(self._info), lease=self._lease_id, timeout=_RPC_TIMEOUT_S
                )
            except (EtcdError, TimeoutError) as e:
                log.warning("could not update %s in etcd (%s); it is written again once etcd answers", self.key, e)

    async def set_state(self, state: InstanceState) -> None:
        await self.update(state=state)

    async def deregister(self) -> None:
        """Stop the keep-alive and revoke the lease (the key goes at once). Safe to call twice."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        async with self._lock:
            lease, self._lease_id = self._lease_id, 0
        if lease and self._client.lease is not None:
            try:
                await self._client.lease.revoke(lease, timeout=_RPC_TIMEOUT_S, max_attempts=1)
            except (EtcdError, TimeoutError) as e:
                # The key still goes when the lease expires, ttl seconds from the last keep-alive.
                log.warning("could not revoke lease of %s (%s); it expires within %d s", self.key, e, self._ttl_s)

    # ------------------------------------------------------------------ internals

    def _kv(self) -> KVService:
        assert self._client.kv is not None, "etcd client is not connected"
        return self._client.kv

    async def _register_locked(self) -> None:
        assert self._client.lease is not None, "etcd client is not connected"
        grant = await self._client.lease.grant(self._ttl_s, timeout=_RPC_TIMEOUT_S)
        counter = epoch_counter_key(self._info.cluster)
        kv = self._kv()
        for _ in range(32):  # optimistic concurrency: another instance may bump the counter between read and txn
            cur = await kv.get(counter, timeout=_RPC_TIMEOUT_S)
            version = cur.kvs[0].version if cur.kvs else 0
            seen = int(cur.kvs[0].value) if cur.kvs else 0
            epoch = max(seen, self._last_epoch) + 1
            info = msgspec.structs.replace(self._info, epoch=epoch)
            txn = await kv.txn(
                compare=[KVService.txn_compare_version(counter, version)],
                success=[
                    KVService.txn_op_put(counter, str(epoch)),
                    KVService.txn_op_put(info.key, encode_instance(info), lease=grant.ID),
                ],
                timeout=_RPC_TIMEOUT_S,
            )
            if txn.succeeded:
                self._info, self._lease_id, self._last_epoch = info, grant.ID, epoch
                self.registrations += 1
                self.last_keepalive = time.monotonic()
                log.info("registered %s epoch %d lease %x ttl %d s", info.key, epoch, grant.ID, grant.TTL)
                return
        raise RuntimeError(f"could not take an epoch from {counter} after 32 attempts (heavy contention)")

    async def _keepalive_once(self) -> int:
        """Renew the lease once; returns the TTL etcd granted (<= 0: the lease no longer exists)."""
        assert self._client.lease is not None, "etcd client is not connected"
        call = self._client.lease.keep_alive(self._lease_id)
        try:
            async with asyncio.timeout(_RPC_TIMEOUT_S):
                async for resp in call:
                    return int(resp.TTL)
        finally:
            call.cancel()
        raise ConnectionError("keep-alive stream closed without an answer")

    async def _keepalive_loop(self) -> None:
        interval = max(0.5, self._ttl_s / 3)
        outage_since: float | None = None
        while not self._closed:
            await asyncio.sleep(interval if outage_since is None else _RETRY_S)
            if self._client.lease is None:  # the client was closed under us: nothing left to keep alive
                log.info("etcd client of %s closed; keep-alive stops", self.key)
                return
            try:
                async with self._lock:
                    if self._lease_id:
                        ttl = await self._keepalive_once()
                        if ttl <= 0:
                            self.lease_losses += 1
                            log.warning(
                                "lease of %s is gone (expired while etcd was unreachable, or etcd was "
                                "replaced); registering again with a new epoch",
                                self.key,
                            )
                            self._lease_id = 0
                    if not self._lease_id:
                        await self._register_locked()
                        registered = True
                    else:
                        registered = False
                self.last_keepalive = time.monotonic()
                if outage_since is not None:
                    log.warning(
                        "etcd answers again after %.1f s; %s is registered (epoch %d)",
                        time.monotonic() - outage_since,
                        self.key,
                        self._info.epoch,
                    )
                    outage_since = None
                if registered:
                    await self._notify_epoch()
            except (EtcdError, TimeoutError, ConnectionError, grpc.aio.AioRpcError) as e:
                if outage_since is None:
                    outage_since = time.monotonic()
                    log.warning(
                        "etcd unreachable from %s (%s: %s); retrying every %.1f s",
                        self.key,
                        type(e).__name__,
                        e,
                        _RETRY_S,
                    )

    async def _notify_epoch(self) -> None:
        if self._on_epoch is None:
            return
        try:
            res = self._on_epoch(self._info.epoch)
            if inspect.isawaitable(res):
                await res
        except Exception:  # a consumer bug must not stop the keep-alive
            log.exception("epoch callback failed")
