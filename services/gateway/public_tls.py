"""The gateway's public front door over TLS (--ssl-certfile / --ssl-keyfile, the seed's names): HTTPS on the HTTP
API and TLS on the gRPC API, with the same certificate. --ssl-ca-certs makes both ask clients for a certificate
that CA signed; --ssl-keyfile-password opens an encrypted key (gRPC takes only a plain key, so it is decrypted in
memory)."""

from __future__ import annotations

import ssl
from typing import Any

from shared.cluster.tls import TlsError, TlsFiles, read_pem
from shared.config.groups import HttpConfig


def _plain_key(pem: bytes, password: str | None) -> bytes:
    if password is None:
        return pem
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_pem_private_key(pem, password=password.encode())
    except (ValueError, TypeError) as e:
        raise TlsError(f"--ssl-keyfile-password does not open --ssl-keyfile ({e})") from None
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def public_tls(http_cfg: HttpConfig) -> TlsFiles | None:
    """The TLS identity of the public gRPC API, or None when --ssl-certfile is not set."""
    if http_cfg.ssl_certfile is None:
        return None
    assert http_cfg.ssl_keyfile is not None, "the config passes pair --ssl-certfile with --ssl-keyfile"
    ca = read_pem(http_cfg.ssl_ca_certs, "--ssl-ca-certs") if http_cfg.ssl_ca_certs else b""
    return TlsFiles(
        ca=ca,
        cert=read_pem(http_cfg.ssl_certfile, "--ssl-certfile"),
        key=_plain_key(read_pem(http_cfg.ssl_keyfile, "--ssl-keyfile"), http_cfg.ssl_keyfile_password),
        ca_path=http_cfg.ssl_ca_certs or "",
        cert_path=http_cfg.ssl_certfile,
        key_path=http_cfg.ssl_keyfile,
    )


def uvicorn_ssl_args(http_cfg: HttpConfig) -> dict[str, Any]:
    """uvicorn.Config keyword arguments for HTTPS ({} when --ssl-certfile is not set)."""
    if http_cfg.ssl_certfile is None:
        return {}
    args: dict[str, Any] = {
        "ssl_certfile": http_cfg.ssl_certfile,
        "ssl_keyfile": http_cfg.ssl_keyfile,
        "ssl_keyfile_password": http_cfg.ssl_keyfile_password,
    }
    if http_cfg.ssl_ca_certs:
        args.update(ssl_ca_certs=http_cfg.ssl_ca_certs, ssl_cert_reqs=ssl.CERT_REQUIRED)
    return args
