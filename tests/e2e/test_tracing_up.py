"""`pdrelay up --trace` and `pdrelay trace`, without a model: the supervisor starts the trace sink and points every
service's config at it; spans exported to the sink land in <run-dir>/traces/spans.jsonl; `pdrelay trace` lists the
traced requests and prints one request's tree and TTFT breakdown; `pdrelay down` stops the sink too."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shared.cluster.localcluster.plan import UpOptions, build_spec
from shared.cluster.localcluster.rundir import TRACES_FILE, RunState, pid_alive, read_state
from shared.cluster.localcluster.servers import free_port
from shared.cluster.localcluster.supervisor import Supervisor
from shared.config import ResolvedConfig
from shared.telemetry import spans
from shared.telemetry.tracing import SpanKind, Tracing, add_event

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def pdrelay(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def _export_one_request(endpoint: str, request_id: str) -> dict[str, float]:
    """A gateway -> decode -> prefill request's spans, as the services would export them; returns phase lengths."""
    gw = Tracing.start(endpoint, role="gateway", instance_id="gateway-1", cluster="t")
    dec = Tracing.start(endpoint, role="decode", instance_id="decode-1", cluster="t")
    t0 = time.monotonic() - 0.050
    root = gw.start_span(
        spans.GATEWAY_REQUEST, kind=SpanKind.SERVER, start=t0, attributes={spans.REQUEST_ID: request_id}
    )
    gw.record(spans.GATEWAY_TOKENIZE, t0, t0 + 0.002, parent=root)
    call = gw.start_span(spans.GATEWAY_DECODE_CALL, parent=root, kind=SpanKind.CLIENT, start=t0 + 0.003)
    server = dec.start_span(
        spans.DECODE_GENERATE,
        parent=call,
        kind=SpanKind.SERVER,
        start=t0 + 0.004,
        attributes={spans.REQUEST_ID: request_id},
    )
    dec.record(spans.PREFILL_COMPUTE, t0 + 0.005, t0 + 0.025, parent=server)
    dec.record(spans.KV_TRANSFER, t0 + 0.025, t0 + 0.030, {spans.TRANSFER_BYTES: 65536}, parent=server)
    dec.record(spans.DECODE_STREAM, t0 + 0.031, t0 + 0.045, parent=server)
    add_event(root, spans.EVENT_FIRST_TOKEN, at=t0 + 0.032)
    for tr, span, end in ((dec, server, t0 + 0.046), (gw, call, t0 + 0.047), (gw, root, t0 + 0.048)):
        tr.end(span, end)
    gw.shutdown()
    dec.shutdown()
    return {"ttft": 32.0, "compute": 20.0, "transfer": 5.0, "tokenize": 2.0}


def test_trace_sink_plumbing_in_the_supervisor(tmp_path: Path) -> None:
    sup = Supervisor(UpOptions(run_dir=str(tmp_path), trace=True, extra=("--page-size", "32")))
    sup.state = RunState(supervisor_pid=0, cluster="t", etcd_url="", nats_url="", run_dir=str(tmp_path), started_at=0.0)
    sup._start_trace_sink()
    try:
        assert sup.trace_sink is not None and sup.trace_sink.alive()
        endpoint = sup.trace_sink.endpoint
        assert sup.state.trace_endpoint == endpoint and sup.state.traces == str(tmp_path / TRACES_FILE)
        for role in ("gateway", "decode", "prefill"):  # every service is pointed at the sink, other flags kept
            spec = build_spec(role, 0, sup.opts, "http://127.0.0.1:1", "nats://127.0.0.1:2", env={})
            cfg = ResolvedConfig.from_json(Path(spec.config_path).read_text())
            assert cfg.telemetry.otlp_traces_endpoint == endpoint, role
        assert "--page-size" in sup.opts.extra
    finally:
        if sup.trace_sink is not None:
            sup.trace_sink.stop()


def test_up_trace_then_pdrelay_trace_then_down(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    ports = ["--etcd-port", str(free_port()), "--nats-port", str(free_port())]
    up = pdrelay(
        "up",
        "--detach",
        "--trace",
        "--run-dir",
        run_dir,
        "--cluster",
        "tr",
        "--gateway",
        "0",
        "--prefill",
        "0",
        "--decode",
        "0",
        "--encoder",
        "0",
        "--echo",
        "1",
        *ports,
    )
    state = read_state(Path(run_dir))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert state is not None and state.trace_endpoint and pid_alive(state.trace_sink_pid)
        assert f"Traces: every request's spans go to {state.traces}" in up.stdout
        assert "pdrelay trace <request-id> --run-dir" in up.stdout
        empty = pdrelay("trace", "--run-dir", run_dir)
        assert empty.returncode == 0 and "no traced requests" in empty.stdout, empty.stdout + empty.stderr

        want = _export_one_request(state.trace_endpoint, "chatcmpl-test1")
        listing = pdrelay("trace", "--run-dir", run_dir)
        assert listing.returncode == 0, listing.stderr
        row = [ln for ln in listing.stdout.splitlines() if ln.endswith("chatcmpl-test1")]
        assert len(row) == 1 and float(row[0].split()[3]) == pytest.approx(want["ttft"], abs=0.05), listing.stdout

        shown = pdrelay("trace", "chatcmpl-test1", "--run-dir", run_dir)
        assert shown.returncode == 0, shown.stderr
        out = shown.stdout
        for name in (spans.GATEWAY_REQUEST, spans.GATEWAY_TOKENIZE, spans.DECODE_GENERATE, spans.KV_TRANSFER):
            assert name in out
        assert "[pdrelay-decode/decode-1]" in out and "transfer.bytes=65536" in out
        shown_ttft = float(out.split("TTFT ", 1)[1].split(" ms", 1)[0])
        assert shown_ttft == pytest.approx(want["ttft"], abs=0.05), out  # span times are rounded to ns on export
        # the breakdown charges each phase its own time (parts add up to the TTFT)
        for phase, key in (("prefill.compute", "compute"), ("kv.transfer", "transfer")):
            m = re.search(rf"{re.escape(phase)} +([0-9.]+)", out)
            assert m and float(m.group(1)) == pytest.approx(want[key], abs=0.05), out
        lines = out.splitlines()
        depth = {
            n: next(ln for ln in lines if f" {n}  [" in ln).index(n)
            for n in (spans.GATEWAY_REQUEST, spans.GATEWAY_DECODE_CALL, spans.DECODE_GENERATE, spans.KV_TRANSFER)
        }
        assert (
            depth[spans.GATEWAY_REQUEST]
            < depth[spans.GATEWAY_DECODE_CALL]
            < depth[spans.DECODE_GENERATE]
            < depth[spans.KV_TRANSFER]
        ), out

        missing = pdrelay("trace", "chatcmpl-nope", "--run-dir", run_dir)
        assert missing.returncode == 1 and "no spans of request" in missing.stderr
    finally:
        down = pdrelay("down", "--run-dir", run_dir)
    assert down.returncode == 0, down.stdout + down.stderr
    deadline = time.monotonic() + 10
    while state is not None and pid_alive(state.trace_sink_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert state is None or not pid_alive(state.trace_sink_pid), "the trace sink outlived pdrelay down"
    assert (Path(run_dir) / TRACES_FILE).exists()  # the spans stay for `pdrelay trace` after the cluster is gone


def test_trace_without_a_span_file_says_how_to_get_one(tmp_path: Path) -> None:
    r = pdrelay("trace", "x", "--run-dir", str(tmp_path))
    assert r.returncode == 1 and "pdrelay up --trace" in r.stderr
