"""Reading traces back: span records (from the sink's JSON lines) -> one request's span tree and TTFT breakdown.

`pdrelay trace <request-id>` prints `render(...)`:

    trace 4bf92f35...  request chatcmpl-9f2c...  total 27.24 ms  TTFT 15.93 ms
           start    duration  span
        +0.00 ms    27.24 ms  gateway.request  [pdrelay-gateway/gateway-1]  http.route=/v1/chat/completions ...
                             * first_token at +15.93 ms
        +0.01 ms     1.98 ms  |- gateway.tokenize  [pdrelay-gateway/gateway-1]  prompt_tokens=118
        ...
    TTFT 15.93 ms = prefill.compute 3.79 (24%), decode.handoff (self) 2.10 (13%), gateway.tokenize 1.98 (12%), ...

The TTFT window runs from the start of the gateway's request span to its first_token event. Every instant of it
is charged to the deepest span covering it, so the parts add up to the TTFT: leaf phases (tokenize, route, admit,
queue wait, compute, transfer, ...) and the "self" time of calls and servers (RPC transit, scheduling).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from shared.telemetry import spans as names
from shared.telemetry.sink import SpanRecord

_HIDDEN_ATTRS = {names.REQUEST_ID, names.INSTANCE}


def load(path: str | Path) -> list[SpanRecord]:
    """Every well-formed span line of a sink file (a torn last line, written while reading, is skipped)."""
    dec = msgspec.json.Decoder(SpanRecord)
    out: list[SpanRecord] = []
    with open(path, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                out.append(dec.decode(line))
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
    return out


def by_trace(records: Iterable[SpanRecord]) -> dict[str, list[SpanRecord]]:
    traces: dict[str, list[SpanRecord]] = defaultdict(list)
    for r in records:
        traces[r.trace_id].append(r)
    return dict(traces)


def traces_of_request(records: Iterable[SpanRecord], request_id: str) -> list[str]:
    """Trace ids whose spans carry pdrelay.request_id == request_id, oldest first."""
    first: dict[str, int] = {}
    for r in records:
        if r.attributes.get(names.REQUEST_ID) == request_id:
            first[r.trace_id] = min(first.get(r.trace_id, r.start_ns), r.start_ns)
    return sorted(first, key=first.__getitem__)


def root_of(trace: Sequence[SpanRecord]) -> SpanRecord | None:
    """The gateway's request span, else the earliest span whose parent is not in the trace."""
    ids = {s.span_id for s in trace}
    roots = [s for s in trace if not s.parent_span_id or s.parent_span_id not in ids]
    gw = [s for s in roots if s.name == names.GATEWAY_REQUEST]
    pool = gw or roots
    return min(pool, key=lambda s: s.start_ns) if pool else None


def first_token_ns(root: SpanRecord) -> int | None:
    for e in root.events:
        if e.name == names.EVENT_FIRST_TOKEN:
            return e.time_ns
    return None


@dataclass(frozen=True)
class Breakdown:
    """Where a request's TTFT went. Every instant of the window is charged to the deepest span covering it, so the
    parts add up to the TTFT: a leaf's part is its phase, a parent's part ("self") is what none of its children
    covers (RPC transit inside a client span, scheduling between phases inside a server span)."""

    ttft_ns: int
    parts: list[tuple[str, int, bool]]  # (span name, ns charged to it, is a leaf), largest first
    leaf_ns: int  # charged to leaf phases

    @property
    def coverage(self) -> float:
        """Share of the TTFT spent in named leaf phases."""
        return self.leaf_ns / self.ttft_ns if self.ttft_ns else 0.0


def _depths(trace: Sequence[SpanRecord]) -> dict[str, int]:
    by_id = {s.span_id: s for s in trace}
    depth: dict[str, int] = {}

    def of(s: SpanRecord) -> int:
        if s.span_id not in depth:
            parent = by_id.get(s.parent_span_id)
            depth[s.span_id] = 0 if parent is None or parent is s else of(parent) + 1
        return depth[s.span_id]

    for s in trace:
        of(s)
    return depth


