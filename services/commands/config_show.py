"""`pdrelay config show --role ROLE [flags...]`: the resolved config of a role, with where each value came from.

Every flag after the ones declared here goes to the role's resolver unchanged, so a flag of another role or a
misspelt flag gets the resolver's message (which roles accept it; the closest spelling).
"""

from __future__ import annotations

import argparse
import sys

from shared.config.roles import ROLES


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Registers `config` with its `show` subcommand on the top-level subparsers."""
    config = sub.add_parser(
        "config",
        help="show the resolved configuration of a role",
        description="Inspect pdrelay's role-aware configuration.",
        allow_abbrev=False,
    )
    config_sub = config.add_subparsers(dest="config_command", metavar="<subcommand>")
    config_sub.required = True
    show = config_sub.add_parser(
        "show",
        allow_abbrev=False,  # no prefix matching: `--j` must not silently mean --json
        help="print a role's resolved config with provenance: pdrelay config show --role decode [flags]",
        description="Print the resolved config of a role as a table (group, flag, value, source). Flags after "
        "--role are the role's own flags (and --config FILE), resolved exactly as the service would.",
    )
    show.add_argument("--role", required=True, choices=ROLES, help="which service's config to resolve")
    show.add_argument(
        "--json", action="store_true", help="print JSON with the provenance of every field (secrets redacted)"
    )
    show.add_argument(
        "--plan",
        action="store_true",
        help="print the process's devices and memory plan (weights, workspace, CUDA graphs, KV pages) instead; "
        "PDRELAY_SIMULATE_DEVICES=8x80GiB plans for GPUs this host does not have",
    )
    show.set_defaults(_run=run)


def run(ns: argparse.Namespace, extra: list[str]) -> int:
    """Prints the table (or JSON) and returns 0; on bad config prints the message to stderr and returns 2."""
    import os

    from shared.config import ConfigError, PassContext, resolve
    from shared.config.probe import probe_from_env
    from shared.modelspec.bundled import prepared_model_dir

    try:
        probe = probe_from_env(os.environ)
        cfg = resolve(ns.role, extra, ctx=PassContext(probe=probe, locate_model=prepared_model_dir))
    except ConfigError as e:
        print(f"pdrelay config show: error: {e}", file=sys.stderr)
        return 1 if "does not fit" in str(e) else 2
    if ns.plan:
        from shared.cluster.localcluster import dry_run

        rows = [dry_run.config_row(ns.role, cfg, probe)]
        header = dry_run.host_line(probe)
        print(dry_run.to_json(rows, header) if ns.json else dry_run.format_table(rows, header))
        return 0
    print(cfg.to_json(redact=True) if ns.json else cfg.to_table(redact=True))
    return 0
