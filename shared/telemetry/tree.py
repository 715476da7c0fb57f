"""Reading traces back: span records (from the sink's JSON lines) -> one request's span tree and TTFT breakdown.

`pdrelay trace <request-id>` prints `render(...)`:

    trace 4bf92f35...  request chatcmpl-9f2c...  total 41.20 ms  TTFT 23.52 ms
         +0.00 ms    41.20 ms  gateway.request       pdrelay-gateway/gateway-1  http.route=/v1/chat/completions ...
         +0.02 ms     0.81 ms  |- gateway.tokenize   pdrelay-gateway/gateway-1  prompt_tokens=18
         ...
    TTFT 23.52 ms: prefill.compute 14.10 (60%), kv.transfer 2.31 (10%), ...; spans cover 96% of it

The breakdown counts the leaf spans (phases with no child span: tokenize, route, admit, queue wait, compute,
transfer, ...) inside the TTFT window, from the start of the gateway's request span to its first_token event;
what no leaf covers is RPC transit and scheduling between phases.
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


def union_ns(intervals: Iterable[tuple[int, int]]) -> int:
    """Total length covered by a set of [start, end) intervals (overlaps counted once)."""
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s  # type: ignore[operator]
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s  # type: ignore[operator]
    return total


@dataclass(frozen=True)
class Breakdown:
    ttft_ns: int
    phases: list[tuple[str, int]]  # (span name, ns inside the TTFT window), largest first
    covered_ns: int  # union of the leaf spans inside the window

    @property
    def coverage(self) -> float:
        return self.covered_ns / self.ttft_ns if self.ttft_ns else 0.0


def leaves(trace: Sequence[SpanRecord]) -> list[SpanRecord]:
    parents = {s.parent_span_id for s in trace}
    return [s for s in trace if s.span_id not in parents]


def breakdown(trace: Sequence[SpanRecord]) -> Breakdown | None:
    """Where the TTFT of the trace's request went; None without a gateway request span and its first token."""
    root = root_of(trace)
    if root is None or root.name != names.GATEWAY_REQUEST:
        return None
    end = first_token_ns(root)
    if end is None:
        return None
    start = root.start_ns
    clipped = [(s.name, max(s.start_ns, start), min(s.end_ns, end)) for s in leaves(trace) if s is not root]
    clipped = [c for c in clipped if c[2] > c[1]]
    per: dict[str, int] = defaultdict(int)
    for name, s, e in clipped:
        per[name] += e - s
    phases = sorted(per.items(), key=lambda kv: -kv[1])
    return Breakdown(end - start, phases, union_ns((s, e) for _, s, e in clipped))


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
        lines.append(f"{(s.start_ns - t0) / 1e6:>+9.2f} ms {s.duration_ns / 1e6:>8.2f} ms  {indent}{s.name}  "
                     f"[{where}]  {_attrs_text(s)}".rstrip())
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
        parts = ", ".join(f"{n} {ns / 1e6:.2f} ({ns / bd.ttft_ns:.0%})" for n, ns in bd.phases)
        lines.append(f"TTFT {bd.ttft_ns / 1e6:.2f} ms: {parts}; spans cover {bd.coverage:.0%} of it "
                     "(the rest: RPC transit and scheduling between phases)")
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
        rows.append(RequestRow(rid, tid, root.start_ns, root.duration_ns, None if ft is None else ft - root.start_ns,
                               len(trace), any(s.status == "error" for s in trace)))
    return sorted(rows, key=lambda r: r.start_ns)
