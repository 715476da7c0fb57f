#!/usr/bin/env python3
"""Container health check for pdrelay services: exit 0 when the service answers healthy, 1 when not, 2 on bad usage.

    pdrelay-healthcheck http http://127.0.0.1:8000/ready     # gateway: HTTP 200 means healthy
    pdrelay-healthcheck grpc 127.0.0.1:50051                 # workers: grpc.health.v1 Check says SERVING

Docker keeps the last lines a check prints (`docker inspect --format '{{json .State.Health}}' <container>`), so
every outcome prints one line that says what was asked and what came back. The image installs this file as
/usr/local/bin/pdrelay-healthcheck; Kubernetes uses its own httpGet/grpc probes instead.
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence

HEALTHY, UNHEALTHY, USAGE = 0, 1, 2


def check_http(url: str, timeout_s: float) -> tuple[int, str]:
    """GET `url`: healthy on any 2xx answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return HEALTHY, f"GET {url}: HTTP {resp.status}"
    except urllib.error.HTTPError as e:  # a 4xx/5xx answer: the server runs but is not healthy (e.g. 503 not ready)
        return UNHEALTHY, f"GET {url}: HTTP {e.code}"
    except (OSError, ValueError) as e:
        return UNHEALTHY, f"GET {url}: {e}"


def check_grpc(address: str, service: str, timeout_s: float) -> tuple[int, str]:
    """grpc.health.v1.Health/Check on `address` ("host:port"): healthy when the status is SERVING.

    `service` "" asks about the whole server (what a service's lifecycle sets when it is ready to take work).
    """
    import grpc  # only here: the http check should not pay for importing grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    what = f"grpc health {address} service {service or '(server)'}"
    try:
        with grpc.insecure_channel(address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
    except grpc.RpcError as e:
        code = e.code() if hasattr(e, "code") else None
        return UNHEALTHY, f"{what}: {code.name if code else 'error'} {e.details() if hasattr(e, 'details') else e}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    return (HEALTHY if resp.status == health_pb2.HealthCheckResponse.SERVING else UNHEALTHY), f"{what}: {status}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="pdrelay-healthcheck", description="Exit 0 when a pdrelay service answers healthy, 1 when not."
    )
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for an answer (default 3)")
    sub = parser.add_subparsers(dest="kind", required=True)
    http = sub.add_parser("http", help="GET a URL; healthy on 2xx")
    http.add_argument("url", help="e.g. http://127.0.0.1:8000/ready")
    grpc_p = sub.add_parser("grpc", help="grpc.health.v1 Check; healthy on SERVING")
    grpc_p.add_argument("address", help="host:port, e.g. 127.0.0.1:50051")
    grpc_p.add_argument("service", nargs="?", default="", help="health service name (default: the whole server)")
    try:
        ns = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on bad usage and 0 on --help: keep those codes
        return int(e.code or 0)
    if ns.timeout <= 0:
        print(f"pdrelay-healthcheck: --timeout {ns.timeout} must be positive; e.g. --timeout 3", file=sys.stderr)
        return USAGE
    if ns.kind == "http":
        code, line = check_http(ns.url, ns.timeout)
    else:
        code, line = check_grpc(ns.address, ns.service, ns.timeout)
    print(("healthy: " if code == HEALTHY else "unhealthy: ") + line)
    return code


if __name__ == "__main__":
    sys.exit(main())
