"""One service process of `pdrelay up`: its spec, process, log file, ready line and state, as the supervisor tracks
it; and how a whole process group is signalled."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TextIO

from shared.cluster.handshake import ReadyInfo, parse_ready_line
from shared.cluster.localcluster.plan import InstanceSpec
from shared.cluster.localcluster.rundir import ChildState


class Child:
    """A started service process (starting -> ready -> draining -> exited)."""

    def __init__(self, spec: InstanceSpec, proc: asyncio.subprocess.Process, log_path: Path) -> None:
        self.spec = spec
        self.proc = proc
        self.log_path = log_path
        self.ready: ReadyInfo | None = None
        self.state = "starting"
        self.ready_event = asyncio.Event()
        self.exited = asyncio.Event()
        self.restarts = 0
        self.tasks: list[asyncio.Task[None]] = []

    @property
    def role(self) -> str:
        return self.spec.role

    @property
    def iid(self) -> str:
        return self.spec.instance_id

    def as_state(self) -> ChildState:
        r = self.ready
        return ChildState(
            role=self.role,
            instance_id=self.iid,
            pid=self.proc.pid,
            state=self.state,
            grpc=r.grpc if r else "",
            http=r.http if r else "",
            epoch=r.epoch if r else 0,
            log=str(self.log_path),
            config=self.spec.config_path,
            restarts=self.restarts,
        )

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"


def signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)  # the child leads its own session: this reaches its children too
    except ProcessLookupError:
        pass
    except PermissionError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


@dataclass(frozen=True)
class NotReady:
    """Why the children did not all become ready: what to print, and the failure to record ("" when stopped)."""

    message: str
    why: str = ""


async def wait_ready(children: list[Child], timeout_s: float, stop: asyncio.Event, logs: Path) -> NotReady | None:
    """Wait until every child printed its ready line; NotReady when one exited first, time ran out, or `stop`."""
    pending = {c for c in children if c.ready is None}
    deadline = time.monotonic() + timeout_s
    while pending:
        if stop.is_set():
            return NotReady("stopped while starting")
        for c in list(pending):
            if c.ready is not None:
                pending.discard(c)
            elif c.exited.is_set():
                why = f"{c.iid} exited with code {c.proc.returncode} before it was ready"
                return NotReady(f"{why}; its last log lines ({c.log_path}):\n{c.log_tail()}", why)
        if time.monotonic() > deadline:
            names = ", ".join(sorted(c.iid for c in pending))
            why = f"{names} not ready after {timeout_s:.0f} s"
            return NotReady(f"{why} (--ready-timeout-s); see their logs in {logs}", why)
        waits = [asyncio.ensure_future(e.wait()) for c in pending for e in (c.ready_event, c.exited)]
        waits.append(asyncio.ensure_future(stop.wait()))
        await asyncio.wait(waits, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
    return None


def gpus_in_use(children: list[Child]) -> set[int]:
    """Host GPU ids held by children that are starting, ready or draining."""
    return {
        int(d.split(":", 1)[1])
        for c in children
        if c.state in ("starting", "ready", "draining")
        for d in c.spec.devices
        if d.startswith("cuda:")
    }


async def pump(
    child: Child,
    stream: asyncio.StreamReader,
    logf: BinaryIO,
    echo: TextIO | None,
    on_ready: Callable[[], None] | None,
) -> None:
    """Copy one of the child's output streams into its log file (and to `echo`, prefixed with its instance id).
    on_ready: given for stdout, where the ready line is looked for; called once the child is ready."""
    prefix = f"{child.iid:<12}| "
    while True:
        try:
            line = await stream.readline()
        except (ValueError, asyncio.LimitOverrunError):
            line = await stream.read(1 << 16)  # an over-long line: pass it on in pieces
        if not line:
            return
        logf.write(line)
        logf.flush()
        if on_ready is not None and child.ready is None:
            info = parse_ready_line(line)
            if info is not None:
                child.ready, child.state = info, "ready"
                child.ready_event.set()
                on_ready()
        if echo is not None:
            echo.write(prefix + line.decode(errors="replace").rstrip("\n") + "\n")
            echo.flush()


async def terminate(children: list[Child], timeout_s: float, force: asyncio.Event, say: Callable[[str], None]) -> None:
    """SIGTERM (the whole process group), wait (until `force` is set at most), then SIGKILL what is left."""
    live = [c for c in children if c.proc.returncode is None]
    for c in live:
        signal_group(c.proc.pid, signal.SIGTERM)
    waits = [asyncio.ensure_future(c.exited.wait()) for c in live]
    if waits:
        forced = asyncio.ensure_future(force.wait())
        all_exited = asyncio.ensure_future(asyncio.wait(waits))
        await asyncio.wait([all_exited, forced], timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        for f in (forced, all_exited, *waits):
            f.cancel()
    for c in live:
        if c.proc.returncode is None:
            say(f"pdrelay up: {c.iid} did not stop within {timeout_s:.0f} s; killing it")
            signal_group(c.proc.pid, signal.SIGKILL)
    for c in live:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(c.exited.wait(), 5)
