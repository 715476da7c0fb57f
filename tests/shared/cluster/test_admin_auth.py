"""Admin commands on NATS are authenticated: drain commands to a service with --admin-secret-file, and scale
requests to the `pdrelay up` supervisor, are acted on only when signed with the cluster secret; unsigned, wrongly
signed, stale or replayed ones are refused and logged (real nats-server, the echo service as a real process)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from shared.cluster.bus.admin_auth import HEADER, AdminAuth, AdminAuthError
from shared.cluster.bus.client import Bus
from shared.cluster.bus.drain import send_drain
from shared.cluster.bus.scale import (
    ScaleReply,
    ScaleRequest,
    request_scale,
    serve_scale,
)
from tests.helpers.servers import EchoProcess

pytestmark = pytest.mark.timeout(90)


def test_sign_and_check() -> None:
    auth = AdminAuth(b"k" * 32)
    payload = b"\x81\xa1a\x01"
    headers = auth.sign_headers("pdrelay.c.drain.d-1", payload)
    assert auth.check("pdrelay.c.drain.d-1", payload, headers) is None
    assert "replay" in str(auth.check("pdrelay.c.drain.d-1", payload, headers))
    fresh = auth.sign_headers("pdrelay.c.drain.d-1", payload)
    assert "does not match" in str(auth.check("pdrelay.c.drain.d-2", payload, fresh))  # another subject
    assert "does not match" in str(auth.check("pdrelay.c.drain.d-1", payload + b"x", fresh))  # changed message
    assert "does not match" in str(AdminAuth(b"j" * 32).check("pdrelay.c.drain.d-1", payload, fresh))
    assert "not signed" in str(auth.check("s", payload, {}))
    assert "malformed" in str(auth.check("s", payload, {HEADER: "v1.x"}))
    old = AdminAuth(b"k" * 32, max_skew_s=0.5)
    stale = old.sign_headers("s", payload)
    time.sleep(0.7)
    assert "away from now" in str(old.check("s", payload, stale))
    assert auth.refused == 5 and old.refused == 1
    with pytest.raises(AdminAuthError, match="at least 16 bytes"):
        AdminAuth(b"short")


def test_secret_files(tmp_path: Path) -> None:
    made = AdminAuth.create_file(tmp_path / "admin.secret")
    assert (tmp_path / "admin.secret").stat().st_mode & 0o777 == 0o600
    loaded = AdminAuth.from_file(tmp_path / "admin.secret")
    assert loaded.check("s", b"p", made.sign_headers("s", b"p")) is None
    with pytest.raises(AdminAuthError, match="--admin-secret-file"):
        AdminAuth.from_file(tmp_path / "missing")


async def test_drain_needs_the_cluster_secret(etcd_server, nats_server, tmp_path: Path) -> None:
    auth = AdminAuth.create_file(tmp_path / "admin.secret")
    echo = EchoProcess(etcd_server, nats_server, tmp_path, "--admin-secret-file", str(tmp_path / "admin.secret"))
    try:
        await asyncio.to_thread(echo.wait_ready)
        await asyncio.sleep(0.5)  # the service's SUB reaches the server (it registers before it is ready)
        async with Bus(nats_server.url) as bus:
            await send_drain(bus, "t", "echo-1", reason="unsigned")
            await send_drain(bus, "t", "echo-1", reason="forged", auth=AdminAuth(b"f" * 32))
            for _ in range(100):
                if echo.log().count("refused an admin command") == 2:
                    break
                await asyncio.sleep(0.05)
            assert echo.log().count("refused an admin command") == 2, echo.log()
            assert echo.proc.poll() is None, "an unauthenticated drain command stopped the instance"
            await send_drain(bus, "t", "echo-1", reason="scale_down", auth=auth)
            rc = await asyncio.to_thread(echo.proc.wait, 10)
        assert rc == 0 and "scale_down" in echo.log()
    finally:
        echo.stop()


async def test_scale_requests_need_the_cluster_secret(nats_server) -> None:
    auth = AdminAuth(b"s" * 32)
    acted: list[dict[str, int]] = []

    def responder(req: ScaleRequest, meta: object) -> ScaleReply:
        acted.append(req.targets)
        return ScaleReply(ok=True, message="done")

    async with Bus(nats_server.url) as sup, Bus(nats_server.url) as cli:
        await serve_scale(sup, "t", responder, auth=auth)
        await sup.flush()
        unsigned = await request_scale(cli, "t", {"prefill": 9}, timeout_s=20)  # a busy box may be slow to answer
        forged = await request_scale(cli, "t", {"prefill": 9}, auth=AdminAuth(b"x" * 32), timeout_s=20)
        signed = await request_scale(cli, "t", {"prefill": 2}, auth=auth, timeout_s=20)
    assert not unsigned.ok and "not signed" in unsigned.message
    assert not forged.ok and "does not match" in forged.message
    assert signed.ok and acted == [{"prefill": 2}]
