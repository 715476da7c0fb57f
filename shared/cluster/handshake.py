"""The ready handshake between a service and whoever started it (`pdrelay up`, a test, a process manager).

When a service is ready it prints exactly one JSON line on stdout, `{"event": "ready", ...}`, and, when given
`--ready-file PATH`, writes the same JSON to PATH atomically (write + rename), so a parent can either read the
child's stdout or poll a file.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import msgspec


class ReadyInfo(msgspec.Struct, frozen=True, kw_only=True):
    event: str = "ready"
    role: str
    instance_id: str
    cluster: str
    grpc: str  # "host:port"
    epoch: int
    pid: int
    http: str = ""  # "host:port" of an HTTP API, when the service has one
    metrics: str = ""


def announce_ready(info: ReadyInfo, ready_file: str | os.PathLike[str] | None = None) -> None:
    line = msgspec.json.encode(info).decode()
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    if ready_file:
        path = Path(ready_file)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(line + "\n")
        tmp.replace(path)


def parse_ready_line(line: str | bytes) -> ReadyInfo | None:
    """The ReadyInfo if `line` is a ready line, else None (any other output of the service)."""
    text = line.decode(errors="replace") if isinstance(line, bytes) else line
    text = text.strip()
    if not text.startswith("{") or '"ready"' not in text:
        return None
    try:
        if json.loads(text).get("event") != "ready":
            return None
        return msgspec.json.decode(text, type=ReadyInfo)
    except (ValueError, msgspec.ValidationError):
        return None


def read_ready_file(path: str | os.PathLike[str]) -> ReadyInfo | None:
    try:
        return parse_ready_line(Path(path).read_text())
    except OSError:
        return None
