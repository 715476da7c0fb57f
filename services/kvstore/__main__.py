"""`pdrelay serve kvstore [flags]`: one hierarchical KV store (host DRAM -> local disk) of a cluster."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from services.kvstore.service import KVStoreService
from shared.service.main import serve_role


def main(argv: Sequence[str] | None = None) -> int:
    return serve_role("kvstore", KVStoreService, argv)


if __name__ == "__main__":
    sys.exit(main())
