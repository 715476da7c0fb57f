"""Connecting to etcd: URL parsing and a startup check that fails with a message naming the URL.

https:// endpoints are reached over mutual TLS with the service's certificate (shared.cluster.tls); http:// ones
in plaintext. A mix of both is refused (one client, one channel).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any, cast
from urllib.parse import urlsplit

from etcd3aio import Etcd3Client, EtcdError

from shared.cluster.errors import etcd_unavailable
from shared.cluster.tls import TlsFiles

log = logging.getLogger(__name__)

# Probe key: a read of it says "etcd answers" without touching pdrelay's keys.
_PING_KEY = "/pdrelay/.ping"


def etcd_target(url: str) -> str:
    """'http://127.0.0.1:2379', 'https://...' or '127.0.0.1:2379' -> '127.0.0.1:2379' (what the gRPC client dials)."""
    raw = url.strip()
    parts = urlsplit(raw if "://" in raw else f"http://{raw}")
    if parts.scheme not in ("http", "https", ""):
        raise ValueError(
            f"etcd endpoint {url!r}: only http:// and https:// are supported (got scheme "
            f"{parts.scheme!r}); use e.g. http://127.0.0.1:2379"
        )
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None or parts.path not in ("", "/"):
        raise ValueError(f"etcd endpoint {url!r} must look like http://HOST:PORT (e.g. http://127.0.0.1:2379)")
    return f"{parts.hostname}:{port}"


def uses_tls(endpoints: Sequence[str]) -> bool:
    """True for https:// endpoints; ValueError for a mix of https:// and plaintext ones."""
    secure = {u.strip().lower().startswith("https://") for u in endpoints}
    if len(secure) > 1:
        raise ValueError(f"etcd endpoints {', '.join(endpoints)} mix https:// and http://; use one scheme for all")
    return secure == {True}


async def connect_etcd(endpoints: Sequence[str], *, timeout_s: float = 5.0, tls: TlsFiles | None = None) -> Etcd3Client:
    """A connected client, after one successful read; ControlPlaneUnavailable naming the URLs otherwise.

    https:// endpoints need `tls` (the CA that signed etcd's certificate, and our client certificate)."""
    if not endpoints:
        raise ValueError("no etcd endpoints given; pass --etcd-endpoints http://127.0.0.1:2379")
    targets = [etcd_target(u) for u in endpoints]
    secure = uses_tls(endpoints)
    if secure and tls is None:
        raise ValueError(
            f"etcd endpoint {endpoints[0]} is https://: give --tls-ca-file, --tls-certfile and "
            "--tls-keyfile (or use an http:// endpoint)"
        )
    tls_args = tls.etcd_args() if secure and tls is not None else {}
    # Few fast retries: a service at start should fail in seconds with a clear message, not hang.
    client = Etcd3Client(
        targets,
        rpc_max_attempts=2,
        watch_reconnect_backoff_seconds=0.1,
        watch_max_reconnect_backoff_seconds=1.0,
        **cast("dict[str, Any]", tls_args),
    )  # only **conn_args keys: ca_cert, cert_key, cert_chain
    await client.connect()
    deadline = asyncio.get_running_loop().time() + timeout_s
    last: BaseException | None = None
    while True:
        assert client.kv is not None
        try:
            await client.kv.get(_PING_KEY, timeout=min(1.0, timeout_s), count_only=True)
            return client
        except (EtcdError, TimeoutError, OSError) as e:
            last = e
        if asyncio.get_running_loop().time() >= deadline:
            break
        await asyncio.sleep(0.2)
    await client.close()
    raise etcd_unavailable(", ".join(endpoints), f"no answer within {timeout_s:g} s ({type(last).__name__}: {last})")


async def etcd_reachable(client: Etcd3Client, timeout_s: float = 1.0) -> bool:
    """One cheap read: does etcd answer right now?"""
    if client.kv is None:
        return False
    try:
        await client.kv.get(_PING_KEY, timeout=timeout_s, count_only=True, serializable=True, max_attempts=1)
        return True
    except (EtcdError, TimeoutError, OSError):
        return False
