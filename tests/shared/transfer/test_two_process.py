"""Writer (this process) -> reader (a subprocess) over each backend: scattered pages land exactly, the completion
notice arrives, a stopped peer makes wait() time out, and the reader exits cleanly (no crash at exit)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from shared.transfer import PageDesc, TransferTimeout, checksum_pages, create_engine

READER = Path(__file__).with_name("reader_proc.py")
NUM_PAGES, PAGE_FLOATS = 24, 2048  # 8 KiB pages, 192 KiB pool
BACKENDS = ["nixl", "mooncake"]


class Reader:
    """The subprocess peer; every stdout line must be JSON (a stray log line fails the test)."""

    def __init__(self, backend: str, name: str) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        # its stderr (library logs) kept aside: quoted when it exits early, so a failure says why
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed in quit)
        self.proc = subprocess.Popen(
            [sys.executable, str(READER), backend, name, str(NUM_PAGES), str(PAGE_FLOATS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env=env,
        )
        ready = self._read()
        self.endpoint = bytes.fromhex(ready["endpoint"])
        self.page_bytes: int = ready["page_bytes"]
        self.base: int = ready["base"]

    def pages(self, page_ids: list[int]) -> list[PageDesc]:
        """What the reader's hand-off ticket would carry: its pages in its own address space."""
        return [PageDesc(self.base + p * self.page_bytes, self.page_bytes) for p in page_ids]

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=10)
            self.stderr.seek(0)
            raise AssertionError(f"reader exited early (rc {self.proc.returncode}): {self.stderr.read()[-3000:]}")
        return json.loads(line)  # a non-JSON line here means something printed to stdout

    def ask(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def wait_notif(self, timeout_s: float) -> list[list[str]]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            notifs = self.ask(cmd="notifs")["notifs"]
            if notifs:
                return notifs
            time.sleep(0.01)
        return []

    def pool(self, tmp_path: Path) -> torch.Tensor:
        path = tmp_path / "reader_pool.bin"
        self.ask(cmd="dump", path=str(path))
        return torch.from_numpy(np.fromfile(path, dtype=np.float32).reshape(NUM_PAGES, PAGE_FLOATS))

    def quit(self) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)  # in case a test stopped it
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
            self.proc.stdin.flush()
        try:
            return self.proc.wait(timeout=20)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            for f in (self.proc.stdin, self.proc.stdout, self.stderr):
                if f is not None:
                    f.close()


@pytest.fixture
def reader(request: pytest.FixtureRequest) -> Any:
    r = Reader(request.param, f"reader-{request.param}")
    yield r
    r.quit()


@pytest.mark.parametrize("reader", BACKENDS, indirect=True)
def test_scattered_pages_land_exactly_with_notification(reader: Reader, tmp_path: Path) -> None:
    backend = reader.proc.args[2]
    src_pool = torch.randn(NUM_PAGES, PAGE_FLOATS)  # [num_pages, page_floats], page-major like the KV pool
    src_pages = [3, 4, 5, 11, 0, 17, 18]  # runs (3,4,5) and (17,18) are contiguous on both sides below
    dst_pages = [9, 10, 11, 2, 23, 5, 6]
    with create_engine(backend, name=f"writer-{backend}", host="127.0.0.1") as eng:
        region = eng.register(src_pool)
        peer = eng.connect(reader.endpoint)
        assert eng.connect(reader.endpoint) == peer  # idempotent
        src = eng.describe_pages(region, src_pages, reader.page_bytes)
        h = eng.write(peer, src, reader.pages(dst_pages), notify=b"req-7:epoch-2")
        assert h.num_descs == 4  # 7 pages, 2 runs coalesced
        eng.wait(h, timeout_s=20)
        notifs = reader.wait_notif(timeout_s=20)
        assert notifs == [[f"writer-{backend}", b"req-7:epoch-2".hex()]]
        got = reader.pool(tmp_path)
        expected = torch.zeros(NUM_PAGES, PAGE_FLOATS)
        for s, d in zip(src_pages, dst_pages):
            expected[d] = src_pool[s]
        assert torch.equal(got, expected)  # exact bytes; untouched pages still zero
        assert checksum_pages(got, dst_pages) == checksum_pages(src_pool, src_pages)
    assert reader.quit() == 0  # a clean exit: no crash in library destructors


@pytest.mark.parametrize("reader", BACKENDS, indirect=True)
def test_stopped_peer_times_out_then_completes(reader: Reader, tmp_path: Path) -> None:
    backend = reader.proc.args[2]
    src_pool = torch.randn(4, PAGE_FLOATS)
    with create_engine(backend, name=f"writer2-{backend}", host="127.0.0.1") as eng:
        region = eng.register(src_pool)
        peer = eng.connect(reader.endpoint)
        src = eng.describe_pages(region, [1], reader.page_bytes)
        dst = reader.pages([7])
        os.kill(reader.proc.pid, signal.SIGSTOP)
        try:
            h = eng.write(peer, src, dst, notify=b"late")
            with pytest.raises(TransferTimeout, match="not done after"):
                eng.wait(h, timeout_s=1.0)
        finally:
            os.kill(reader.proc.pid, signal.SIGCONT)
        eng.wait(h, timeout_s=20)  # the same transfer finishes once the peer runs again
        assert reader.wait_notif(timeout_s=20) == [[f"writer2-{backend}", b"late".hex()]]
        assert torch.equal(reader.pool(tmp_path)[7], src_pool[1])
