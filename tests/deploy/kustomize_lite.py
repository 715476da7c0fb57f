"""What `kustomize build` makes of deploy/k8s and the deploy/k8s-gpu overlay, offline and without kustomize: the
resources, the strategic-merge patches (maps merged, containers / volumes / env / ports / volumeMounts merged by
name, other lists replaced), images, namespaces and the ConfigMap / Secret generators. Enough for the manifests this
repository ships, so every rendered object can be validated against the Kubernetes schemas."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

MERGE_KEYS = {"containers": "name", "initContainers": "name", "volumes": "name", "env": "name", "ports": "name"}
MERGE_KEYS |= {"volumeMounts": "name", "volumeClaimTemplates": "metadata"}


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _key(doc: Mapping[str, Any]) -> tuple[str, str]:
    return doc["kind"], doc["metadata"]["name"]


def merge(base: Any, patch: Any, field: str = "") -> Any:
    """Strategic merge of `patch` into `base` (a new object)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = merge(base[k], v, k) if k in base else v
        return out
    if isinstance(base, list) and isinstance(patch, list) and field in MERGE_KEYS:
        key = MERGE_KEYS[field]
        out = list(base)
        for item in patch:
            at = next((i for i, b in enumerate(out) if isinstance(b, dict) and b.get(key) == item.get(key)), None)
            if at is None:
                out.append(item)
            else:
                out[at] = merge(out[at], item, field)
        return out
    return patch


def _generated(kind: str, spec: Mapping[str, Any], root: Path, namespace: str | None) -> dict[str, Any]:
    data: dict[str, str] = {}
    for f in spec.get("files", ()):
        path = root / f
        # generator inputs that are made at deploy time (certificates) stand in as placeholders
        text = path.read_text() if path.exists() else f"placeholder for {f}"
        data[Path(f).name] = base64.b64encode(text.encode()).decode() if kind == "Secret" else text
    meta = {"name": spec["name"], **({"namespace": spec.get("namespace") or namespace} if namespace else {})}
    if spec.get("namespace"):
        meta["namespace"] = spec["namespace"]
    return {"apiVersion": "v1", "kind": kind, "metadata": meta, "data": data}


def build(root: Path) -> list[dict[str, Any]]:
    """The objects `kustomize build root` would make (generator name hashes left out)."""
    k = yaml.safe_load((root / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for res in k.get("resources", ()):
        path = (root / res).resolve()
        docs += build(path) if path.is_dir() else _docs(path)
    for gen in k.get("configMapGenerator", ()):
        docs.append(_generated("ConfigMap", gen, root, k.get("namespace")))
    for gen in k.get("secretGenerator", ()):
        docs.append(_generated("Secret", gen, root, k.get("namespace")))
    by_key = {_key(d): i for i, d in enumerate(docs)}
    for p in k.get("patches", ()):
        for patch in _docs(root / p["path"]):
            i = by_key.get(_key(patch))
            if i is None:
                raise ValueError(
                    f"{root / p['path']}: no resource matches the patch of {_key(patch)} (kustomize fails)"
                )
            docs[i] = merge(docs[i], patch)
    images = {im["name"]: im for im in k.get("images", ())}
    for d in docs:
        if k.get("namespace") and d["kind"] != "Namespace":
            d["metadata"]["namespace"] = k["namespace"]
        for c in d.get("spec", {}).get("template", {}).get("spec", {}).get("containers", ()):
            name, _, tag = c["image"].partition(":")
            if name in images:
                im = images[name]
                c["image"] = f"{im.get('newName', name)}:{im.get('newTag', tag or 'latest')}"
    return docs
