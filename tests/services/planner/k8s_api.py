"""A local HTTP server answering like the Kubernetes API for what the planner's actuator calls, with the
request and response shapes of a real API server (apps/v1 deployments/scale, v1 pods, a v1 Status on errors).
It records every request so tests can check the verb, path, content type and body the client sent."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Recorded:
    method: str
    path: str
    content_type: str
    body: Any


@dataclass
class FakeKubeApi:
    namespace: str = "pdrelay"
    replicas: dict[str, int] = field(default_factory=dict)  # deployment -> spec.replicas
    forbid_patch: set[str] = field(default_factory=set)  # deployments whose scale PATCH answers 403
    requests: list[Recorded] = field(default_factory=list)
    pod_annotations: dict[str, dict[str, str]] = field(default_factory=dict)

    def scale_object(self, name: str) -> dict[str, Any]:
        n = self.replicas[name]
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "uid": f"uid-{name}",
                "resourceVersion": str(1000 + n),
                "creationTimestamp": "2026-12-01T10:00:00Z",
            },
            "spec": {"replicas": n},
            "status": {"replicas": n, "selector": f"app=pdrelay,deployment={name}"},
        }

    def status(self, code: int, reason: str, message: str, name: str, kind: str) -> dict[str, Any]:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "details": {"name": name, "group": "apps", "kind": kind},
            "code": code,
        }

    def handle(self, method: str, path: str, content_type: str, body: Any) -> tuple[int, dict[str, Any]]:
        self.requests.append(Recorded(method, path, content_type, body))
        parts = path.split("?")[0].strip("/").split("/")
        # apis/apps/v1/namespaces/<ns>/deployments/<name>/scale
        if (
            parts[:3] == ["apis", "apps", "v1"]
            and len(parts) == 8
            and parts[6] in self.replicas
            and parts[7] == "scale"
        ):
            ns, name = parts[4], parts[6]
            if ns != self.namespace:
                return 404, self.status(404, "NotFound", f'deployments.apps "{name}" not found', name, "deployments")
            if method == "PATCH":
                if name in self.forbid_patch:
                    return 403, self.status(
                        403,
                        "Forbidden",
                        f'deployments.apps "{name}" is forbidden: User '
                        f'"system:serviceaccount:{ns}:pdrelay-planner" cannot patch resource '
                        f'"deployments/scale" in API group "apps" in the namespace "{ns}"',
                        name,
                        "deployments",
                    )
                self.replicas[name] = int(body["spec"]["replicas"])
            return 200, self.scale_object(name)
        # api/v1/namespaces/<ns>/pods/<name>
        if parts[:2] == ["api", "v1"] and len(parts) == 6 and parts[4] == "pods" and method == "PATCH":
            pod = parts[5]
            self.pod_annotations.setdefault(pod, {}).update(body["metadata"]["annotations"])
            return 200, {
                "kind": "Pod",
                "apiVersion": "v1",
                "metadata": {"name": pod, "namespace": parts[3], "annotations": self.pod_annotations[pod]},
                "spec": {"containers": [{"name": "pdrelay", "image": "pdrelay:latest"}]},
                "status": {"phase": "Running"},
            }
        return 404, self.status(404, "NotFound", "the server could not find the requested resource", "", "")

    def serve(self) -> tuple[ThreadingHTTPServer, str]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _do(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                code, obj = api.handle(
                    self.command, self.path, self.headers.get("Content-Type", ""), json.loads(raw) if raw else None
                )
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PATCH = _do

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server, f"http://127.0.0.1:{server.server_address[1]}"
