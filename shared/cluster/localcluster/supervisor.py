"""The `pdrelay up` supervisor: etcd + nats-server + the services as child processes, stopped cleanly.

    start    resolve every instance's config first (a bad flag stops everything before anything runs), then
             etcd and nats-server (unless external URLs were given), then the services in ROLE_ORDER
    ready    each child's ready line (stdout) -> print endpoints and a ready-to-paste curl
    logs     every child line goes to <run-dir>/logs/<id>.log and, prefixed with the instance id, to our stdout
    scale    `pdrelay scale` requests on NATS: start more instances, or drain some (drain command on the bus;
             SIGTERM if one does not exit within the stop timeout)
    restart  a child, etcd or nats-server that exits unexpectedly once the cluster was ready is started again, with
             backoff (restarts.py; `--no-restart` only reports it); `pdrelay status` shows the restart counts
    stop     SIGINT / SIGTERM (Ctrl-C or `pdrelay down`): gateways first, then the workers, SIGTERM then SIGKILL
             after the stop timeout, then NATS and etcd. A second signal skips the waiting.

Children run in their own sessions (a terminal's Ctrl-C reaches only us, and we stop them in order) and die with
us even if we are SIGKILLed (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import BinaryIO, TextIO

import msgspec

from shared.cluster.bus.admin_auth import AdminAuth
from shared.cluster.bus.client import Bus
from shared.cluster.bus.drain import send_drain
from shared.cluster.bus.scale import ScaleReply, ScaleRequest, serve_scale
from shared.cluster.errors import ControlPlaneUnavailable
from shared.cluster.etcd import connect_etcd
from shared.cluster.localcluster.child import Child, gpus_in_use, pump, terminate, wait_ready
from shared.cluster.localcluster.demo import ask_demo_question
from shared.cluster.localcluster.mooncake_plan import plan_mooncake
from shared.cluster.localcluster.netns_hosts import NetnsHosts, instance_ids
from shared.cluster.localcluster.plan import (
    ROLE_ORDER,
    InstanceSpec,
    UpOptions,
    build_spec,
    plan,
    role_available,
    scale_placement,
)
from shared.cluster.localcluster.restarts import RestartPolicy, Restarts
from shared.cluster.localcluster.rundir import TRACES_FILE, RunState, running_supervisor, write_state
from shared.cluster.localcluster.servers import (
    EtcdServer,
    MooncakeMaster,
    NatsServer,
    die_with_parent,
    free_port,
    port_is_free,
)
from shared.cluster.localcluster.summary import format_summary
from shared.cluster.localcluster.tracesink import TraceSink
from shared.cluster.netns import SUBNET
from shared.cluster.tls import TlsFiles

log = logging.getLogger(__name__)


class Supervisor:
    def __init__(self, opts: UpOptions, out: TextIO | None = None) -> None:
        self.opts = opts
        self.out = out or sys.stdout
        self.run_dir = Path(opts.run_dir).resolve()
        self.children: list[Child] = []
        self.etcd: EtcdServer | None = None
        self.nats: NatsServer | None = None
        self.mooncake: MooncakeMaster | None = None
        self.trace_sink: TraceSink | None = None
        self.bus: Bus | None = None
        self.state: RunState | None = None
        self._stop = asyncio.Event()
        self._force = asyncio.Event()
        self._next_index: dict[str, int] = {}
        self.restarts = Restarts(RestartPolicy(enabled=opts.restart))
        self._background: set[asyncio.Task[None]] = set()
        self._etcd_url = opts.etcd_url or ""
        self._nats_url = opts.nats_url or ""
        self.admin: AdminAuth | None = None  # signs drain commands, verifies scale requests
        self.tls: TlsFiles | None = None  # our own client identity with --tls
        self.hosts: NetnsHosts | None = None  # --netns

    # ------------------------------------------------------------------ output

    @property
    def _echo_to(self) -> TextIO | None:
        """Where children's log lines are echoed, prefixed with their instance id (None: only to their log files)."""
        return self.out if self.opts.echo_log else None

    def say(self, text: str) -> None:
        self.out.write(text if text.endswith("\n") else text + "\n")
        self.out.flush()

    def _save(self) -> None:
        assert self.state is not None
        self.state.children = [c.as_state() for c in self.children]
        self.state.etcd_restarts, self.state.nats_restarts = self.restarts.count("etcd"), self.restarts.count("nats")
        write_state(self.run_dir, self.state)

    # ------------------------------------------------------------------ run

    async def run(self) -> int:
        live = running_supervisor(self.run_dir)
        if live is not None:
            self.say(
                f"pdrelay up: a cluster is already running from {self.run_dir} (supervisor pid "
                f"{live.supervisor_pid}); stop it with `pdrelay down --run-dir {self.run_dir}` or use another "
                "--run-dir"
            )
            return 1
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal)
        self.state = RunState(
            supervisor_pid=os.getpid(),
            cluster=self.opts.cluster,
            etcd_url="",
            nats_url="",
            run_dir=str(self.run_dir),
            started_at=time.time(),
        )
        rc = 1
        try:
            rc = await self._run()
        except ControlPlaneUnavailable as e:
            self.say(f"pdrelay up: {e}")
            self._fail(str(e))
            rc = 2
        except ValueError as e:  # ConfigError and friends: bad user input, named in the message
            self.say(f"pdrelay up: error: {e}")
            self._fail(str(e))
            rc = 2
        finally:
            await self._shutdown()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        return rc

    def _fail(self, why: str) -> None:
        if self.state is not None:
            self.state.error = why
            self._save()

    def _on_signal(self) -> None:
        if self._stop.is_set():
            self._force.set()
        self._stop.set()

    async def _run(self) -> int:
        assert self.state is not None
        opts = self.opts
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._save()  # `pdrelay down` can stop us from here on
        if opts.netns:
            self._start_hosts()
        self._secure()
        opts = self.opts  # now with the admin secret (and the certificates) for every instance
        tls_dir = Path(opts.tls_dir) if opts.tls_dir else None
        # Ports first, then configs (bad flags fail before anything runs), then servers.
        if self.hosts is not None:
            self._netns_servers(tls_dir)
        elif not opts.etcd_url:
            port = opts.etcd_port or (2379 if port_is_free(2379) and port_is_free(2380) else free_port())
            self.etcd = EtcdServer(data_dir=self.run_dir / "etcd", port=port, tie_to_parent=True, tls_dir=tls_dir)
            self._etcd_url = self.etcd.url
        if not opts.nats_url and self.hosts is None:
            port = opts.nats_port or (4222 if port_is_free(4222) else free_port())
            self.nats = NatsServer(data_dir=self.run_dir / "nats", port=port, tie_to_parent=True, tls_dir=tls_dir)
            self._nats_url = self.nats.url
        self.state.etcd_url, self.state.nats_url = self._etcd_url, self._nats_url
        if opts.trace:
            self._start_trace_sink()
            opts = self.opts  # now with --otlp-traces-endpoint for every service
        self.opts, self.mooncake = plan_mooncake(opts, self.run_dir, self.say, self.hosts)
        opts = self.opts
        specs, notes = plan(opts, self._etcd_url, self._nats_url)
        self.state.skipped = notes
        for note in notes:
            self.say(f"pdrelay up: note: {note}")
        for spec in specs:
            self._next_index[spec.role] = self._next_index.get(spec.role, 0) + 1

        if self.etcd is None:  # an external etcd: check it answers before starting anything
            await (await connect_etcd([self._etcd_url], timeout_s=5, tls=self.tls)).close()
        if self.nats is None:
            self.bus = await Bus(self._nats_url, name=f"supervisor-{self.opts.cluster}", tls=self.tls).connect(
                timeout_s=5
            )
        if self.etcd is not None:
            # A fresh cluster each time: keys of a previous run would otherwise come back to life for one
            # lease TTL (etcd renews leases when it restarts) and show up as ghost instances.
            self.etcd.wipe()
            self.etcd.start()  # blocking, in the main thread (see die_with_parent)
            self.state.etcd_pid = self.etcd.pid or 0
        if self.nats is not None:
            self.nats.start()
            self.state.nats_pid = self.nats.pid or 0
            self.bus = await Bus(self._nats_url, name=f"supervisor-{self.opts.cluster}", tls=self.tls).connect(
                timeout_s=5
            )
        if self.mooncake is not None:
            self.mooncake.start()
            self.state.mooncake_master, self.state.mooncake_pid = self.mooncake.address, self.mooncake.pid or 0
        self._save()
        assert self.bus is not None
        await serve_scale(self.bus, opts.cluster, self._on_scale, auth=self.admin)

        for spec in specs:
            await self._spawn(spec)
        failure = await wait_ready(self.children, opts.ready_timeout_s, self._stop, self.run_dir / "logs")
        if failure is not None:
            self.say(f"pdrelay up: {failure.message}")
            if failure.why:
                self._fail(failure.why)
            return 1
        self.state.ready = True
        self._save()
        self._in_background(self._watch_servers())
        self.say(format_summary(self.state))
        if opts.demo:
            await ask_demo_question(self.children, self.opts.tls_dir, self.say)
        await self._stop.wait()
        return 0

    def _secure(self) -> None:
        """The admin secret (always) and, with --tls, a local CA and a certificate per role (an existing CA in
        <run-dir>/certs is reused); every instance gets their paths through its flags."""
        from shared.cluster.certs import DEFAULT_NAMES, cert_paths, make_certs

        assert self.state is not None
        secret = self.run_dir / "admin.secret"
        self.admin = AdminAuth.create_file(secret)
        changes: dict[str, str] = {"admin_secret_file": str(secret)}
        if self.opts.tls:
            certs = self.run_dir / "certs"
            # --netns: every address a host may get, so instances `pdrelay scale` adds later are covered too
            sans = [str(a) for a in SUBNET.hosts()] if self.hosts is not None else []
            make_certs(certs, (*DEFAULT_NAMES, *(r for r in ROLE_ORDER if r not in DEFAULT_NAMES)), sans=sans)
            me = cert_paths(certs, "supervisor")
            self.tls = TlsFiles.load(str(certs / "ca.pem"), str(me.cert), str(me.key))
            changes["tls_dir"] = str(certs)
            self.state.tls_dir = str(certs)
        self.opts = msgspec.structs.replace(self.opts, **changes)
        self.state.admin_secret_file = str(secret)

    def _start_hosts(self) -> None:
        """--netns: a host per instance, etcd and NATS on the control host, this process on the client host."""
        assert self.state is not None
        self.hosts = NetnsHosts(self.run_dir)
        iids = instance_ids(self.opts.counts, ROLE_ORDER)
        self.opts = msgspec.structs.replace(self.opts, hosts=self.hosts.start(iids))
        self.state.netns = self.hosts.client_ns
        self._save()

    def _netns_servers(self, tls_dir: Path | None) -> None:
        assert self.hosts is not None
        if self.opts.etcd_url or self.opts.nats_url:
            raise ValueError("--netns starts its own etcd and NATS on a host of their own; leave out --etcd / --nats")
        self.etcd, self.nats = self.hosts.control_plane(self.run_dir, tls_dir)
        self._etcd_url, self._nats_url = self.etcd.url, self.nats.url

    def _start_trace_sink(self) -> None:
        assert self.state is not None
        out = self.run_dir / TRACES_FILE
        self.trace_sink = TraceSink(data_dir=out.parent, port=free_port(), out=out, tie_to_parent=True)
        self.trace_sink.start()  # blocking, in the main thread (see die_with_parent)
        self.opts = msgspec.structs.replace(
            self.opts, extra=(*self.opts.extra, "--otlp-traces-endpoint", self.trace_sink.endpoint)
        )
        self.state.traces, self.state.trace_endpoint = str(out), self.trace_sink.endpoint
        self.state.trace_sink_pid = self.trace_sink.pid or 0
        self._save()

    # ------------------------------------------------------------------ children

    async def _spawn(self, spec: InstanceSpec) -> Child:
        logs = self.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        if spec.ready_file:
            Path(spec.ready_file).parent.mkdir(parents=True, exist_ok=True)
            Path(spec.ready_file).unlink(missing_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **spec.env}
        argv = spec.argv
        if self.hosts is not None:  # on its own host
            env.update(self.hosts.env())
            argv = (*self.hosts.prefix(spec.instance_id), *argv)
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            start_new_session=True,
            preexec_fn=die_with_parent,
            limit=1 << 20,
        )
        child = Child(spec, proc, logs / f"{spec.instance_id}.log")
        child.restarts = self.restarts.count(spec.instance_id)
        self.restarts.started(spec.instance_id)
        self.children.append(child)
        logf = open(child.log_path, "ab")  # noqa: SIM115, ASYNC230 - a local log file, closed by the waiter task
        assert proc.stdout is not None and proc.stderr is not None
        child.tasks = [
            asyncio.create_task(pump(child, proc.stdout, logf, self._echo_to, self._save)),
            asyncio.create_task(pump(child, proc.stderr, logf, self._echo_to, None)),
        ]
        child.tasks.append(asyncio.create_task(self._reap(child, logf)))
        self._save()
        return child

    async def _reap(self, child: Child, logf: BinaryIO) -> None:
        rc = await child.proc.wait()
        await asyncio.gather(*child.tasks[:2], return_exceptions=True)
        logf.close()
        was = child.state
        child.state = "exited"
        child.exited.set()
        if was == "draining" or self._stop.is_set():
            log.info("%s exited with code %s", child.iid, rc)
        else:
            self.say(
                f"pdrelay up: {child.iid} exited unexpectedly with code {rc}; last log lines:\n{child.log_tail(10)}"
            )
            if self.restarts.policy.enabled and self.state is not None and self.state.ready:
                self._in_background(self._restart(child))
        if was == "draining" and child in self.children:
            self.children.remove(child)  # scaled down: forget it
        if self.state is not None:
            self._save()

    async def _terminate(self, children: list[Child], timeout_s: float) -> None:
        await terminate(children, timeout_s, self._force, self.say)

    # ------------------------------------------------------------------ restarts

    def _in_background(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _stopped_within(self, seconds: float) -> bool:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)
        return self._stop.is_set()

    async def _restart(self, child: Child) -> None:
        """The same instance again (same id and flags; it registers with a new epoch), after the backoff."""
        delay = self.restarts.crashed(child.iid)
        self.say(
            f"pdrelay up: restarting {child.iid} in {delay:.0f} s (restart {self.restarts.count(child.iid)}; "
            "--no-restart turns this off)"
        )
        if await self._stopped_within(delay):
            return
        if child in self.children:
            self.children.remove(child)
        await self._spawn(child.spec)

    async def _watch_servers(self) -> None:
        """etcd, nats-server and the Mooncake master we started: one that died comes back on its port with its data
        directory."""
        reported: set[str] = set()
        while not await self._stopped_within(0.5):
            for name, server in (("etcd", self.etcd), ("nats", self.nats), ("mooncake_master", self.mooncake)):
                if server is None or server.alive() or name in reported:
                    continue
                rc = server.proc.returncode if server.proc is not None else None
                if not self.restarts.policy.enabled:
                    self.say(f"pdrelay up: {name} exited unexpectedly with code {rc}; not restarted (--no-restart)")
                    reported.add(name)
                    continue
                delay = self.restarts.crashed(name)
                self.say(
                    f"pdrelay up: {name} exited unexpectedly with code {rc}; restarting it in {delay:.0f} s "
                    f"on port {server.port} with its data in {server.data_dir}"
                )
                if await self._stopped_within(delay):
                    return
                try:
                    server.start()  # blocking, in the main thread (see die_with_parent); a few hundred ms
                except RuntimeError as e:  # e.g. the port is taken: next round tries again, later
                    self.say(f"pdrelay up: {name} did not start again: {e}")
                    continue
                self.restarts.started(name)
                assert self.state is not None
                if name == "etcd":
                    self.state.etcd_pid = server.pid or 0
                elif name == "nats":
                    self.state.nats_pid = server.pid or 0
                else:
                    self.state.mooncake_pid = server.pid or 0
                self._save()

    async def _shutdown(self) -> None:
        for task in list(self._background):
            task.cancel()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        if self.children:
            self.say("pdrelay up: stopping ...")
        gateways = [c for c in self.children if c.role == "gateway"]
        await self._terminate(gateways, self.opts.stop_timeout_s)
        await self._terminate([c for c in self.children if c.role != "gateway"], self.opts.stop_timeout_s)
        if self.bus is not None:
            await self.bus.close()
        for server in (self.trace_sink, self.mooncake, self.nats, self.etcd):
            if server is not None:
                await asyncio.to_thread(server.stop)
        if self.hosts is not None:
            self.hosts.close()
        if self.state is not None and not self.state.error:
            (self.run_dir / "state.json").unlink(missing_ok=True)
        if self.children:
            self.say("pdrelay up: stopped")

    # ------------------------------------------------------------------ scale

    async def _on_scale(self, req: ScaleRequest, meta: object) -> ScaleReply:
        if self._stop.is_set():
            return ScaleReply(ok=False, message="the cluster is stopping")
        started: list[str] = []
        draining: list[str] = []
        for role, want in req.targets.items():
            if role not in ROLE_ORDER:
                return ScaleReply(ok=False, message=f"unknown role {role!r}; choose from {', '.join(ROLE_ORDER)}")
            if want < 0:
                return ScaleReply(ok=False, message=f"{role}={want}: the count must be >= 0")
            if want > 0 and not role_available(role):
                return ScaleReply(ok=False, message=f"{role} is not in this build (no services.{role}.__main__)")
        for role, want in req.targets.items():
            live = [c for c in self.children if c.role == role and c.state in ("starting", "ready")]
            for _ in range(want - len(live)):
                index = self._next_index.get(role, 0)
                self._next_index[role] = index + 1
                if self.hosts is not None:
                    iid = f"{role}-{index + 1}"
                    hosts = {**self.opts.hosts, iid: self.hosts.add(iid)}
                    self.opts = msgspec.structs.replace(self.opts, hosts=hosts)
                try:
                    placement, gpu_host = scale_placement(role, self.opts, gpus_in_use(self.children))
                except ValueError as e:
                    return ScaleReply(ok=False, message=str(e))
                spec = build_spec(
                    role,
                    index,
                    self.opts,
                    self._etcd_url,
                    self._nats_url,
                    placement=placement,
                    on_gpu_host=gpu_host,
                )
                await self._spawn(spec)
                started.append(spec.instance_id)
            # the newest go first, unless the request names the instances to drain (the planner's idlest)
            order = sorted(live, key=lambda c: (c.iid in req.drain, c.spec.instance_id))
            for c in order[want:][::-1]:
                c.state = "draining"
                assert self.bus is not None
                await send_drain(
                    self.bus,
                    self.opts.cluster,
                    c.iid,
                    reason="scale_down",
                    epoch=c.ready.epoch if c.ready else 0,
                    auth=self.admin,
                )
                asyncio.create_task(self._ensure_gone(c))
                draining.append(c.iid)
        self._save()
        counts = {
            r: sum(1 for c in self.children if c.role == r and c.state in ("starting", "ready")) for r in req.targets
        }
        return ScaleReply(
            ok=True,
            started=tuple(started),
            draining=tuple(draining),
            counts=counts,
            message=f"started {len(started)}, draining {len(draining)}",
        )

    async def _ensure_gone(self, child: Child) -> None:
        """A drained instance exits on its own; one that ignores the command gets SIGTERM, then SIGKILL."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(child.exited.wait(), self.opts.stop_timeout_s)
            return
        await self._terminate([child], self.opts.stop_timeout_s)
