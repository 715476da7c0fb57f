"""A peer server for the serving benchmark (`--peer-cmd`): any OpenAI-compatible server started from a shell
command on a free loopback port, waited for, measured next to pdrelay's gateway, and stopped with its process
group.

The command's `{port}` is replaced by the port it must serve HTTP on, `{pid_file}` by a file it may write
lines `front PID` / `worker PID` to. Front pids are the peer's gateway (their CPU is compared with ours);
worker pids are reported apart. Without a pid file the started process is the front (start the server with
`exec` so that it is not a shell). bench/dynamo_peer.sh is such a command for Dynamo's frontend + mocker.
"""

from __future__ import annotations

import json
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from shared.cluster.localcluster.servers import free_port
from shared.cluster.localcluster.service_process import ServiceProcess

_ROLES = ("front", "worker")


def parse_pid_file(text: str) -> dict[str, tuple[int, ...]]:
    """`front 123` / `worker 456` lines -> {"front": (123,), "worker": (456,)}. ValueError names a bad line."""
    out: dict[str, list[int]] = {r: [] for r in _ROLES}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2 or parts[0] not in _ROLES or not parts[1].isdigit():
            raise ValueError(f"peer pid file line {n} {line!r} must be 'front PID' or 'worker PID'")
        out[parts[0]].append(int(parts[1]))
    return {k: tuple(v) for k, v in out.items()}


class PeerProcess:
    """`bash -c CMD` in its own session (so that stopping it stops everything it started)."""

    def __init__(self, command: str) -> None:
        if "{port}" not in command:
            raise ValueError(f"--peer-cmd {command!r} must contain {{port}} (the port the peer serves HTTP on)")
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        fd, pid_file = tempfile.mkstemp(prefix="pdrelay-bench-peer-", suffix=".pids")
        os.close(fd)
        self.pid_file = Path(pid_file)
        self.command = command.replace("{port}", str(self.port)).replace("{pid_file}", str(self.pid_file))
        self._model: list[str] = []  # what GET /v1/models listed first, once it lists one
        self.service = ServiceProcess(
            "peer",
            ["bash", "-c", self.command],
            probe=self._lists_a_model,
            tie_to_parent=True,
            new_session=True,
            merge_output=True,
        )
        self.proc = self.service.proc

    def log_tail(self, n: int = 3000) -> str:
        return self.service.log()[-n:]

    def _lists_a_model(self, _: ServiceProcess) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/v1/models", timeout=2.0) as resp:
                data = json.loads(resp.read()).get("data") or []
                if resp.status == 200 and data:
                    self._model[:] = [str(data[0]["id"])]
        except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError):
            pass
        return bool(self._model)

    def wait_ready(self, timeout_s: float) -> str:
        """Until GET /v1/models lists a model; returns its name. RuntimeError/TimeoutError with the log tail."""
        try:
            self.service.wait_ready(timeout_s)
        except RuntimeError:
            raise RuntimeError(
                f"the peer ({self.command}) exited with code {self.proc.returncode}:\n{self.log_tail()}"
            ) from None
        except TimeoutError:
            raise TimeoutError(
                f"the peer ({self.command}) listed no model at {self.base_url}/v1/models within "
                f"{timeout_s:g} s (raise --peer-start-timeout-s if it is slow to start):\n"
                f"{self.log_tail()}"
            ) from None
        return self._model[0]

    def pids(self) -> dict[str, tuple[int, ...]]:
        """Front and worker pids from the pid file; the started process as the front when there is none."""
        try:
            found = parse_pid_file(self.pid_file.read_text())
        except OSError:
            found = {r: () for r in _ROLES}
        if not found["front"]:
            found["front"] = (self.proc.pid,)
        return found

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM to the command's process group, SIGKILL to whatever is left of it after `timeout_s`."""
        self.service.stop(timeout_s)
        self.pid_file.unlink(missing_ok=True)

    def __enter__(self) -> PeerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
