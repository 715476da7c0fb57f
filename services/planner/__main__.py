"""`pdrelay serve planner [flags]`: the planner (one of several leads, through etcd)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from services.planner.service import PlannerService
from shared.service.main import serve_role


def main(argv: Sequence[str] | None = None) -> int:
    return serve_role("planner", PlannerService, argv)


if __name__ == "__main__":
    sys.exit(main())
