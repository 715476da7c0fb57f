"""The detached supervisor of `pdrelay up --detach`: `python -m shared.cluster.localcluster --options FILE`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

import msgspec

from shared.cluster.localcluster.plan import UpOptions
from shared.cluster.localcluster.supervisor import Supervisor


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m shared.cluster.localcluster")
    p.add_argument("--options", required=True, help="UpOptions JSON written by `pdrelay up --detach`")
    ns = p.parse_args(argv)
    opts = msgspec.json.decode(Path(ns.options).read_bytes(), type=UpOptions)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    return asyncio.run(Supervisor(opts).run())


if __name__ == "__main__":
    sys.exit(main())
