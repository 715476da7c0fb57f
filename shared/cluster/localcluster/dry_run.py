"""`pdrelay up --dry-run`: what each process of the cluster would get (role, devices, memory plan, flags and
environment), as a table or JSON, without starting or writing anything. `pdrelay config show --plan` prints the
same row for one role."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.cluster.localcluster.placement import ENGINE_ROLES, SHARED_ENCODER_BYTES
from shared.cluster.localcluster.plan import ResolvedInstance
from shared.config import ResolvedConfig
from shared.config.choices import EngineKind
from shared.config.memory_plan import MemoryPlan, gib
from shared.config.plan_passes import plan_for_config, process_devices
from shared.config.probe import HostProbe

# The resolved flags that size a plan, shown beside it (what to change when it does not fit).
PLAN_FLAGS = (
    "device.base_gpu_id",
    "parallel.tp_size",
    "cache.mem_fraction_static",
    "scheduler.chunked_prefill_size",
    "cuda_graph.cuda_graph_max_bs",
    "model.context_length",
)


@dataclass(frozen=True)
class PlanRow:
    """One process: what it runs on and, for an engine, its memory plan (or why there is none)."""

    instance: str
    role: str
    devices: tuple[str, ...]
    plan: MemoryPlan | None = None
    note: str = ""
    flags: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)


def _flags(cfg: ResolvedConfig) -> tuple[str, ...]:
    from shared.config.catalog import specs_by_key

    out: list[str] = []
    for key in PLAN_FLAGS:
        group = key.split(".", 1)[0]
        gpu_only = group in ("device", "parallel", "cuda_graph")
        if not cfg.has(group) or (gpu_only and cfg.device.device != "cuda"):
            continue
        if key == "cuda_graph.cuda_graph_max_bs" and cfg.cuda_graph.disable_decode_cuda_graph:
            continue
        value = cfg.get(key)
        if value is not None:
            out += [specs_by_key()[key].flag, str(value)]
    return tuple(out)


def config_row(
    instance: str,
    cfg: ResolvedConfig,
    probe: HostProbe,
    *,
    reserved_bytes: int = 0,
    env: Mapping[str, str] | None = None,
) -> PlanRow:
    """The row of one resolved config: a plan for an engine role whose weights are on disk, else a note."""
    from shared.modelspec.bundled import prepared_model_dir

    devices = process_devices(cfg) if cfg.has("device") else ()
    if cfg.role not in ENGINE_ROLES:
        return PlanRow(instance, cfg.role, devices, env=dict(env or {}))
    plan, note = None, ""
    model_dir = prepared_model_dir(cfg.model.model, cfg.model.model_cache_dir)
    if cfg.engine.engine != EngineKind.REAL:
        note = "--engine mock: no weights"
    elif model_dir is None:
        note = f"weights of {cfg.model.model} not on disk yet (pdrelay model prepare); planned at engine start"
    else:
        plan = plan_for_config(cfg, probe, model_dir, reserved_bytes=reserved_bytes)
    return PlanRow(instance, cfg.role, devices, plan, note, _flags(cfg), dict(env or {}))


def instance_rows(instances: Sequence[ResolvedInstance], probe: HostProbe) -> list[PlanRow]:
    rows = []
    for inst in instances:
        if not inst.config_json:  # echo: no config of its own
            rows.append(PlanRow(inst.instance_id, inst.role, (), env=inst.env))
            continue
        shared = sum(
            SHARED_ENCODER_BYTES
            for other in instances
            if other.placement is not None and other.placement.shares_with == inst.instance_id
        )
        row = config_row(inst.instance_id, inst.config(), probe, reserved_bytes=shared, env=inst.env)
        if inst.placement is None and inst.env.get("CUDA_VISIBLE_DEVICES") == "":
            row = dataclasses.replace(row, devices=())  # a GPU host's gateway, kvstore, planner: no GPU
        rows.append(row)
    return rows


def host_line(probe: HostProbe) -> str:
    n = probe.cuda_device_count() if probe.cuda_available() else 0
    if not n:
        return f"host: no GPU ({probe.describe()})"
    _, total = probe.gpu_memory(0)
    return f"host: {n} GPU(s) of {gib(total)} ({probe.describe()})"


def _cell(plan: MemoryPlan | None) -> list[str]:
    if plan is None:
        return ["-"] * 6
    budget = f"{gib(plan.used)} / {gib(plan.budget)}" + ("" if plan.problem() is None else " (does not fit)")
    graphs = gib(plan.graphs) if plan.graphs else "-"
    return [gib(plan.weights), gib(plan.workspace), graphs, str(plan.num_pages), gib(plan.kv), budget]


def format_table(rows: Sequence[PlanRow], header: str) -> str:
    head = ["INSTANCE", "ROLE", "DEVICES", "WEIGHTS", "WORKSPACE", "GRAPHS", "KV PAGES", "KV", "USED / BUDGET"]
    table = [head]
    tails = []
    for r in rows:
        table.append([r.instance, r.role, ",".join(r.devices) or "-", *_cell(r.plan)])
        env = " ".join(f"{k}={v}" for k, v in r.env.items() if k == "CUDA_VISIBLE_DEVICES")
        tails.append(" ".join(x for x in (env, " ".join(r.flags), r.note) if x))
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines = [header]
    for i, row in enumerate(table):
        tail = "ENV / FLAGS" if i == 0 else tails[i - 1]
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + "  " + tail)
    return "\n".join(line.rstrip() for line in lines)


def to_json(rows: Sequence[PlanRow], header: str) -> str:
    processes: list[dict[str, Any]] = [
        {
            "instance": r.instance,
            "role": r.role,
            "devices": list(r.devices),
            "env": dict(r.env),
            "flags": list(r.flags),
            "plan": r.plan.to_dict() if r.plan is not None else None,
            "note": r.note,
        }
        for r in rows
    ]
    return json.dumps({"host": header.removeprefix("host: "), "processes": processes}, indent=2)


def problems(rows: Sequence[PlanRow]) -> list[str]:
    """The one-line reason of every plan that does not fit."""
    return [p for r in rows if r.plan is not None and (p := r.plan.problem()) is not None]