def breakdown(trace: Sequence[SpanRecord]) -> Breakdown | None:
    """The TTFT breakdown of a trace; None without a gateway request span and its first_token event."""
    root = root_of(trace)
    if root is None or root.name != names.GATEWAY_REQUEST:
        return None
    end = first_token_ns(root)
    if end is None:
        return None
    start = root.start_ns
    depth = _depths(trace)
    inside = [s for s in trace if s.start_ns < end and s.end_ns > start]
    parents = {s.parent_span_id for s in trace}
    cuts = sorted({start, end, *(min(max(t, start), end) for s in inside for t in (s.start_ns, s.end_ns))})
    charged: dict[tuple[str, bool], int] = defaultdict(int)
    for a, b in zip(cuts, cuts[1:]):
        covering = [s for s in inside if s.start_ns <= a and s.end_ns >= b]
        if not covering:
            continue
        # the deepest span; among equals, the one that started last (the phase now running)
        s = max(covering, key=lambda c: (depth[c.span_id], c.start_ns))
        charged[(s.name, s.span_id not in parents)] += b - a
    parts = sorted(((n, ns, leaf) for (n, leaf), ns in charged.items()), key=lambda p: -p[1])
    return Breakdown(end - start, parts, sum(ns for _, ns, leaf in parts if leaf))


def _fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def _attrs_text(s: SpanRecord) -> str:
    parts = []
    for k, v in s.attributes.items():
        if k in _HIDDEN_ATTRS:
            continue
        parts.append(f"{k.removeprefix('pdrelay.')}={_fmt_value(v)}")
    return " ".join(parts)


def render(trace: Sequence[SpanRecord], request_id: str = "") -> str:
    """One trace as an indented tree with offsets and durations (ms), events and errors, then the TTFT breakdown."""
    if not trace:
        return "(no spans)"
    root = root_of(trace)
    t0 = min(s.start_ns for s in trace)
    t1 = max(s.end_ns for s in trace)
    children: dict[str, list[SpanRecord]] = defaultdict(list)
    ids = {s.span_id for s in trace}
    tops: list[SpanRecord] = []
    for s in trace:
        if s.parent_span_id and s.parent_span_id in ids:
            children[s.parent_span_id].append(s)
        else:
            tops.append(s)
    bd = breakdown(trace)
    head = f"trace {trace[0].trace_id}"
    if request_id:
        head += f"  request {request_id}"
    head += f"  total {(t1 - t0) / 1e6:.2f} ms"
    if bd is not None:
        head += f"  TTFT {bd.ttft_ns / 1e6:.2f} ms"
    lines = [head, f"{'start':>12} {'duration':>11}  span"]

    def walk(s: SpanRecord, depth: int) -> None:
        indent = "   " * (depth - 1) + "|- " if depth else ""
        where = f"{s.service}/{s.instance}" if s.instance else s.service
        lines.append(
            f"{(s.start_ns - t0) / 1e6:>+9.2f} ms {s.duration_ns / 1e6:>8.2f} ms  {indent}{s.name}  "
            f"[{where}]  {_attrs_text(s)}".rstrip()
        )
        pad = " " * 25 + "   " * depth
        for e in s.events:
            attrs = " ".join(f"{k}={_fmt_value(v)}" for k, v in e.attributes.items())
            lines.append(f"{pad}* {e.name} at {(e.time_ns - t0) / 1e6:+.2f} ms {attrs}".rstrip())
        if s.status == "error":
            lines.append(f"{pad}! ERROR {s.status_message}")
        for c in sorted(children.get(s.span_id, ()), key=lambda c: c.start_ns):
            walk(c, depth + 1)

    for top in sorted(tops, key=lambda s: (s is not root, s.start_ns)):
        walk(top, 0)
    if bd is not None:
        parts = ", ".join(
            f"{n}{'' if leaf else ' (self)'} {ns / 1e6:.2f} ({ns / bd.ttft_ns:.0%})" for n, ns, leaf in bd.parts
        )
        lines.append(f"TTFT {bd.ttft_ns / 1e6:.2f} ms = {parts}")
        lines.append(
            f"  named phases: {bd.coverage:.0%} of TTFT; '(self)': time inside a span none of its children "
            "covers (RPC transit in a call, scheduling between phases)"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class RequestRow:
    request_id: str
    trace_id: str
    start_ns: int
    duration_ns: int
    ttft_ns: int | None
    num_spans: int
    error: bool


def requests(records: Sequence[SpanRecord]) -> list[RequestRow]:
    """One row per traced gateway request, oldest first (for `pdrelay trace` without an id)."""
    traces = by_trace(records)
    rows = []
    for tid, trace in traces.items():
        root = root_of(trace)
        if root is None:
            continue
        rid = str(root.attributes.get(names.REQUEST_ID, ""))
        ft = first_token_ns(root)
        rows.append(
            RequestRow(
                rid,
                tid,
                root.start_ns,
                root.duration_ns,
                None if ft is None else ft - root.start_ns,
                len(trace),
                any(s.status == "error" for s in trace),
            )
        )
    return sorted(rows, key=lambda r: r.start_ns)
