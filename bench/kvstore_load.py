"""Load bandwidth store -> engine pool, next to memcpy of the same bytes (`python -m bench.kvstore_load`).

A real kvstore process (etcd + NATS on free ports) and, in this process, a KV pool of the bundled model's page size
(720 KiB) registered with the same transfer backend the engines use. The pool's pages are Put into the store once;
then each round Gets them back (the store writes straight into the pool over NIXL / Mooncake, the client checks
every page's CRC-32 like the engine does) and copies the same bytes with torch (single thread) for the reference.
Ratio = median over rounds of memcpy time / Get time (the Get's own transfer_s, and the whole RPC incl. CRCs).

    python -m bench.kvstore_load --mib 16 64 --rounds 5 --backend nixl
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import torch

from proto.pdrelay.v1 import worker_pb2, worker_pb2_grpc
from shared.cluster.handshake import parse_ready_line
from shared.cluster.localcluster.servers import EtcdServer, NatsServer, free_port, stop_process
from shared.engine.kv_pool import KVPool
from shared.modelspec.kv_layout import KVLayout
from shared.serving.convert import BACKEND_TO_PB, layout_to_pb
from shared.serving.handoff import descs_from_pb
from shared.serving.kv_transfer import KVTransfer
from shared.transfer.checksum import checksum_pages

LAYOUT = KVLayout(dtype="float32", page_size=16, num_layers=30, num_kv_heads=3, head_dim=64)  # SmolLM2-135M


def _start_store(
    tmp: Path, etcd: EtcdServer, nats: NatsServer, backend: str, dram: int
) -> tuple[subprocess.Popen, str]:
    out = tmp / "kv.out"
    with open(out, "wb") as f, open(tmp / "kv.err", "wb") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "services.kvstore",
                "--etcd-endpoints",
                etcd.url,
                "--nats-url",
                nats.url,
                "--cluster",
                "bench",
                "--instance-id",
                "kv-bench",
                "--transfer-backend",
                backend,
                "--kvstore-dram-bytes",
                str(dram),
            ],
            stdout=f,
            stderr=err,
            stdin=subprocess.DEVNULL,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for line in out.read_bytes().splitlines():
            info = parse_ready_line(line)
            if info is not None:
                return proc, info.grpc
        if proc.poll() is not None:
            raise RuntimeError(f"kvstore exited with {proc.returncode}: {(tmp / 'kv.err').read_text()[-2000:]}")
        time.sleep(0.1)
    raise TimeoutError("kvstore not ready in 60 s")


async def _measure(address: str, transfer: KVTransfer, n_pages: int, rounds: int) -> dict[str, float]:
    pool = transfer.pool
    hashes = [0xB0000000 + n_pages * 1000 + i for i in range(n_pages)]
    ids = list(range(n_pages))
    pool.buffer[:n_pages].uniform_()
    async with grpc.aio.insecure_channel(address) as ch:
        stub = worker_pb2_grpc.KVStoreStub(ch)
        lay = layout_to_pb(LAYOUT)
        res = await stub.Put(
            worker_pb2.PutPagesRequest(
                block_hashes=hashes, layout=lay, model="bench", backend=BACKEND_TO_PB[transfer.backend]
            ),
            timeout=30,
        )
        if res.put_id:
            peer = transfer.connect(res.store_peer)
            h = transfer.write_pages(peer, [ids[i] for i in res.indexes], descs_from_pb(res.slots, LAYOUT), b"")
            await transfer.wait(h, 30)
            crcs = [checksum_pages(pool.buffer, [ids[i]]) for i in res.indexes]
            await stub.CommitPut(worker_pb2.CommitPutRequest(put_id=res.put_id, page_checksums=crcs), timeout=30)
        src = pool.buffer[:n_pages].clone()
        dst = torch.empty_like(src)
        ratios_xfer, ratios_rpc, gbps = [], [], []
        for _ in range(rounds + 1):  # the first round connects the store to us: not measured
            t0 = time.perf_counter()
            resp = await stub.Get(
                worker_pb2.GetPagesRequest(
                    request_id="bench",
                    block_hashes=hashes,
                    layout=lay,
                    model="bench",
                    destination_peer=transfer.peer_pb(),
                    destination=transfer.descriptors(ids),
                    deadline_s=30,
                ),
                timeout=30,
            )
            ok = all(checksum_pages(pool.buffer, [p]) == c for p, c in zip(ids, resp.page_checksums, strict=True))
            rpc_s = time.perf_counter() - t0
            assert ok and resp.pages_written == n_pages, "a loaded page failed its checksum"
            t1 = time.perf_counter()
            dst.copy_(src)
            copy_s = time.perf_counter() - t1
            ratios_xfer.append(copy_s / resp.transfer_s)
            ratios_rpc.append(copy_s / rpc_s)
            gbps.append(n_pages * LAYOUT.page_bytes / resp.transfer_s / 1e9)
    return {
        "x_memcpy_transfer": statistics.median(ratios_xfer[1:]),
        "x_memcpy_rpc": statistics.median(ratios_rpc[1:]),
        "gb_per_s": statistics.median(gbps[1:]),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.kvstore_load", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--mib", type=int, nargs="+", default=[16, 64], help="load sizes in MiB")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--backend", default="nixl", choices=("nixl", "mooncake"))
    ns = p.parse_args(argv)
    torch.set_num_threads(1)
    pages = {m: max(1, m * (1 << 20) // LAYOUT.page_bytes) for m in ns.mib}
    total = sum(pages.values())
    with tempfile.TemporaryDirectory(prefix="pdrelay-bench-kvstore-load-") as d:
        tmp = Path(d)
        etcd = EtcdServer(data_dir=tmp / "etcd", port=free_port())
        nats = NatsServer(data_dir=tmp / "nats", port=free_port())
        etcd.start()
        nats.start()
        proc = None
        transfer = None
        try:
            proc, address = _start_store(tmp, etcd, nats, ns.backend, (total + 8) * LAYOUT.page_bytes)
            transfer = KVTransfer(ns.backend, "bench-client", "127.0.0.1", KVPool(LAYOUT, max(pages.values())))

            async def run_all() -> list[tuple[int, dict[str, float]]]:
                transfer.start_progress()
                return [(m, await _measure(address, transfer, pages[m], ns.rounds)) for m in ns.mib]

            results = asyncio.run(run_all())
        finally:
            if transfer is not None:
                transfer.engine.close()
            if proc is not None:
                stop_process(proc)
            nats.stop()
            etcd.stop()
    print(f"kvstore Get -> engine pool ({ns.backend}, {LAYOUT.page_bytes // 1024} KiB pages, median of {ns.rounds}):")
    print(f"{'size':>8} {'pages':>6} {'GB/s':>6} {'x memcpy (transfer)':>20} {'x memcpy (RPC + CRCs)':>22}")
    for m, r in results:
        print(
            f"{m:>5} MiB {pages[m]:>6} {r['gb_per_s']:>6.2f} {r['x_memcpy_transfer']:>19.2f}x "
            f"{r['x_memcpy_rpc']:>21.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
