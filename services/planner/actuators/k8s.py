"""The Kubernetes actuator: patches the scale subresource of each role's Deployment (official `kubernetes`
client, in-cluster config). Needs get + patch on deployments/scale and patch on pods (deploy/k8s/planner-rbac.yaml).

A scale-down first marks the chosen pod with a low `controller.kubernetes.io/pod-deletion-cost`, so the
ReplicaSet removes that pod (the idlest) rather than one it picks; the pod gets SIGTERM and drains (the service
lifecycle: deregister, finish in-flight requests and hand-offs, exit) within its terminationGracePeriodSeconds.
A replica count that changes without the planner (`kubectl scale`) is reported as manual: a pin.
The client is synchronous: calls run in a worker thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from services.planner.actuators.base import DrainTarget, ScaleError

log = logging.getLogger(__name__)

NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
_TIMEOUT_S = 10.0


def parse_deployments(items: Sequence[str]) -> dict[str, str]:
    """("prefill=pdrelay-prefill", ...) -> {"prefill": "pdrelay-prefill"}; ValueError naming the flag."""
    out: dict[str, str] = {}
    for item in items:
        role, eq, name = item.partition("=")
        if not eq or not role.strip() or not name.strip():
            raise ValueError(f"--k8s-deployments {item!r}: write ROLE=DEPLOYMENT, e.g. prefill=pdrelay-prefill")
        out[role.strip()] = name.strip()
    return out


def in_cluster_namespace() -> str:
    try:
        return NAMESPACE_FILE.read_text().strip() or "default"
    except OSError:
        return "default"


class KubernetesActuator:
    name = "kubernetes"

    def __init__(self, deployments: Mapping[str, str], namespace: str | None = None, api_client: Any = None) -> None:
        """`api_client`: a kubernetes.client.ApiClient (tests point one at a local server); default: in-cluster."""
        self.deployments = dict(deployments)
        self.namespace = namespace or in_cluster_namespace()
        self._api_client = api_client
        self._apps: Any = None
        self._core: Any = None
        self._desired: dict[str, int] = {}
        self._manual: dict[str, int] = {}

    async def start(self) -> None:
        from kubernetes import client, config

        if self._api_client is None:
            try:
                config.load_incluster_config()
            except config.ConfigException as e:
                raise ScaleError(
                    f"--actuator kubernetes: not running in a cluster ({e}); use --actuator local with `pdrelay up`"
                ) from None
            self._api_client = client.ApiClient()
        self._apps = client.AppsV1Api(self._api_client)
        self._core = client.CoreV1Api(self._api_client)
        for role in self.deployments:
            self._desired[role] = await self._read(role)

    async def _read(self, role: str) -> int:
        name = self.deployments[role]
        try:
            scale = await asyncio.to_thread(
                self._apps.read_namespaced_deployment_scale, name, self.namespace, _request_timeout=_TIMEOUT_S
            )
        except Exception as e:  # ApiException, connection errors: the platform said no  # noqa: BLE001
            raise ScaleError(f"reading deployment {self.namespace}/{name}: {_why(e)}") from None
        return int(scale.spec.replicas or 0)

    async def scale(self, role: str, target: int, drain: Sequence[DrainTarget] = ()) -> str:
        if role not in self.deployments:
            raise ScaleError(f"no deployment for role {role!r}; add it to --k8s-deployments")
        name = self.deployments[role]
        current = self._desired.get(role)
        marked = []
        if current is not None and target < current:
            for d in drain:
                if d.host and await self._mark_for_deletion(d.host):
                    marked.append(d.host)
        try:
            await asyncio.to_thread(
                self._apps.patch_namespaced_deployment_scale,
                name,
                self.namespace,
                {"spec": {"replicas": target}},
                _request_timeout=_TIMEOUT_S,
            )
        except Exception as e:  # noqa: BLE001 - ApiException, connection errors: the platform said no
            raise ScaleError(f"scaling deployment {self.namespace}/{name} to {target}: {_why(e)}") from None
        self._desired[role] = target
        return f"deployment {self.namespace}/{name}: replicas {current} -> {target}" + (
            f" (pod {', '.join(marked)} goes first)" if marked else ""
        )

    async def _mark_for_deletion(self, pod: str) -> bool:
        body = {"metadata": {"annotations": {DELETION_COST: "-1000"}}}
        try:
            await asyncio.to_thread(
                self._core.patch_namespaced_pod, pod, self.namespace, body, _request_timeout=_TIMEOUT_S
            )
            return True
        except Exception as e:  # noqa: BLE001 - without the annotation the ReplicaSet still drains some pod
            log.warning("could not mark pod %s/%s for deletion first: %s", self.namespace, pod, _why(e))
            return False

    def desired(self, role: str) -> int | None:
        return self._desired.get(role)

    async def refresh(self) -> None:
        for role in self.deployments:
            try:
                now = await self._read(role)
            except ScaleError as e:
                log.warning("%s", e)
                continue
            if role in self._desired and now != self._desired[role]:
                self._manual[role] = now
            self._desired[role] = now

    def take_manual(self) -> dict[str, int]:
        out, self._manual = self._manual, {}
        return out

    async def close(self) -> None:
        if self._api_client is not None:
            await asyncio.to_thread(self._api_client.close)


def _why(e: Exception) -> str:
    status = getattr(e, "status", None)
    reason = getattr(e, "reason", None)
    if status:
        return f"HTTP {status} {reason or ''}".strip()
    return f"{type(e).__name__}: {e}"
