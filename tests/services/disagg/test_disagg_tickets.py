"""Prefill(ticket) straight from the test process acting as decode (disagg_tickets.LocalDecode), per backend:
a replayed ticket gets the same answer without a rewrite, a stale epoch is refused (fencing), malformed or
incompatible tickets get typed errors, and the prefill keeps serving and leaks no page."""

from __future__ import annotations

import grpc
import pytest

from proto.pdrelay.v1 import common_pb2, worker_pb2
from shared.cluster.grpc_errors import error_from_rpc
from shared.transfer.checksum import PageChecksum
from tests.services.disagg.disagg_client import Loads, hf_greedy
from tests.services.disagg.disagg_procs import BackendCluster
from tests.services.disagg.disagg_tickets import LocalDecode, send

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CONTEXT = 512  # the tiny model's


def typed_error(e: grpc.aio.AioRpcError) -> common_pb2.Error:
    err = error_from_rpc(e)
    assert err is not None, f"no pdrelay Error in the trailers of {e.code()}: {e.details()}"
    return err


async def test_replay_is_idempotent_and_a_stale_epoch_is_refused(pd: BackendCluster):
    prefill = pd["pa-healthy"]
    prompt = list(range(100, 140))  # 40 tokens: 3 pages
    (first_ref,) = hf_greedy(pd.model_dir, [prompt], 1)
    local = LocalDecode(pd.model_dir, pd.backend, f"test-decode-replay-{pd.backend}")
    try:
        pages = [3, 9, 4]
        ticket = local.ticket("replayed", 1000, prompt, pages)
        r1 = await send(prefill.grpc, ticket)
        assert r1.request_id == "replayed" and r1.epoch == 1000 and r1.prefill_instance_id == prefill.instance_id
        assert r1.first_token_id == first_ref[0]
        assert r1.pages_written == 3 and r1.bytes_written == 3 * local.runner.layout.page_bytes
        assert r1.checksum_algorithm == worker_pb2.CHECKSUM_ALGORITHM_XXH3_64
        assert r1.checksum == local.checksum(pages), "the pages we hold differ from what prefill wrote"
        # the same ticket again (a network-level retry): the same answer, and nothing is written again
        local.zero(pages)
        r2 = await send(prefill.grpc, ticket)
        assert r2.SerializeToString() == r1.SerializeToString()
        assert local.checksum(pages) != r1.checksum, "a replay must not rewrite the pages"
        # an older epoch of the same request (its decode already moved on) is fenced off
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await send(prefill.grpc, local.ticket("replayed", 999, prompt, pages))
        err = typed_error(info.value)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert err.code == common_pb2.ERROR_CODE_STALE_EPOCH and "999" in err.message
        assert err.instance_id == prefill.instance_id
        # a newer epoch runs again and writes; a ticket naming no checksum (a decode that knows only CRC-32) gets
        # the pages summed with CRC-32
        r3 = await send(prefill.grpc, local.ticket("replayed", 1001, prompt, pages, checksums=[]))
        assert r3.epoch == 1001 and r3.first_token_id == first_ref[0]
        assert r3.checksum_algorithm == worker_pb2.CHECKSUM_ALGORITHM_CRC32
        assert r3.checksum == local.transfer.checksum(pages, PageChecksum.CRC32)
    finally:
        await local.close()


