"""`pdrelay model prepare`: turn the bundled GGUF into a safetensors model directory and print its path.
`pdrelay model check DIR`: say whether a model directory can be served, and why not (exit status 0 or 1)."""

from __future__ import annotations

import argparse
import os
import sys

from shared.config.groups import BUNDLED_MODEL


def add_parser(sub: argparse._SubParsersAction) -> None:
    model = sub.add_parser("model", help="prepare the bundled model, or check a model directory")
    model_sub = model.add_subparsers(dest="model_command", metavar="<action>")
    model_sub.required = True
    prep = model_sub.add_parser("prepare", help="prepare a model directory (idempotent) and print its path")
    prep.add_argument("--model", default=BUNDLED_MODEL, help=f"model to prepare (default: {BUNDLED_MODEL})")
    prep.add_argument(
        "--model-cache-dir",
        default=os.environ.get("PDRELAY_MODEL_CACHE_DIR") or None,
        help="cache folder (default: $PDRELAY_MODEL_CACHE_DIR, else $XDG_CACHE_HOME/pdrelay/models)",
    )
    prep.set_defaults(_run=run)
    check = model_sub.add_parser("check", help="say whether a model directory can be served, and why not")
    check.add_argument("model_dir", help="a Hugging Face model directory (config.json + safetensors)")
    check.set_defaults(_run=run_check)


def run(ns: argparse.Namespace, extra: list[str]) -> int:
    if extra:
        print(f"pdrelay model prepare: unknown arguments: {' '.join(extra)}", file=sys.stderr)
        return 2
    from shared.modelspec.bundled import resolve_model_path

    try:
        path = resolve_model_path(ns.model, ns.model_cache_dir)
    except ValueError as e:
        print(f"pdrelay model prepare: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0


def run_check(ns: argparse.Namespace, extra: list[str]) -> int:
    if extra:
        print(f"pdrelay model check: unknown arguments: {' '.join(extra)}", file=sys.stderr)
        return 2
    from shared.engine.model_check import check_model_dir

    result = check_model_dir(ns.model_dir)
    if result.ok:
        print(f"ok: {result.reason}")
        return 0
    print(f"cannot serve: {result.reason}")
    return 1
