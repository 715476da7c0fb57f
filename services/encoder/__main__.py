"""`pdrelay serve encoder [flags]`: sentence embeddings (and a vision-language model's vision tower) over gRPC."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from services.encoder.service import EncoderService
from shared.service.main import serve_role


def main(argv: Sequence[str] | None = None) -> int:
    return serve_role("encoder", EncoderService, argv)


if __name__ == "__main__":
    sys.exit(main())
