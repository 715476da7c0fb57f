"""The kvstore's Mooncake Store tier under `pdrelay up`: one mooncake_master (with its HTTP metadata server) beside
the kvstore, on 127.0.0.1 and free ports, handed to the kvstore role as flags."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec

from shared.cluster.localcluster.netns_hosts import NetnsHosts
from shared.cluster.localcluster.plan import UpOptions
from shared.cluster.localcluster.servers import MooncakeMaster, find_binary, free_port


def plan_mooncake(
    opts: UpOptions, run_dir: Path, say: Callable[[str], None], hosts: NetnsHosts | None = None
) -> tuple[UpOptions, MooncakeMaster | None]:
    """(the options with the kvstore's master flags added, the master to start), or (opts, None) when no kvstore
    runs, the user named a master (--kvstore-mooncake-master), or this install lacks the binary. With hosts (`up
    --netns`) the master runs on the first kvstore's host, where every port is free."""
    user_flags = (*opts.extra, *opts.role_extra.get("kvstore", ()))
    if opts.counts.get("kvstore", 0) <= 0 or any(f.split("=", 1)[0] == "--kvstore-mooncake-master" for f in user_flags):
        return opts, None
    try:
        find_binary("mooncake_master")
    except ValueError as e:
        say(f"pdrelay up: note: the kvstore runs without its Mooncake Store tier: {e}")
        return opts, None
    if hosts is not None:
        master = hosts.mooncake_master(run_dir)
    else:
        master = MooncakeMaster(
            data_dir=run_dir / "mooncake", port=free_port(), tie_to_parent=True, start_timeout_s=60.0
        )
    flags = ("--kvstore-mooncake-master", master.address, "--kvstore-mooncake-metadata-url", master.metadata_url)
    role_extra = dict(opts.role_extra)
    role_extra["kvstore"] = (*flags, *role_extra.get("kvstore", ()))
    return msgspec.structs.replace(opts, role_extra=role_extra), master