async def test_malformed_and_incompatible_tickets_are_typed_errors(pd: BackendCluster):
    prefill = pd["pa-healthy"]
    prompt = list(range(200, 240))  # 40 tokens: 3 pages
    local = LocalDecode(pd.model_dir, pd.backend, f"test-decode-bad-{pd.backend}")
    try:
        layout = local.runner.layout
        pages = [1, 2, 3]
        other_backend = common_pb2.TransferPeer()
        other_backend.CopyFrom(local.transfer.peer_pb())
        other_backend.backend = (
            common_pb2.TRANSFER_BACKEND_MOONCAKE if pd.backend == "nixl" else common_pb2.TRANSFER_BACKEND_NIXL
        )
        dims = dict(num_layers=layout.num_layers, num_kv_heads=layout.num_kv_heads, head_dim=layout.head_dim)
        wrong_page = common_pb2.KVLayout(dtype=common_pb2.DTYPE_FLOAT32, page_size=8, **dims)
        no_dtype = common_pb2.KVLayout(dtype=common_pb2.DTYPE_UNSPECIFIED, page_size=16, **dims)
        fp8_kv = common_pb2.KVLayout(dtype=common_pb2.DTYPE_FP8_E4M3, page_size=16, **dims)  # a decode with fp8 KV
        latent = dict(num_layers=layout.num_layers, num_kv_heads=1, head_dim=layout.head_dim)  # an MLA model's decode
        mla_kv = common_pb2.KVLayout(
            dtype=common_pb2.DTYPE_FLOAT32, page_size=16, kind=common_pb2.KV_LAYOUT_KIND_MLA, **latent
        )
        half_pages = local.transfer.descriptors(pages)
        half_pages.paged.page_bytes //= 2
        cases = [  # (ticket fields, error code, substring of the message)
            (dict(layout=wrong_page), common_pb2.ERROR_CODE_LAYOUT_MISMATCH, "--page-size"),
            (dict(decode_peer=other_backend), common_pb2.ERROR_CODE_LAYOUT_MISMATCH, "--transfer-backend"),
            (dict(layout=no_dtype), common_pb2.ERROR_CODE_INVALID_ARGUMENT, "dtype"),
            (dict(layout=fp8_kv), common_pb2.ERROR_CODE_LAYOUT_MISMATCH, "--kv-cache-dtype"),
            (dict(layout=mla_kv), common_pb2.ERROR_CODE_LAYOUT_MISMATCH, "kind='mla'"),
            (dict(pages=common_pb2.PageDescriptors()), common_pb2.ERROR_CODE_INVALID_ARGUMENT, "no destination pages"),
            (dict(pages=local.transfer.descriptors([1, 2])), common_pb2.ERROR_CODE_INVALID_ARGUMENT, "needs 3"),
            (dict(pages=half_pages), common_pb2.ERROR_CODE_INVALID_ARGUMENT, "bytes"),
            (dict(skip_tokens=5), common_pb2.ERROR_CODE_INVALID_ARGUMENT, "multiple of the page size"),
            (dict(prompt_token_ids=[]), common_pb2.ERROR_CODE_INVALID_ARGUMENT, "prompt tokens"),
            (dict(checksums=[9]), common_pb2.ERROR_CODE_LAYOUT_MISMATCH, "none of them runs here"),  # negotiation
            (
                dict(prompt_token_ids=[5] * (CONTEXT + 10), pages=local.transfer.descriptors(list(range(33)))),
                common_pb2.ERROR_CODE_INVALID_ARGUMENT,
                "shorten the prompt",
            ),
        ]
        for i, (fields, code, match) in enumerate(cases):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await send(prefill.grpc, local.ticket(f"bad-{i}", 1, prompt, pages, **fields))
            err = typed_error(info.value)
            assert err.code == code, f"case {i} {list(fields)}: {err}"
            assert match in err.message, f"case {i}: {err.message}"
            assert err.instance_id == prefill.instance_id
        # still serving: a well-formed ticket works (also under a request id that failed above)
        ok = await send(prefill.grpc, local.ticket("bad-0", 2, prompt, pages))
        assert ok.checksum == local.checksum(pages)
        # a decode whose pool is on a GPU offers the device checksum first: prefill sums with it
        dev = await send(prefill.grpc, local.ticket("bad-0", 3, prompt, pages, checksums=[3, 2, 1]))
        assert dev.checksum_algorithm == worker_pb2.CHECKSUM_ALGORITHM_WORDSUM64
        assert dev.checksum == local.transfer.checksum(pages, PageChecksum.WORDSUM64)
    finally:
        await local.close()
    async with Loads(pd.nats_url, [pd.cluster]) as loads:
        await loads.all_pages_free([prefill.instance_id])
