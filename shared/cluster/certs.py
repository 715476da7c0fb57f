"""A local certificate authority and per-service certificates for mutual TLS (`pdrelay certs`, `pdrelay up --tls`).

    DIR/ca.pem, DIR/ca-key.pem              the cluster CA (its key stays here; only `pdrelay certs` uses it)
    DIR/<name>.pem, DIR/<name>-key.pem      one identity per service (gateway, prefill, decode, ..., etcd, nats)

Each service certificate is valid for server and client authentication, for 127.0.0.1, ::1, localhost, this host's
name and any extra names (`--san`). Keys are ECDSA P-256, written with mode 0600. An existing CA is reused, so
certificates issued later (another service, more names) are trusted by everything issued before.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Roles, the control-plane servers `pdrelay up` starts, the supervisor and a client identity for tools and tests.
DEFAULT_NAMES = (
    "gateway",
    "prefill",
    "decode",
    "worker",
    "encoder",
    "kvstore",
    "planner",
    "etcd",
    "nats",
    "supervisor",
    "client",
)
CA_CERT, CA_KEY = "ca.pem", "ca-key.pem"


@dataclass(frozen=True)
class Identity:
    cert: Path
    key: Path


def cert_paths(directory: Path, name: str) -> Identity:
    return Identity(directory / f"{name}.pem", directory / f"{name}-key.pem")


def _write(path: Path, data: bytes, private: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _load_or_make_ca(directory: Path, days: int, force: bool) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert_path, key_path = directory / CA_CERT, directory / CA_KEY
    if cert_path.exists() and key_path.exists() and not force:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{key_path} is not an ECDSA key made by `pdrelay certs`; use --force to make a new CA")
        return x509.load_pem_x509_certificate(cert_path.read_bytes()), key
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "pdrelay"),
            x509.NameAttribute(NameOID.COMMON_NAME, "pdrelay local CA"),
        ]
    )
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write(key_path, _key_pem(key), private=True)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), private=False)
    return cert, key


def _alt_names(extra: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
        x509.DNSName("localhost"),
    ]
    host = socket.gethostname()
    for value in (host, *extra):
        if not value:
            continue
        try:
            entry: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(value))
        except ValueError:
            entry = x509.DNSName(value)
        if entry not in names:
            names.append(entry)
    return names


def issue(
    directory: Path,
    name: str,
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    *,
    sans: Sequence[str] = (),
    days: int = 365,
) -> Identity:
    """A certificate for service `name`, signed by the CA, usable as TLS server and client."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "pdrelay"),
                    x509.NameAttribute(NameOID.COMMON_NAME, name),
                ]
            )
        )
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(_alt_names(sans)), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ident = cert_paths(directory, name)
    _write(ident.key, _key_pem(key), private=True)
    _write(ident.cert, cert.public_bytes(serialization.Encoding.PEM), private=False)
    return ident


def make_certs(
    directory: Path,
    names: Sequence[str] = DEFAULT_NAMES,
    *,
    sans: Sequence[str] = (),
    days: int = 365,
    force: bool = False,
) -> dict[str, Identity]:
    """The CA (reused when present, unless `force`) and one certificate per name; returns name -> files."""
    if days < 1:
        raise ValueError(f"--days must be >= 1 (got {days})")
    for name in names:
        if not name or not all(c.isalnum() or c in "-_" for c in name):
            raise ValueError(f"certificate name {name!r} must be letters, digits, '-' or '_' (it names the files)")
    ca, ca_key = _load_or_make_ca(directory, days, force)
    return {name: issue(directory, name, ca, ca_key, sans=sans, days=days) for name in names}
