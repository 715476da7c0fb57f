"""`pdrelay status`: the instances registered in etcd joined with their latest NATS load reports."""

from __future__ import annotations

import asyncio

import msgspec
from etcd3aio import prefix_range_end

from shared.cluster.bus.client import Bus
from shared.cluster.bus.kv_index_status import KVIndexStatus, query_kv_index_status
from shared.cluster.bus.load import LoadReport, LoadTable
from shared.cluster.errors import ControlPlaneUnavailable
from shared.cluster.etcd import connect_etcd
from shared.cluster.instance import InstanceInfo, Modality, decode_instance, instances_prefix
from shared.cluster.tls import TlsFiles


class StatusRow(msgspec.Struct, kw_only=True):
    role: str
    instance_id: str
    state: str
    epoch: int
    grpc: str
    http: str = ""
    metrics: str = ""  # host:port of /metrics
    model: str = ""
    pid: int = 0
    load: LoadReport | None = None
    load_age_s: float | None = None
    serves: str = ""  # an encoder's modalities and models, e.g. "image vlm, embedding all-MiniLM-L6-v2"
    tp_size: int = 0  # an engine instance's tensor-parallel ranks (0: not an engine)


class ClusterStatus(msgspec.Struct, kw_only=True):
    cluster: str
    etcd_url: str
    nats_url: str
    rows: list[StatusRow]
    nats_error: str = ""  # load columns are empty when NATS could not be reached
    skipped_keys: int = 0  # values under the prefix that were not InstanceInfo
    # restarts by the `pdrelay up` supervisor (from its run dir): instance id, "etcd" or "nats" -> count
    restarts: dict[str, int] = msgspec.field(default_factory=dict)
    # each gateway's KV index per instance (exact / degraded / rebuilding), by gateway id
    kv_index: dict[str, KVIndexStatus] = msgspec.field(default_factory=dict)


async def collect_status(
    etcd_url: str,
    nats_url: str,
    cluster: str,
    *,
    load_window_s: float = 0.6,
    timeout_s: float = 3.0,
    tls: TlsFiles | None = None,
) -> ClusterStatus:
    """Raises ControlPlaneUnavailable when etcd does not answer (NATS being down only empties the load columns).
    `tls`: the client identity for https:// etcd and TLS NATS."""
    client = await connect_etcd([etcd_url], timeout_s=timeout_s, tls=tls)
    try:
        prefix = instances_prefix(cluster)
        assert client.kv is not None
        resp = await client.kv.get(prefix, range_end=prefix_range_end(prefix), timeout=timeout_s)
    finally:
        await client.close()
    infos: list[InstanceInfo] = []
    skipped = 0
    for kv in resp.kvs:
        try:
            infos.append(decode_instance(kv.value))
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError):
            skipped += 1
    table = LoadTable()
    nats_error = ""
    kv_index: dict[str, KVIndexStatus] = {}
    try:
        async with Bus(nats_url, name="pdrelay-status", tls=tls) as bus:
            await table.subscribe(bus, cluster)
            gateways = [i.instance_id for i in infos if i.role == "gateway"]
            answers = await asyncio.gather(
                asyncio.sleep(load_window_s),  # a few report intervals
                *(query_kv_index_status(bus, cluster, g, timeout_s=max(0.5, load_window_s)) for g in gateways),
                return_exceptions=True,
            )
            kv_index = {a.gateway_id: a for a in answers if isinstance(a, KVIndexStatus)}
            await table.close()
    except ControlPlaneUnavailable as e:
        nats_error = str(e)
    rows = []
    for i in sorted(infos, key=lambda i: (i.role, i.instance_id)):
        report = table.latest.get(i.instance_id)
        if report is not None and report.epoch != i.epoch:
            report = None  # from an older incarnation
        rows.append(
            StatusRow(
                role=i.role,
                instance_id=i.instance_id,
                state=str(i.state),
                epoch=i.epoch,
                grpc=i.grpc_address,
                http=i.http_address,
                metrics=i.metrics_address,
                model=i.model,
                pid=i.pid,
                load=report,
                load_age_s=table.age_s(i.instance_id) if report else None,
                serves=_serves(i),
                tp_size=i.capacity.tp_size,
            )
        )
    return ClusterStatus(
        cluster=cluster,
        etcd_url=etcd_url,
        nats_url=nats_url,
        rows=rows,
        nats_error=nats_error,
        skipped_keys=skipped,
        kv_index=kv_index,
    )


def format_table(status: ClusterStatus) -> str:
    head = ("ROLE", "INSTANCE", "STATE", "EPOCH", "GRPC", "TP", "RUNNING", "QUEUED", "FREE PAGES", "TOK/S", "LOAD AGE")
    rows: list[tuple[str, ...]] = [head]
    for r in status.rows:
        ld = r.load.load if r.load else None
        rows.append(
            (
                r.role,
                r.instance_id,
                r.state,
                str(r.epoch),
                r.grpc,
                str(r.tp_size) if r.tp_size else "-",
                str(ld.running) if ld else "-",
                str(ld.queued) if ld else "-",
                f"{ld.free_pages}/{ld.total_pages}" if ld and ld.total_pages else "-",
                f"{ld.tokens_per_s:.1f}" if ld else "-",
                f"{r.load_age_s:.1f}s" if r.load_age_s is not None else "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [f"cluster '{status.cluster}'  etcd {status.etcd_url}  nats {status.nats_url}"]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    for r in status.rows:
        for t in r.load.load.tiers if r.load else ():
            share = 100.0 * t.used_bytes / t.capacity_bytes if t.capacity_bytes else 0.0
            lines.append(f"  {r.instance_id} {t.tier}: {share:.1f}% of {_gib(t.capacity_bytes)} ({t.pages} pages)")
    lines += [f"  {r.instance_id} serves {r.serves}" for r in status.rows if r.serves]
    for gw, idx in sorted(status.kv_index.items()):
        lines.append(format_kv_index(gw, idx))
    if not status.rows:
        lines.append("(no instances registered)")
    if status.restarts:
        lines.append("restarts (pdrelay up): " + ", ".join(f"{k} {v}" for k, v in status.restarts.items()))
    if status.nats_error:
        lines.append(f"note: no load reports: {status.nats_error}")
    if status.skipped_keys:
        lines.append(f"note: {status.skipped_keys} unreadable value(s) under {instances_prefix(status.cluster)}")
    return "\n".join(lines)


def _serves(info: InstanceInfo) -> str:
    enc = info.encoder
    if enc is None:
        return ""
    name = {Modality.IMAGE: enc.vision_model, Modality.EMBEDDING: enc.embedding_model}
    return ", ".join(f"{m} {name.get(m, '')}".rstrip() for m in enc.modalities)


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def format_kv_index(gateway_id: str, idx: KVIndexStatus) -> str:
    """`gateway-1 KV index (12.0 MiB, 3 snapshots): prefill-1 exact 120 pages, decode-1 degraded (gap) 4 pages`"""
    parts = [
        f"{e.instance_id} {e.state}{f' ({e.reason})' if e.reason and e.state != 'exact' else ''} {e.pages} pages"
        for e in idx.entries
    ]
    head = f"  {gateway_id} KV index ({idx.approx_bytes / 2**20:.1f} MiB, {idx.snapshots} snapshots)"
    return head + ": " + (", ".join(parts) if parts else "empty")
