"""`pdrelay serve prefill [flags]`: a prefill instance that writes prompt KV into decode instances' pages."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from services.prefill.service import PrefillService
from shared.service.main import serve_role


def main(argv: Sequence[str] | None = None) -> int:
    return serve_role("prefill", PrefillService, argv)


if __name__ == "__main__":
    sys.exit(main())
