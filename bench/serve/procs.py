"""Server processes for the serving benchmark: CPU time of any process from /proc, and the pdrelay gateway over
mock workers (`--mock-workers`) started on a free loopback port, waited for, and stopped.

CPU time comes from two places: /proc/<pid>/stat utime+stime (the whole process, exited threads included, but
in clock ticks of 10 ms) and the sum of /proc/<pid>/task/*/schedstat (nanoseconds, live threads only). A
measured phase of a few hundred requests costs the gateway tens of milliseconds, so the tick count alone is
too coarse; the benchmark reports the nanosecond figure and keeps the tick figure as a cross-check.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from shared.cluster.localcluster.servers import free_port
from shared.cluster.localcluster.service_process import ServiceProcess, http_ok

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
        raise ValueError(
            f"process {pid} does not exist (or /proc is not readable); pass the pid of the server process to measure"
        ) from None
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
    """`python -m services.gateway.mock` as a child process on a free 127.0.0.1 port."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        token_delay_ms: float = 0.0,
        first_token_delay_ms: float = 0.0,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.model_dir = Path(model_dir)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable,
            "-m",
            "services.gateway.mock",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--model",
            str(self.model_dir),
            "--token-delay-ms",
            str(token_delay_ms),
            "--first-token-delay-ms",
            str(first_token_delay_ms),
            *extra_args,
        ]
        # One OpenMP thread (service_env) for anything numeric in the gateway: it shares the cores with this client.
        self.service = ServiceProcess(
            "mock-gateway", cmd, probe=http_ok(f"{self.base_url}/health"), tie_to_parent=True, merge_output=True
        )

    @property
    def pid(self) -> int:
        return self.service.pid

    def log_tail(self, n: int = 2000) -> str:
        return self.service.log()[-n:]

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Until GET /health answers 200; RuntimeError/TimeoutError with the log tail."""
        self.service.wait_ready(timeout_s)

    def stop(self) -> None:
        self.service.stop()

    def __enter__(self) -> MockGateway:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
