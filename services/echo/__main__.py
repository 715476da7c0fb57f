"""`python -m services.echo [flags]`: the echo service (see service.py); `pdrelay up --echo N` starts it."""

from __future__ import annotations

import sys

from services.echo.service import main

if __name__ == "__main__":
    sys.exit(main())
