"""Leader election among planners through etcd: one key, created only if absent, under the planner's own
registration lease. The leader's lease dying (process killed, partition) deletes the key, and the next standby
to try creates it; a planner whose registration moved to a new lease campaigns again like a newcomer.

    key    /pdrelay/<cluster>/planner/leader -> instance id of the leader
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from etcd3aio import Etcd3Client, EtcdError
from etcd3aio.kv import KVService

from shared.cluster.instance import ROOT

log = logging.getLogger(__name__)

_RPC_TIMEOUT_S = 2.0


def leader_key(cluster: str) -> str:
    return f"{ROOT}/{cluster}/planner/leader"


class LeaderElection:
    def __init__(self, client: Etcd3Client, cluster: str, me: str, lease: Callable[[], int]) -> None:
        self._client = client
        self.key = leader_key(cluster)
        self.me = me
        self._lease = lease
        self.is_leader = False
        self.leader = ""  # who leads, as last seen

    async def check(self) -> bool:
        """Try to lead (if nobody does) and say whether we do. An etcd error keeps us a follower: acting on a
        leadership nobody can confirm could mean two planners act."""
        lease = self._lease()
        kv = self._client.kv
        if not lease or kv is None:
            self.is_leader = False
            return False
        try:
            resp = await kv.txn(
                [KVService.txn_compare_create_revision(self.key, 0)],
                [KVService.txn_op_put(self.key, self.me, lease=lease)],
                [KVService.txn_op_get(self.key)],
                timeout=_RPC_TIMEOUT_S,
            )
        except (EtcdError, TimeoutError, OSError) as e:
            if self.is_leader:
                log.warning("%s: cannot confirm leadership (%s); standing by", self.me, e)
            self.is_leader = False
            return False
        was = self.is_leader
        if resp.succeeded:
            self.is_leader, self.leader = True, self.me
        else:
            kvs = resp.responses[0].response_range.kvs
            holder = kvs[0] if kvs else None
            self.leader = holder.value.decode() if holder is not None else ""
            # our own key under our current lease (we led before this call) still counts
            self.is_leader = holder is not None and self.leader == self.me and holder.lease == lease
        if self.is_leader != was:
            log.info(
                "%s: %s",
                self.me,
                "now the leading planner" if self.is_leader else f"standing by (leader: {self.leader or 'none'})",
            )
        return self.is_leader

    async def resign(self) -> None:
        if not self.is_leader or self._client.kv is None:
            return
        self.is_leader = False
        try:
            await self._client.kv.txn(
                [KVService.txn_compare_value(self.key, self.me)],
                [KVService.txn_op_delete(self.key)],
                timeout=_RPC_TIMEOUT_S,
            )
        except (EtcdError, TimeoutError, OSError) as e:
            log.warning("%s: could not resign (%s); the key goes with the lease", self.me, e)
