"""The resolved, frozen configuration of one role, with the provenance of every value.

``cfg.cache.page_size`` reads a value; ``cfg.provenance["cache.page_size"]`` says where it came from. A group the
role does not use raises AttributeError naming the roles that have it. A per-process copy is made with
``cfg.with_value(...)`` (a new object; nothing is ever mutated). ``to_json``/``from_json`` round-trip losslessly:
this is how `pdrelay up` hands a resolved config to its child processes.
"""

from __future__ import annotations

import dataclasses
import json
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

from shared.config import catalog
from shared.config.errors import ConfigError
from shared.config.groups import (
    GROUPS,
    BusConfig,
    CacheConfig,
    CudaGraphConfig,
    DeviceConfig,
    DisaggConfig,
    DiscoveryConfig,
    EncoderConfig,
    EngineSimConfig,
    GrpcConfig,
    HttpConfig,
    KernelConfig,
    KVStoreClientConfig,
    KVStoreConfig,
    ModelConfig,
    ParallelConfig,
    PlannerConfig,
    SchedulerConfig,
    TelemetryConfig,
    TlsConfig,
    TokenizerConfig,
    TransferConfig,
)
from shared.config.roles import ROLE_GROUPS, Role
from shared.config.values import Origin, as_member, coerce, format_value, validate

SOURCES = ("default", "file", "env", "cli", "derived")
REDACTED = "<redacted>"
JSON_VERSION = 1

T = TypeVar("T")


@dataclass(frozen=True)
class Provenance:
    """Where a value came from.

    source: "default" | "file" | "env" | "cli" | "derived". detail: for "cli" the flag as typed (an alias shows
    as such), for "env" the variable name, for "file" the file path, for "derived" the reason.
    """

    source: str
    detail: str = ""

    def __post_init__(self) -> None:
        assert self.source in SOURCES, f"unknown provenance source {self.source!r}"

    def __str__(self) -> str:
        return f"{self.source}: {self.detail}" if self.detail else self.source


class _GroupAttr(Generic[T]):
    """A typed, read-only view of one group on ResolvedConfig (so `cfg.cache` is a CacheConfig to mypy)."""

    def __init__(self, cls: type[T]) -> None:
        self.cls = cls
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        assert GROUPS[name] is self.cls, f"group attribute {name} does not match groups.GROUPS"
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type) -> _GroupAttr[T]: ...

    @overload
    def __get__(self, obj: ResolvedConfig, owner: type) -> T: ...

    def __get__(self, obj: ResolvedConfig | None, owner: type) -> T | _GroupAttr[T]:
        if obj is None:
            return self
        return obj.group(self.name)  # type: ignore[return-value]  # the group stored under this name is a T


