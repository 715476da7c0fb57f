"""Typed control-plane errors. Their messages name the URL, the flag that set it and how to get a server running."""

from __future__ import annotations


class ControlPlaneUnavailable(ConnectionError):
    """etcd or NATS could not be reached when a process started (later outages are survived, not raised)."""

    def __init__(self, what: str, url: str, flag: str, detail: str = "") -> None:
        self.what, self.url, self.flag = what, url, flag
        hint = etcd_command_hint(url) if what == "etcd" else nats_command_hint(url)
        msg = (
            f"cannot reach {what} at {url} (set by {flag})"
            + (f": {detail}" if detail else "")
            + f". Start a local cluster with `pdrelay up`, or run {what} yourself: `{hint}`, "
            f"or point {flag} at a running one."
        )
        super().__init__(msg)


def etcd_unavailable(url: str, detail: str = "") -> ControlPlaneUnavailable:
    return ControlPlaneUnavailable("etcd", url, "--etcd-endpoints / PDRELAY_ETCD_ENDPOINTS", detail)


def nats_unavailable(url: str, detail: str = "") -> ControlPlaneUnavailable:
    return ControlPlaneUnavailable("NATS", url, "--nats-url / PDRELAY_NATS_URL", detail)


class StartupError(ValueError):
    """A service cannot start because of its own settings (a port in use, ...); the message says what to change."""


def etcd_command_hint(url: str = "http://127.0.0.1:2379") -> str:
    """The command line that starts a local etcd on `url` (for error messages)."""
    peer = "http://127.0.0.1:2380"
    return (
        f"etcd --data-dir /tmp/pdrelay-etcd --listen-client-urls {url} --advertise-client-urls {url} "
        f"--listen-peer-urls {peer} --initial-advertise-peer-urls {peer} --initial-cluster default={peer}"
    )


def nats_command_hint(url: str = "nats://127.0.0.1:4222") -> str:
    hostport = url.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    return f"nats-server -a {host or '127.0.0.1'} -p {port or 4222} -js -sd /tmp/pdrelay-nats"
