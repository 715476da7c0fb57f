"""The trace sink of `pdrelay up --trace`: an OTLP/gRPC receiver process (shared.telemetry.sink) appending every span
to `<run-dir>/traces/spans.jsonl`, which `pdrelay trace` reads. Started before the services (they are pointed at it
with --otlp-traces-endpoint) and stopped after them, so the spans of their shutdown are written too."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from shared.cluster.localcluster.servers import _ServerProcess


@dataclass
class TraceSink(_ServerProcess):
    out: Path = Path("spans.jsonl")
    name = "trace-sink"

    @property
    def endpoint(self) -> str:
        """What services take as --otlp-traces-endpoint."""
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "shared.telemetry.sink",
            "--out",
            str(self.out),
            "--host",
            self.host,
            "--port",
            str(self.port),
        ]
