"""Typed control-plane errors. Their messages name the URL, the flag that set it and how to get a server running."""

from __future__ import annotations

from shared.cluster.localcluster.servers import etcd_command_hint, nats_command_hint


class ControlPlaneUnavailable(ConnectionError):
    """etcd or NATS could not be reached when a process started (later outages are survived, not raised)."""

    def __init__(self, what: str, url: str, flag: str, detail: str = "") -> None:
        self.what, self.url, self.flag = what, url, flag
        hint = etcd_command_hint(url) if what == "etcd" else nats_command_hint(url)
        msg = (f"cannot reach {what} at {url} (set by {flag})"
               + (f": {detail}" if detail else "")
               + f". Start a local cluster with `pdrelay up`, or run {what} yourself: `{hint}`, "
               f"or point {flag} at a running one.")
        super().__init__(msg)


def etcd_unavailable(url: str, detail: str = "") -> ControlPlaneUnavailable:
    return ControlPlaneUnavailable("etcd", url, "--etcd-endpoints / PDRELAY_ETCD_ENDPOINTS", detail)


def nats_unavailable(url: str, detail: str = "") -> ControlPlaneUnavailable:
    return ControlPlaneUnavailable("NATS", url, "--nats-url / PDRELAY_NATS_URL", detail)


class StartupError(ValueError):
    """A service cannot start because of its own settings (a port in use, ...); the message says what to change."""
