"""Typed, role-aware configuration: CLI + env + YAML -> a resolved, frozen config with provenance.

    from shared.config import resolve
    cfg = resolve("decode", ["--page-size", "32"])
    cfg.cache.page_size                      # 32
    cfg.provenance["cache.page_size"]        # Provenance(source='cli', detail='--page-size')
    ResolvedConfig.from_json(cfg.to_json())  # == cfg (how `pdrelay up` hands configs to child processes)

Options are declared once in groups.py; roles.py says which groups each role uses; passes.py derives the rest.
"""

from __future__ import annotations

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
    GrpcConfig,
    HttpConfig,
    KernelConfig,
    KVStoreConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    TelemetryConfig,
    TokenizerConfig,
    TransferConfig,
)
from shared.config.passes import PASSES, PassContext
from shared.config.probe import HostProbe, StaticProbe
from shared.config.resolve import defaults, exit_on_config_error, parse_role_args, resolve, role_help
from shared.config.resolved import Provenance, ResolvedConfig
from shared.config.roles import ROLE_GROUPS, ROLES

__all__ = [
    "GROUPS",
    "PASSES",
    "ROLES",
    "ROLE_GROUPS",
    "BusConfig",
    "CacheConfig",
    "ConfigError",
    "CudaGraphConfig",
    "DeviceConfig",
    "DisaggConfig",
    "DiscoveryConfig",
    "EncoderConfig",
    "GrpcConfig",
    "HostProbe",
    "HttpConfig",
    "KVStoreConfig",
    "KernelConfig",
    "ModelConfig",
    "ParallelConfig",
    "PassContext",
    "Provenance",
    "ResolvedConfig",
    "SchedulerConfig",
    "StaticProbe",
    "TelemetryConfig",
    "TokenizerConfig",
    "TransferConfig",
    "defaults",
    "exit_on_config_error",
    "parse_role_args",
    "resolve",
    "role_help",
]
