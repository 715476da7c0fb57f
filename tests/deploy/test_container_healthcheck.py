"""deploy/compose/healthcheck.py (the image's pdrelay-healthcheck) against real gRPC health and HTTP servers."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import ModuleType
from typing import ClassVar

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from shared.cluster.localcluster.servers import free_port
from tests.deploy.topology import COMPOSE_DIR

SCRIPT = COMPOSE_DIR / "healthcheck.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pdrelay_healthcheck", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


hc = _load()


@pytest.fixture
def grpc_health() -> Iterator[tuple[str, health.HealthServicer]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        server.stop(None)


class _Handler(BaseHTTPRequestHandler):
    codes: ClassVar[dict[str, int]] = {"/health": 200, "/ready": 503}

    def do_GET(self) -> None:
        code = self.codes.get(self.path, 404)
        body = b'{"status":"ok"}' if code == 200 else b'{"error":"not ready"}'
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_grpc_serving_is_healthy(grpc_health, capsys):
    address, servicer = grpc_health
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    assert hc.main(["grpc", address]) == hc.HEALTHY
    assert "SERVING" in capsys.readouterr().out


def test_grpc_not_serving_or_unknown_service_is_unhealthy(grpc_health, capsys):
    address, servicer = grpc_health
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert hc.main(["grpc", address]) == hc.UNHEALTHY
    assert "NOT_SERVING" in capsys.readouterr().out
    assert hc.main(["grpc", address, "pdrelay.v1.Decode"]) == hc.UNHEALTHY  # never registered: NOT_FOUND
    assert "NOT_FOUND" in capsys.readouterr().out


def test_grpc_nothing_listening_is_unhealthy_within_the_timeout():
    assert hc.main(["--timeout", "1", "grpc", f"127.0.0.1:{free_port()}"]) == hc.UNHEALTHY


def test_http_2xx_is_healthy_and_an_error_status_is_not(http_server, capsys):
    assert hc.main(["http", f"{http_server}/health"]) == hc.HEALTHY
    assert hc.main(["http", f"{http_server}/ready"]) == hc.UNHEALTHY
    assert "HTTP 503" in capsys.readouterr().out
    assert hc.main(["--timeout", "1", "http", f"http://127.0.0.1:{free_port()}/health"]) == hc.UNHEALTHY


def test_bad_usage_exits_2():
    assert hc.main([]) == hc.USAGE
    assert hc.main(["--timeout", "0", "http", "http://127.0.0.1:1/"]) == hc.USAGE


def test_runs_as_a_script_like_the_container_check(grpc_health):
    """How Docker runs it: a separate process, the exit code is the verdict."""
    address, servicer = grpc_health
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    res = subprocess.run([sys.executable, str(SCRIPT), "grpc", address], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    res = subprocess.run([sys.executable, str(SCRIPT), "grpc", address], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1, res.stdout + res.stderr
