"""`pdrelay serve gateway [flags]` (or `python -m services.gateway`): the OpenAI HTTP API and the gRPC Gateway API
over the cluster's decode / prefill / worker instances, found in etcd."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from services.gateway.service import GatewayService
from shared.service.main import serve_role


def main(argv: Sequence[str] | None = None) -> int:
    return serve_role("gateway", GatewayService, argv)


if __name__ == "__main__":
    sys.exit(main())