@dataclass(frozen=True)
class ResolvedConfig:
    """One role's configuration: a frozen group object per group the role uses, plus provenance per field.

    by_group: group name -> group dataclass instance, exactly the role's groups (roles.ROLE_GROUPS).
    provenance: "group.field" -> Provenance, one entry per field of those groups.
    """

    role: Role
    by_group: Mapping[str, Any]
    provenance: Mapping[str, Provenance]

    model = _GroupAttr(ModelConfig)
    tokenizer = _GroupAttr(TokenizerConfig)
    device = _GroupAttr(DeviceConfig)
    cache = _GroupAttr(CacheConfig)
    scheduler = _GroupAttr(SchedulerConfig)
    engine = _GroupAttr(EngineSimConfig)
    parallel = _GroupAttr(ParallelConfig)
    kernels = _GroupAttr(KernelConfig)
    cuda_graph = _GroupAttr(CudaGraphConfig)
    disagg = _GroupAttr(DisaggConfig)
    transfer = _GroupAttr(TransferConfig)
    discovery = _GroupAttr(DiscoveryConfig)
    bus = _GroupAttr(BusConfig)
    grpc = _GroupAttr(GrpcConfig)
    tls = _GroupAttr(TlsConfig)
    http = _GroupAttr(HttpConfig)
    telemetry = _GroupAttr(TelemetryConfig)
    encoder = _GroupAttr(EncoderConfig)
    kvstore = _GroupAttr(KVStoreConfig)
    kvstore_client = _GroupAttr(KVStoreClientConfig)
    planner = _GroupAttr(PlannerConfig)

    def __post_init__(self) -> None:
        object.__setattr__(self, "role", Role(self.role))  # a role named as text (JSON, a caller) becomes its member
        # Read-only views (in display order), so a frozen config cannot be changed through its mappings either.
        assert set(self.by_group) == set(ROLE_GROUPS[self.role]), (self.role, tuple(self.by_group))
        ordered = {g: self.by_group[g] for g in GROUPS if g in self.by_group}
        object.__setattr__(self, "by_group", types.MappingProxyType(ordered))
        object.__setattr__(self, "provenance", types.MappingProxyType(dict(self.provenance)))
        want = {s.key for s in catalog.role_specs(self.role)}
        assert set(self.provenance) == want, f"provenance keys differ: {set(self.provenance) ^ want}"

    def __hash__(self) -> int:
        return hash((self.role, tuple(self.by_group.values())))

    def __reduce__(self) -> tuple[Any, ...]:
        # mappingproxy does not pickle; rebuild from plain dicts (multiprocessing hands configs to children)
        return (type(self), (self.role, dict(self.by_group), dict(self.provenance)))

    # -- reading ------------------------------------------------------------------------------------------------
    def group(self, name: str) -> object:
        """The group object `name`; AttributeError naming the roles that have it when this role does not."""
        if name in self.by_group:
            return self.by_group[name]
        if name in GROUPS:
            raise AttributeError(
                f"role {self.role!r} has no {name!r} settings; roles that have them: "
                f"{', '.join(catalog.roles_using(name))}"
            )
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def has(self, group: str) -> bool:
        return group in self.by_group

    def groups(self) -> dict[str, object]:
        """group name -> group object, in display order."""
        return dict(self.by_group)

    def get(self, key: str) -> Any:
        """The value at "group.field"."""
        group, _, name = key.partition(".")
        return getattr(self.group(group), name)

    def origin(self, key: str) -> Origin:
        """Where the value at `key` came from, phrased for error messages (the flag, env var or file key)."""
        spec = catalog.specs_by_key()[key]
        prov = self.provenance[key]
        if prov.source == "cli":
            return Origin("cli", prov.detail or spec.flag)
        if prov.source == "env":
            return Origin("env", prov.detail or spec.env)
        if prov.source == "file":
            return Origin("file", spec.name, prov.detail)
        return Origin(prov.source, spec.flag)

    def is_user_set(self, key: str) -> bool:
        """True when the user chose this value (file, env or command line), i.e. a pass must not override it."""
        return self.provenance[key].source in ("file", "env", "cli")

    # -- new copies ---------------------------------------------------------------------------------------------
    def with_value(self, key: str, value: Any, provenance: Provenance) -> ResolvedConfig:
        """A copy with one value replaced (checked against the field's choices and bounds) and its provenance."""
        spec = catalog.specs_by_key()[key]
        validate(spec, value, Origin(provenance.source, spec.flag))
        value = as_member(spec, value)  # a closed set's text becomes its member (a StrEnum equals its text)
        group = self.group(spec.group)
        by_group = dict(self.by_group)
        by_group[spec.group] = dataclasses.replace(group, **{spec.name: value})  # type: ignore[type-var]  # a group dataclass
        prov = dict(self.provenance)
        prov[key] = provenance
        return ResolvedConfig(self.role, by_group, prov)

    def derive(self, key: str, value: Any, reason: str) -> ResolvedConfig:
        """A copy with a derived value at `key`, recording why."""
        return self.with_value(key, value, Provenance("derived", reason))

    # -- serialization ------------------------------------------------------------------------------------------
    def to_dict(self, redact: bool = False) -> dict[str, Any]:
        """Plain JSON-able form: {"version", "role", "config": {group: {field: value}}, "provenance": {key: {...}}}."""
        config: dict[str, dict[str, Any]] = {}
        for spec in catalog.role_specs(self.role):
            value = getattr(self.by_group[spec.group], spec.name)
            if redact and spec.arg.secret and value is not None:
                value = REDACTED
            config.setdefault(spec.group, {})[spec.name] = list(value) if isinstance(value, tuple) else value
        prov = {k: {"source": p.source, "detail": p.detail} for k, p in self.provenance.items()}
        return {"version": JSON_VERSION, "role": self.role, "config": config, "provenance": prov}

    def to_json(self, redact: bool = False, indent: int | None = 2) -> str:
        """JSON with provenance for every field. redact=True hides secrets (then it no longer round-trips them)."""
        return json.dumps(self.to_dict(redact=redact), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> ResolvedConfig:
        """Inverse of to_json: the same values (tuples included) and the same provenance."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"resolved config JSON is not valid JSON ({e}); pass the output of to_json()") from None
        if not isinstance(data, dict) or data.get("version") != JSON_VERSION:
            version = data.get("version") if isinstance(data, dict) else None
            raise ConfigError(
                f"resolved config JSON has version {version!r}, expected {JSON_VERSION}; "
                "regenerate it with the same pdrelay version"
            )
        role = str(data.get("role"))
        catalog.check_role(role)
        config, prov_in = data.get("config", {}), data.get("provenance", {})
        by_group: dict[str, Any] = {}
        provenance: dict[str, Provenance] = {}
        for group in ROLE_GROUPS[role]:
            raw_group = config.get(group)
            specs = catalog.group_specs(group)
            if not isinstance(raw_group, dict) or set(raw_group) != {s.name for s in specs}:
                raise ConfigError(
                    f"resolved config JSON for role {role!r} has wrong fields in group {group!r}; "
                    "regenerate it with the same pdrelay version"
                )
            kwargs = {}
            for spec in specs:
                origin = Origin("json", spec.key)
                kwargs[spec.name] = validate(spec, coerce(spec, raw_group[spec.name], origin), origin)
                p = prov_in.get(spec.key)
                if not isinstance(p, dict) or p.get("source") not in SOURCES:
                    raise ConfigError(
                        f"resolved config JSON lacks a valid provenance for {spec.key!r}; regenerate it with to_json()"
                    )
                provenance[spec.key] = Provenance(p["source"], str(p.get("detail", "")))
            by_group[group] = GROUPS[group](**kwargs)
        extra = set(config) - set(ROLE_GROUPS[role])
        if extra:
            raise ConfigError(f"resolved config JSON has groups {sorted(extra)} that role {role!r} does not use")
        return cls(Role(role), by_group, provenance)

    def to_table(self, redact: bool = True) -> str:
        """An aligned table: group, flag, value, source (with detail). Secrets are redacted unless asked not to."""
        rows = [("GROUP", "FLAG", "VALUE", "SOURCE")]
        for spec in catalog.role_specs(self.role):
            value = getattr(self.by_group[spec.group], spec.name)
            shown = REDACTED if redact and spec.arg.secret and value is not None else format_value(value)
            rows.append((spec.group, spec.flag, shown, str(self.provenance[spec.key])))
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = [f"role: {self.role}"]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3] for r in rows]
        return "\n".join(lines)
