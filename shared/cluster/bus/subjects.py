"""Subject names of every bus channel, in one place. Cluster and instance ids are single subject tokens."""

from __future__ import annotations

from shared.cluster.instance import check_name

ANY = "*"  # one-token wildcard, for subscribers


def _token(what: str, value: str, wildcard_ok: bool) -> str:
    if wildcard_ok and value == ANY:
        return value
    check_name(what, value)
    return value


def kv_events(cluster: str, instance_id: str = ANY) -> str:
    return f"pdrelay.{_token('cluster', cluster, False)}.kv.{_token('instance id', instance_id, True)}"


def kv_snapshot(cluster: str, instance_id: str) -> str:
    """Request/reply: an instance's KV snapshot (kv_snapshot.py)."""
    return f"pdrelay.{_token('cluster', cluster, False)}.kvsnap.{_token('instance id', instance_id, False)}"


def kv_index_status(cluster: str, gateway_id: str) -> str:
    """Request/reply: a gateway's KV index state per instance (kv_index_status.py)."""
    return f"pdrelay.{_token('cluster', cluster, False)}.kvindex.{_token('gateway id', gateway_id, False)}"


def load(cluster: str, instance_id: str = ANY) -> str:
    return f"pdrelay.{_token('cluster', cluster, False)}.load.{_token('instance id', instance_id, True)}"


def cancel(cluster: str) -> str:
    return f"pdrelay.{_token('cluster', cluster, False)}.cancel"


def drain(cluster: str, instance_id: str = ANY) -> str:
    return f"pdrelay.{_token('cluster', cluster, False)}.drain.{_token('instance id', instance_id, True)}"


def supervisor_scale(cluster: str) -> str:
    return f"pdrelay.{_token('cluster', cluster, False)}.supervisor.scale"


def planner_decisions(cluster: str) -> str:
    return f"pdrelay.{_token('cluster', cluster, False)}.planner.decisions"


def planner_control(cluster: str) -> str:
    return f"pdrelay.{_token('cluster', cluster, False)}.planner.control"
