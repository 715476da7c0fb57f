"""`pdrelay serve decode [flags]`: a decode instance that takes prompt KV from prefill instances."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from services.decode.service import DecodeService
from shared.service.main import serve_role


def main(argv: Sequence[str] | None = None) -> int:
    return serve_role("decode", DecodeService, argv)


if __name__ == "__main__":
    sys.exit(main())
