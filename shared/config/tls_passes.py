"""Resolution passes of the TLS settings: the service mesh (--tls-*) and the gateway's public door (--ssl-*).

Both check what the seed checks: a key needs its certificate and the other way round, a CA alone is an error, and
every file exists before anything heavy (model loading) starts.
"""

from __future__ import annotations

import os

from shared.config.errors import ConfigError
from shared.config.resolved import ResolvedConfig

_MAKE = "make a local CA and certificates with `pdrelay certs --out DIR`"


def _check_files_exist(cfg: ResolvedConfig, keys: tuple[str, ...]) -> None:
    for key in keys:
        path = cfg.get(key)
        if path is not None and not os.path.isfile(path):
            raise cfg.origin(key).fail(path, "does not exist (or is not a file)", f"give an existing PEM file; {_MAKE}")


def check_tls_files(cfg: ResolvedConfig, ctx: object) -> ResolvedConfig:
    """tls_ca_file, tls_certfile and tls_keyfile are all set (mutual TLS needs the three) or none; the files exist."""
    if not cfg.has("tls"):
        return cfg
    keys = ("tls.tls_ca_file", "tls.tls_certfile", "tls.tls_keyfile")
    given = [k for k in keys if cfg.get(k) is not None]
    if given and len(given) < len(keys):
        missing = " and ".join("--" + k.split(".", 1)[1].replace("_", "-") for k in keys if k not in given)
        shown = ", ".join(cfg.origin(k).show(cfg.get(k)) for k in given)
        raise ConfigError(
            f"{shown}: mutual TLS between services also needs {missing} (the CA, this service's "
            f"certificate and its key); {_MAKE}"
        )
    _check_files_exist(cfg, keys)
    if not given:
        secure = [u for u in cfg.discovery.etcd_endpoints if u.strip().lower().startswith("https://")]
        if secure:
            raise cfg.origin("discovery.etcd_endpoints").fail(
                secure[0], "is https://", f"give --tls-ca-file, --tls-certfile and --tls-keyfile; {_MAKE}"
            )
        if cfg.bus.nats_url.strip().lower().startswith("tls://"):
            raise cfg.origin("bus.nats_url").fail(
                cfg.bus.nats_url, "is tls://", f"give --tls-ca-file, --tls-certfile and --tls-keyfile; {_MAKE}"
            )
    return cfg


def check_ssl_files(cfg: ResolvedConfig, ctx: object) -> ResolvedConfig:
    """ssl_keyfile needs ssl_certfile and the other way round; ssl_ca_certs or a key password without them is an
    error; the files exist."""
    if not cfg.has("http"):
        return cfg
    http = cfg.http
    cert, key = "http.ssl_certfile", "http.ssl_keyfile"
    if (http.ssl_certfile is None) != (http.ssl_keyfile is None):
        have, lack = (cert, "--ssl-keyfile") if http.ssl_certfile is not None else (key, "--ssl-certfile")
        raise cfg.origin(have).fail(cfg.get(have), f"needs {lack} too", f"give both, or neither; {_MAKE}")
    if http.ssl_certfile is None:
        for extra in ("http.ssl_ca_certs", "http.ssl_keyfile_password"):
            if cfg.get(extra) is not None:
                shown = cfg.origin(extra).show("..." if extra.endswith("password") else cfg.get(extra))
                raise ConfigError(
                    f"{shown} has no effect without --ssl-certfile and --ssl-keyfile; add them or drop it"
                )
    _check_files_exist(cfg, (cert, key, "http.ssl_ca_certs"))
    return cfg
