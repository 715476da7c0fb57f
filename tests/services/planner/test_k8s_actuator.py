"""The Kubernetes actuator against a local server answering like the API (tests/services/planner/k8s_api.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from services.planner.actuators.base import DrainTarget, ScaleError
from services.planner.actuators.k8s import DELETION_COST, KubernetesActuator, parse_deployments
from tests.services.planner.k8s_api import FakeKubeApi

DEPLOYMENTS = {"prefill": "pdrelay-prefill", "decode": "pdrelay-decode"}


def actuator(url: str) -> KubernetesActuator:
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = url
    return KubernetesActuator(DEPLOYMENTS, "pdrelay", api_client=client.ApiClient(cfg))


@pytest.fixture
def api():
    fake = FakeKubeApi(replicas={"pdrelay-prefill": 1, "pdrelay-decode": 2})
    server, url = fake.serve()
    yield fake, url
    server.shutdown()


def test_scale_patches_the_scale_subresource_and_marks_the_drained_pod(api) -> None:
    fake, url = api

    async def go() -> None:
        act = actuator(url)
        await act.start()
        assert act.desired("prefill") == 1 and act.desired("decode") == 2
        msg = await act.scale("prefill", 3)
        assert "replicas 1 -> 3" in msg and fake.replicas["pdrelay-prefill"] == 3
        msg = await act.scale("decode", 1, [DrainTarget("decode-7", host="pdrelay-decode-6b9f-x2x")])
        assert fake.replicas["pdrelay-decode"] == 1 and "pdrelay-decode-6b9f-x2x" in msg
        await act.close()

    asyncio.run(go())
    patches = [r for r in fake.requests if r.method == "PATCH"]
    assert [r.path for r in patches] == [
        "/apis/apps/v1/namespaces/pdrelay/deployments/pdrelay-prefill/scale",
        "/api/v1/namespaces/pdrelay/pods/pdrelay-decode-6b9f-x2x",
        "/apis/apps/v1/namespaces/pdrelay/deployments/pdrelay-decode/scale",
    ]
    assert patches[0].body == {"spec": {"replicas": 3}}
    assert "merge-patch" in patches[0].content_type or "strategic-merge-patch" in patches[0].content_type
    assert fake.pod_annotations["pdrelay-decode-6b9f-x2x"] == {DELETION_COST: "-1000"}


def test_a_refused_scale_is_a_scale_error_and_kubectl_scale_is_a_manual_change(api) -> None:
    fake, url = api
    fake.forbid_patch.add("pdrelay-prefill")

    async def go() -> None:
        act = actuator(url)
        await act.start()
        with pytest.raises(ScaleError, match="HTTP 403"):
            await act.scale("prefill", 2)
        assert act.desired("prefill") == 1  # unchanged: the planner retries later
        fake.replicas["pdrelay-decode"] = 5  # kubectl scale deployment pdrelay-decode --replicas 5
        await act.refresh()
        assert act.take_manual() == {"decode": 5} and act.take_manual() == {}
        await act.close()

    asyncio.run(go())


def test_deployment_flag_is_checked() -> None:
    assert parse_deployments(("prefill=a", "decode=b")) == {"prefill": "a", "decode": "b"}
    with pytest.raises(ValueError, match="--k8s-deployments"):
        parse_deployments(("prefill",))


def test_rbac_manifest_grants_only_what_the_actuator_calls() -> None:
    docs = list(yaml.safe_load_all((Path(__file__).parents[3] / "deploy/k8s/planner/rbac.yaml").read_text()))
    role = next(d for d in docs if d["kind"] == "Role")
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in role["rules"]}
    assert rules == {(("apps",), ("deployments/scale",)): {"get", "patch"}, (("",), ("pods",)): {"patch"}}
    binding = next(d for d in docs if d["kind"] == "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert {d["kind"] for d in docs} == {"ServiceAccount", "Role", "RoleBinding"}
