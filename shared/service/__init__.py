"""The lifecycle every pdrelay service shares, whatever its role: serve gRPC, register in etcd, warm up, announce
ready, drain, exit (lifecycle.py: `Service`); the process's own options and identity (args.py); the few lines
every role's `__main__` runs (main.py: `serve_role`); fault injection points (faults.py). What only the engine
roles share (the decode servicer, the KV hand-off, the kvstore client, media) is shared/serving/."""

from shared.service.args import (
    ServiceOptions,
    add_lifecycle_args,
    advertised_host,
    default_instance_id,
    options_from_namespace,
    service_args,
    split_lifecycle_args,
)
from shared.service.lifecycle import Service, ServiceConfig, run_service

__all__ = [
    "Service",
    "ServiceConfig",
    "ServiceOptions",
    "add_lifecycle_args",
    "advertised_host",
    "default_instance_id",
    "options_from_namespace",
    "run_service",
    "service_args",
    "split_lifecycle_args",
]
