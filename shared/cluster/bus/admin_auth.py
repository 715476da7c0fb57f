"""Signed admin commands on the bus (drain, scale): only a holder of the cluster secret can send them.

`pdrelay up` creates the secret (<run-dir>/admin.secret, mode 0600) and hands its path to every child
(--admin-secret-file). A sender signs each command: the header `Pdrelay-Admin-Auth: v1.<ms>.<nonce>.<hmac>` carries
an HMAC-SHA256 over the subject, the time, a random nonce and the payload. A receiver with the secret refuses
(and logs) commands that are unsigned, signed with another secret, sent to another subject, older or newer than
`max_skew_s`, or replayed (nonce seen before). Whoever sends admin commands signs through `sign_headers`:

    auth = AdminAuth.from_file(cfg.bus.admin_secret_file)
    await request_scale(bus, cluster, {"prefill": 2}, auth=auth)
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import time
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)

HEADER = "Pdrelay-Admin-Auth"
_VERSION = "v1"
_SECRET_BYTES = 32


class AdminAuthError(ValueError):
    """The secret file is missing, unreadable or too short; the message names the flag."""


def _mac(secret: bytes, subject: str, stamp: str, nonce: str, payload: bytes) -> str:
    msg = b"|".join((_VERSION.encode(), subject.encode(), stamp.encode(), nonce.encode(), payload))
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()


class AdminAuth:
    """Signs and verifies admin commands with one cluster secret."""

    def __init__(self, secret: bytes, *, max_skew_s: float = 60.0, replay_window: int = 4096) -> None:
        if len(secret) < 16:
            raise AdminAuthError(
                "the admin secret must be at least 16 bytes; make one with `pdrelay up` or "
                "`head -c 32 /dev/urandom | xxd -p -c 64 > FILE`"
            )
        self._secret = secret
        self.max_skew_s = max_skew_s
        self._seen: OrderedDict[str, float] = OrderedDict()  # nonce -> when it was accepted
        self._window = replay_window
        self.refused = 0

    # ------------------------------------------------------------------ secret files

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> AdminAuth:
        try:
            text = Path(path).read_text().strip()
        except OSError as e:
            raise AdminAuthError(f"--admin-secret-file {path}: cannot read it ({e.strerror})") from None
        return cls(text.encode())

    @classmethod
    def create_file(cls, path: str | os.PathLike[str]) -> AdminAuth:
        """A new random secret, written to `path` readable by its owner only."""
        text = secrets.token_hex(_SECRET_BYTES)
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text + "\n")
        return cls(text.encode())

    # ------------------------------------------------------------------ sign / verify

    def sign_headers(self, subject: str, payload: bytes) -> dict[str, str]:
        """The header that authenticates `payload` on `subject`."""
        stamp, nonce = str(int(time.time() * 1000)), secrets.token_hex(12)
        return {HEADER: f"{_VERSION}.{stamp}.{nonce}.{_mac(self._secret, subject, stamp, nonce, payload)}"}

    def check(self, subject: str, payload: bytes, headers: Mapping[str, str] | None) -> str | None:
        """None if the command is authentic and fresh; otherwise why it is refused (also counted and logged)."""
        why = self._why_refused(subject, payload, headers)
        if why is not None:
            self.refused += 1
            log.warning("refused an admin command on %s: %s", subject, why)
        return why

    def _why_refused(self, subject: str, payload: bytes, headers: Mapping[str, str] | None) -> str | None:
        token = (headers or {}).get(HEADER)
        if not token:
            return f"it is not signed (no {HEADER} header); send it with the cluster's admin secret"
        parts = token.split(".")
        if len(parts) != 4 or parts[0] != _VERSION or not parts[1].isdigit():
            return "its signature is malformed"
        _, stamp, nonce, mac = parts
        if not hmac.compare_digest(mac, _mac(self._secret, subject, stamp, nonce, payload)):
            return "its signature does not match (another secret, another subject, or a changed message)"
        skew = abs(time.time() - int(stamp) / 1000)
        if skew > self.max_skew_s:
            return f"it was signed {skew:.0f} s away from now (more than {self.max_skew_s:g} s)"
        if nonce in self._seen:
            return "it was already received once (a replay)"
        self._seen[nonce] = time.monotonic()
        while len(self._seen) > self._window:
            self._seen.popitem(last=False)
        return None
