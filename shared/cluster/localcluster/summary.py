"""What `pdrelay up` prints once the cluster is ready: endpoints, a ready-to-paste curl, how to stop it."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from shared.cluster.localcluster.rundir import ChildState, RunState


def served_model_name(child: ChildState) -> str:
    """The model name a gateway serves, from its resolved config file ("" when unknown)."""
    try:
        cfg = json.loads(Path(child.config).read_text())
        model = cfg["config"]["model"]
        return str(model.get("served_model_name") or model.get("model") or "")
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def needs_api_key(child: ChildState) -> bool:
    """Does the gateway require an API key (its resolved config has one; the key itself is not shown)?"""
    try:
        return bool(json.loads(Path(child.config).read_text())["config"]["http"].get("api_key"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def curl_example(
    http: str,
    model: str,
    ca_file: str = "",
    api_key: bool = False,
    *,
    path: str = "/v1/chat/completions",
    body: str = "",
) -> str:
    """With `ca_file` (`pdrelay up --tls`): HTTPS, trusting the cluster's CA; `api_key`: send $PDRELAY_API_KEY.
    Default: a chat request; `path` and `body` ask another route."""
    body = body or json.dumps(
        {
            "model": model or "default",
            "max_tokens": 32,
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
        }
    )
    scheme, trust = ("https", f"--cacert {shlex.quote(ca_file)} ") if ca_file else ("http", "")
    auth = '-H "Authorization: Bearer $PDRELAY_API_KEY" ' if api_key else ""
    return f"curl -s {trust}{scheme}://{http}{path} {auth}-H 'Content-Type: application/json' -d {shlex.quote(body)}"


def format_summary(state: RunState) -> str:
    lines = [
        "",
        f"pdrelay cluster '{state.cluster}' is ready (run dir {state.run_dir})",
        f"  etcd   {state.etcd_url}" + ("" if state.etcd_pid else "  (external)"),
        f"  nats   {state.nats_url}" + ("" if state.nats_pid else "  (external)"),
    ]
    if state.mooncake_master:
        lines.append(f"  mooncake_master {state.mooncake_master}  (the kvstore's T3)  pid {state.mooncake_pid}")
    for c in state.children:
        extra = f"  http {c.http}" if c.http else ""
        lines.append(f"  {c.instance_id:<14} {c.state:<9} grpc {c.grpc}{extra}  epoch {c.epoch}  pid {c.pid}")
    for note in state.skipped:
        lines.append(f"  note: {note}")
    gw = next((c for c in state.children if c.role == "gateway" and c.http), None)
    if gw is not None:
        ca = str(Path(state.tls_dir) / "ca.pem") if state.tls_dir else ""
        at = f"ip netns exec {state.netns} " if state.netns else ""  # --netns: from the cluster's client host
        lines += ["", "Try it:", "  " + at + curl_example(gw.http, served_model_name(gw), ca, needs_api_key(gw))]
        if any(c.role == "encoder" for c in state.children):
            body = json.dumps({"input": ["What is the capital of France?"]})
            lines.append("  " + at + curl_example(gw.http, "", ca, needs_api_key(gw), path="/v1/embeddings", body=body))
    rd = shlex.quote(state.run_dir)
    if state.traces:
        lines += [
            "",
            f"Traces: every request's spans go to {state.traces}",
            f"  pdrelay trace --run-dir {rd}                  lists the traced requests",
            f"  pdrelay trace <request-id> --run-dir {rd}     one request's span tree (id: the response's 'id')",
        ]
    lines += [
        "",
        f"Status: pdrelay status --run-dir {rd}    Scale: pdrelay scale --run-dir {rd} prefill=2",
        f"Stop:   Ctrl-C, or pdrelay down --run-dir {rd}",
        "",
    ]
    return "\n".join(lines)
