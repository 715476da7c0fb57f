"""One service as a child process: spawn it, poll until it is ready, capture its output, stop it by PID.

    with ServiceProcess("decode-1", python_cmd("services.decode", ...), tmp) as p:
        p.wait_ready(120)                       # the ready line on stdout (shared.cluster.handshake)
        talk_to(p.ready.grpc)
    # SIGTERM, then SIGKILL after the grace period

    procs = [ServiceProcess(...), ServiceProcess(...)]      # all at once: start-up is imports and model loads,
    wait_all_ready(procs, 120)                              # so they overlap
    stop_all(procs, 20)                                     # one SIGTERM each (they drain in parallel)

The benchmarks and the tests start services this way. stdout goes to `<log_dir>/<name>.out` (where the ready
line is read from) and stderr to `<name>.err`, so a chatty service never blocks on a full pipe and a failure
names its last log lines. Readiness is a probe: the ready line by default, `http_ok(url)` for a server that
prints none (the mock gateway, a peer server), or any callable of the process.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Final

from shared.cluster.handshake import ReadyInfo, parse_ready_line
from shared.cluster.localcluster.servers import die_with_parent

# No model download from a hub (a service loads local or bundled weights only), and no tokenizers thread pool
# (it warns and can deadlock after a fork).
OFFLINE_ENV: Final[Mapping[str, str]] = MappingProxyType({"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})


def service_env(**extra: str) -> dict[str, str]:
    """This process's environment with OFFLINE_ENV and one OpenMP thread: a service's compute threads come from
    its --threads, so that processes sharing the cores do not each start a pool per core."""
    return {**os.environ, **OFFLINE_ENV, "OMP_NUM_THREADS": "1", **extra}


def python_cmd(module: str, *args: str) -> list[str]:
    """`python -m module args...` with this interpreter (a service's command line)."""
    return [sys.executable, "-m", module, *args]


ReadyProbe = Callable[["ServiceProcess"], bool]


def ready_line(p: ServiceProcess) -> bool:
    """Ready once the handshake line is on stdout; keeps it as `p.ready`."""
    if p.ready is None:
        for line in p.out_path.read_bytes().splitlines():
            info = parse_ready_line(line)
            if info is not None:
                p.ready = info
                break
    return p.ready is not None


def http_ok(url: str, timeout_s: float = 1.0) -> ReadyProbe:
    """Ready once GET `url` answers 200 (e.g. a gateway's /health)."""

    def probe(_: ServiceProcess) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    return probe


class ServiceProcess:
    """A child process with its output in files, a readiness probe, and an ending by PID.

    `tie_to_parent`: the kernel SIGTERMs it when this process dies (a benchmark killed with SIGKILL leaves no
    service behind; spawn from the main thread). `new_session`: its own process group, and every signal goes to
    the group (a shell command that starts servers of its own). `merge_output`: stderr into the .out file too.
    """

    def __init__(
        self,
        name: str,
        cmd: Sequence[str],
        log_dir: Path | None = None,
        *,
        env: Mapping[str, str] | None = None,
        probe: ReadyProbe = ready_line,
        tie_to_parent: bool = False,
        new_session: bool = False,
        merge_output: bool = False,
    ) -> None:
        self.name = name
        self.cmd = list(cmd)
        self._own_dir = log_dir is None  # a temporary directory, removed by stop()
        self.log_dir = Path(tempfile.mkdtemp(prefix=f"pdrelay-{name}-")) if log_dir is None else log_dir
        self.out_path = self.log_dir / f"{name}.out"
        self.err_path = self.out_path if merge_output else self.log_dir / f"{name}.err"
        self.probe = probe
        self.ready: ReadyInfo | None = None
        self._group = new_session
        with open(self.out_path, "wb") as out, open(self.err_path, "ab") as err:
            self.proc = subprocess.Popen(
                self.cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT if merge_output else err,
                env=dict(service_env() if env is None else env),
                start_new_session=new_session,
                preexec_fn=die_with_parent if tie_to_parent else None,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def alive(self) -> bool:
        return self.proc.poll() is None

    # ---- readiness -------------------------------------------------------------------------------------------------
    def poll_ready(self) -> bool:
        """One probe; RuntimeError with the log tail if the process has exited before it was ready."""
        if self.probe(self):
            return True
        if not self.alive():
            raise RuntimeError(
                f"{self.name} exited with code {self.proc.returncode} before it was ready:\n{self.log_tail()}"
            )
        return False

    def wait_ready(self, timeout_s: float) -> ServiceProcess:
        wait_all_ready([self], timeout_s)
        return self

    # ---- logs ------------------------------------------------------------------------------------------------------
    def log(self) -> str:
        """What it wrote on stderr (stdout too with merge_output)."""
        try:
            return self.err_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    # ---- ending ----------------------------------------------------------------------------------------------------
    def send_signal(self, sig: signal.Signals) -> None:
        """`sig` to the process (to its group with new_session); nothing if it is gone."""
        try:
            if self._group:
                os.killpg(self.proc.pid, sig)
            elif self.alive():
                self.proc.send_signal(sig)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self) -> int:
        """SIGKILL, like a crash or an OOM kill; the exit code (-9 if it was still running)."""
        self.send_signal(signal.SIGKILL)
        return self.proc.wait(10)

    def stop(self, timeout_s: float = 5.0) -> int | None:
        """SIGTERM, up to `timeout_s` to exit (a service drains), then SIGKILL; the exit code."""
        return stop_all([self], timeout_s)[self.name]

    def __enter__(self) -> ServiceProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_all_ready(procs: Sequence[ServiceProcess], timeout_s: float) -> None:
    """Until every process is ready. RuntimeError when one exits first, TimeoutError naming the late ones; both
    carry log tails. Stopping them is the caller's (stop_all)."""
    deadline = time.monotonic() + timeout_s
    pending = list(procs)
    while True:
        pending = [p for p in pending if not p.poll_ready()]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"not ready within {timeout_s:.0f} s: {[p.name for p in pending]}\n"
                + "\n".join(f"----- {p.name}\n{p.log_tail(10)}" for p in pending)
            )
        time.sleep(0.1)


def stop_all(procs: Iterable[ServiceProcess], timeout_s: float = 20.0) -> dict[str, int | None]:
    """One SIGTERM each (so they drain in parallel; a second one would mean "stop now"), then wait; SIGKILL what
    has not exited after `timeout_s`. The exit codes by name (negative: that signal; None: could not be reaped).
    A process group is SIGKILLed once its leader is gone: whatever it started goes with it."""
    plist = list(procs)
    for p in plist:
        if p.alive():
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    codes: dict[str, int | None] = {}
    for p in plist:
        try:
            codes[p.name] = p.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGKILL)
            try:
                codes[p.name] = p.proc.wait(5.0)
            except subprocess.TimeoutExpired:
                codes[p.name] = None
        if p._group:
            p.send_signal(signal.SIGKILL)
        if p._own_dir:
            shutil.rmtree(p.log_dir, ignore_errors=True)
    return codes
