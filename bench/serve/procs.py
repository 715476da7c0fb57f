"""Server processes for the serving benchmark: CPU time of any process from /proc, and the pdrelay gateway over
mock workers (`--mock-workers`) started on a free loopback port, waited for, and stopped.

CPU time comes from two places: /proc/<pid>/stat utime+stime (the whole process, exited threads included, but
in clock ticks of 10 ms) and the sum of /proc/<pid>/task/*/schedstat (nanoseconds, live threads only). A
measured phase of a few hundred requests costs the gateway tens of milliseconds, so the tick count alone is
too coarse; the benchmark reports the nanosecond figure and keeps the tick figure as a cross-check.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from shared.cluster.localcluster.servers import die_with_parent, free_port, stop_process

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CpuSample:
    stat_s: float  # utime + stime of the process, tick resolution
    sched_s: float | None  # sum over live threads of the scheduler's run time, ns resolution (None if unreadable)

    def minus(self, before: CpuSample) -> CpuSample:
        sched = None if self.sched_s is None or before.sched_s is None else self.sched_s - before.sched_s
        return CpuSample(self.stat_s - before.stat_s, sched)

    @property
    def best_s(self) -> float:
        return self.sched_s if self.sched_s is not None else self.stat_s


def process_cpu(pid: int) -> CpuSample:
    """CPU seconds `pid` has used so far. ValueError naming the pid if it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        raise ValueError(f"process {pid} does not exist (or /proc is not readable); pass the pid of the server "
                         f"process to measure") from None
    fields = stat.rsplit(")", 1)[1].split()  # the command name may contain spaces: split after it
    stat_s = (int(fields[11]) + int(fields[12])) * _TICK_S  # fields 14 and 15 of proc(5): utime, stime
    sched_ns = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                sched_ns += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
            except (OSError, IndexError, ValueError):
                continue  # a thread that exited between listdir and read
    except OSError:
        return CpuSample(stat_s, None)
    return CpuSample(stat_s, sched_ns / 1e9)


class MockGateway:
    """`python -m services.gateway.mock_main` as a child process on a free 127.0.0.1 port."""

    def __init__(self, model_dir: str | Path, *, token_delay_ms: float = 0.0, first_token_delay_ms: float = 0.0,
                 extra_args: tuple[str, ...] = ()) -> None:
        self.model_dir = Path(model_dir)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.NamedTemporaryFile(prefix="pdrelay-bench-gateway-", suffix=".log", delete=False)
        self.log_path = Path(self._log.name)
        cmd = [sys.executable, "-m", "services.gateway.mock_main", "--host", "127.0.0.1", "--port", str(self.port),
               "--model", str(self.model_dir), "--token-delay-ms", str(token_delay_ms),
               "--first-token-delay-ms", str(first_token_delay_ms), *extra_args]
        # One thread for anything numeric in the gateway: it shares the cores with this client.
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env, preexec_fn=die_with_parent)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the mock gateway exited with code {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.base_url}/health", timeout=1.0) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"the mock gateway did not answer /health within {timeout_s:g} s:\n{self.log_tail()}")

    def stop(self) -> None:
        stop_process(self.proc)
        self._log.close()
        self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> MockGateway:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
