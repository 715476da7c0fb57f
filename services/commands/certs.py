"""`pdrelay certs`: a local CA and one certificate per service, for mutual TLS between services (`pdrelay up --tls`).

    pdrelay certs --out certs/                          # ca.pem + gateway.pem, prefill.pem, ... (+ -key.pem)
    pdrelay certs --out certs/ --san gw.example.com     # extra host names / addresses in every certificate
    pdrelay serve decode --tls-ca-file certs/ca.pem --tls-certfile certs/decode.pem --tls-keyfile certs/decode-key.pem

An existing CA in --out is reused (so new certificates are trusted by the old ones); --force makes a new one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    from shared.cluster.certs import DEFAULT_NAMES

    p = sub.add_parser(
        "certs",
        help="make a local CA and per-service certificates (mutual TLS)",
        description=__doc__,
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, help="directory for the CA and the certificates")
    p.add_argument(
        "--name",
        action="append",
        default=None,
        metavar="NAME",
        help=f"a certificate to issue (repeatable; default: {', '.join(DEFAULT_NAMES)})",
    )
    p.add_argument(
        "--san",
        action="append",
        default=[],
        metavar="HOST",
        help="an extra DNS name or IP address in every certificate (repeatable)",
    )
    p.add_argument("--days", type=int, default=365, help="validity of the CA and certificates (default 365)")
    p.add_argument("--force", action="store_true", help="make a new CA even if --out has one")
    p.set_defaults(_run=run)


def run(ns: argparse.Namespace, extra: list[str]) -> int:
    from shared.cluster.certs import CA_CERT, DEFAULT_NAMES, make_certs

    if extra:
        print(f"pdrelay certs: unknown arguments: {' '.join(extra)}", file=sys.stderr)
        return 2
    out = Path(ns.out)
    try:
        made = make_certs(out, ns.name or DEFAULT_NAMES, sans=ns.san, days=ns.days, force=ns.force)
    except (ValueError, OSError) as e:
        print(f"pdrelay certs: error: {e}", file=sys.stderr)
        return 2
    print(f"CA: {out / CA_CERT}")
    for name, ident in made.items():
        print(f"{name}: {ident.cert} {ident.key}")
    return 0
