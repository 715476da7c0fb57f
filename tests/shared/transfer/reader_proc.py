"""A receiving peer in its own process, driven over stdin/stdout (one JSON object per line).

    python reader_proc.py <backend> <name> <num_pages> <page_floats>
prints {"endpoint": hex, "base": addr, "page_bytes": n} once ready (base: the pool's address, what a ticket's
page descriptors are built from), then answers commands while progressing the engine:
    {"cmd": "notifs"}            -> {"notifs": [[sender, hex], ...]}   (everything received so far)
    {"cmd": "dump", "path": p}   -> {"dumped": p}                       (raw bytes of the whole pool)
    {"cmd": "quit"}              -> exits 0 after closing the engine
Anything else on stdout (a library's log line) breaks the parent's JSON parsing: the test relies on that.
"""

from __future__ import annotations

import json
import select
import sys

import torch

from shared.transfer import create_engine


def main() -> int:
    torch.set_num_threads(1)
    backend, name, num_pages, page_floats = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    pool = torch.zeros(num_pages, page_floats, dtype=torch.float32)  # [num_pages, page_floats], page-major
    eng = create_engine(backend, name=name, host="127.0.0.1")
    region = eng.register(pool)
    ready = {"endpoint": eng.endpoint().hex(), "base": region.addr, "page_bytes": page_floats * 4}
    print(json.dumps(ready), flush=True)
    notifs: list[list[str]] = []
    while True:
        eng.progress()
        notifs.extend([sender, msg.hex()] for sender, msg in eng.notifications())
        # 1 ms idle wait: responsive, but leaves the second core to the writer
        ready, _, _ = select.select([sys.stdin], [], [], 0.001)
        if not ready:
            continue
        line = sys.stdin.readline()
        if not line:
            break
        cmd = json.loads(line)
        if cmd["cmd"] == "notifs":
            print(json.dumps({"notifs": notifs}), flush=True)
        elif cmd["cmd"] == "dump":
            pool.numpy().tofile(cmd["path"])
            print(json.dumps({"dumped": cmd["path"]}), flush=True)
        elif cmd["cmd"] == "quit":
            break
    eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
