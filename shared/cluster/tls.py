"""TLS on every hop pdrelay owns: gRPC servers and channels (mutual TLS between services), etcd and NATS clients.

One CA signs every service's certificate (`pdrelay certs` makes a local one). A service presents its certificate
both as a server and as a client, and trusts only peers whose certificate the CA signed, so a process without a
cluster certificate can neither serve nor call anything. Files are read once, at start; the config group
(shared.config.groups.TlsConfig) says which files, and `TlsFiles.from_config` returns None when TLS is off.

    creds = TlsFiles.from_config(cfg.tls)
    port = listen(server, "127.0.0.1:0", creds)                  # TLS (client certificates required) or plain
    channel = open_channel("127.0.0.1:50051", creds, options)     # presents our certificate, checks the peer's
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from shared.config.groups import TlsConfig


class TlsError(ValueError):
    """A TLS file is missing or unreadable; the message names the flag."""


def read_pem(path: str, flag: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise TlsError(
            f"{flag} {path}: cannot read it ({e.strerror}); make certificates with `pdrelay certs`"
        ) from None
    if b"-----BEGIN " not in data:
        raise TlsError(f"{flag} {path}: not a PEM file (no '-----BEGIN' line)")
    return data


@dataclass(frozen=True)
class TlsFiles:
    """The PEM contents of one service's TLS identity: the cluster CA, its certificate chain and private key
    (`ca` may be empty for a server that asks clients for no certificate)."""

    ca: bytes
    cert: bytes
    key: bytes
    ca_path: str = ""
    cert_path: str = ""
    key_path: str = ""

    @classmethod
    def load(cls, ca_file: str, certfile: str, keyfile: str) -> TlsFiles:
        return cls(
            ca=read_pem(ca_file, "--tls-ca-file"),
            cert=read_pem(certfile, "--tls-certfile"),
            key=read_pem(keyfile, "--tls-keyfile"),
            ca_path=ca_file,
            cert_path=certfile,
            key_path=keyfile,
        )

    @classmethod
    def from_config(cls, tls_cfg: TlsConfig | None) -> TlsFiles | None:
        """From a TlsConfig group (or None / a group with no files: TLS off)."""
        if tls_cfg is None or not tls_cfg.tls_ca_file:
            return None
        # the tls passes of shared/config checked that the CA comes with a certificate and its key
        assert tls_cfg.tls_certfile and tls_cfg.tls_keyfile, "tls_ca_file without tls_certfile / tls_keyfile"
        return cls.load(tls_cfg.tls_ca_file, tls_cfg.tls_certfile, tls_cfg.tls_keyfile)

    # ------------------------------------------------------------------ gRPC

    def server_credentials(self, *, require_client_cert: bool = True) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)],
            root_certificates=self.ca or None,
            require_client_auth=require_client_cert and bool(self.ca),
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )

    # ------------------------------------------------------------------ etcd / NATS

    def etcd_args(self) -> dict[str, bytes]:
        """Keyword arguments of etcd3aio.Etcd3Client for mutual TLS."""
        return {"ca_cert": self.ca, "cert_key": self.key, "cert_chain": self.cert}

    def client_ssl_context(self) -> ssl.SSLContext:
        """For clients that take an ssl.SSLContext (nats-py): verify the server, present our certificate."""
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=self.ca.decode())
        ctx.load_cert_chain(self.cert_path, self.key_path)
        return ctx


def listen(server: grpc.aio.Server, address: str, tls: TlsFiles | None, *, require_client_cert: bool = True) -> int:
    """Add a listening port (TLS when `tls` is given) and return the port number bound."""
    if tls is None:
        return server.add_insecure_port(address)
    return server.add_secure_port(address, tls.server_credentials(require_client_cert=require_client_cert))


def open_channel(address: str, tls: TlsFiles | None, options: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Channel:
    """A channel to a pdrelay service: mutual TLS when `tls` is given, plaintext otherwise."""
    if tls is None:
        return grpc.aio.insecure_channel(address, options=list(options))
    return grpc.aio.secure_channel(address, tls.channel_credentials(), options=list(options))
