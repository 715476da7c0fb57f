"""`pdrelay serve worker [flags]`: one colocated prefill+decode instance."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from services.worker.service import WorkerService
from shared.service.main import serve_role


def main(argv: Sequence[str] | None = None) -> int:
    return serve_role("worker", WorkerService, argv)


if __name__ == "__main__":
    sys.exit(main())
