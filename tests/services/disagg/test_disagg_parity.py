"""Disaggregated serving with real processes (etcd, NATS, prefill, decode, worker) on a tiny model, per backend.

- 16 prompts (3..190 tokens, shared prefixes, up to 12 pages) sent at once: decode + prefill output equals the
  colocated worker's and HF generate's, token for token.
- Bad requests and bad tickets get typed errors (pdrelay Error in trailing metadata) and the services keep serving.
- Fencing at the prefill: a replayed ticket gets the same answer without a rewrite, a stale epoch is refused.
- No KV page leaks: every instance's load report shows free_pages == total_pages once idle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from proto.pdrelay.v1 import common_pb2, worker_pb2
from shared.cluster.grpc_errors import error_from_rpc
from tests.helpers.servers import start_etcd, start_nats
from tests.helpers.tiny_models import tiny_llama_dir  # noqa: F401
from tests.services.disagg.disagg_client import Loads, generate, generate_all, hf_greedy, mixed_prompts
from tests.services.disagg.disagg_procs import ServiceProc, Spec, start_services, stop_services
from tests.services.disagg.disagg_tickets import LocalDecode, send

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BACKENDS = ("nixl", "mooncake")
NEW = 12
VOCAB = 512  # the tiny model's
CONTEXT = 512


@dataclasses.dataclass
class Cluster:
    procs: dict[str, ServiceProc]
    nats_url: str
    model_dir: Path

    def __getitem__(self, instance_id: str) -> ServiceProc:
        return self.procs[instance_id]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Iterator[Cluster]:  # noqa: F811
    tmp = tmp_path_factory.mktemp("disagg-parity")
    etcd, nats = start_etcd(tmp), start_nats(tmp)
    procs: dict[str, ServiceProc] = {}
    try:
        pages = ("--num-pages", "128")
        specs = [Spec("worker", "w-colo", "colo", pages)]
        for b in BACKENDS:  # one cluster per backend: a decode only retries on prefills of its own backend
            specs += [Spec("prefill", f"p-{b}", b, ("--transfer-backend", b, *pages)),
                      Spec("decode", f"d-{b}", b, ("--transfer-backend", b, *pages))]
        procs = start_services(tmp, etcd, nats, tiny_llama_dir, specs)
        yield Cluster(procs, nats.url, tiny_llama_dir)
        codes = stop_services(procs.values())
        procs = {}
        assert codes == {s.instance_id: 0 for s in specs}, f"services must exit 0 on SIGTERM: {codes}"
    finally:
        stop_services(procs.values())
        etcd.stop()
        nats.stop()


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return mixed_prompts(VOCAB)


@pytest.fixture(scope="module")
def reference(tiny_llama_dir: Path, prompts: list[list[int]]) -> list[list[int]]:  # noqa: F811
    return hf_greedy(tiny_llama_dir, prompts, NEW)


def typed_error(e: grpc.aio.AioRpcError) -> common_pb2.Error:
    err = error_from_rpc(e)
    assert err is not None, f"no pdrelay Error in the trailers of {e.code()}: {e.details()}"
    return err


# ---- parity ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
async def test_disaggregated_output_equals_colocated_and_hf(cluster: Cluster, backend: str, prompts: list[list[int]],
                                                            reference: list[list[int]]):
    prefill, decode = cluster[f"p-{backend}"], cluster[f"d-{backend}"]
    colo = await generate_all(cluster["w-colo"].grpc, prompts, f"colo-{backend}", max_tokens=NEW)
    disagg = await generate_all(decode.grpc, prompts, f"pd-{backend}", prefill=prefill.target(), max_tokens=NEW)
    for i, (d, c, ref) in enumerate(zip(disagg, colo, reference, strict=True)):
        assert c.tokens == ref, f"prompt {i} ({len(prompts[i])} tokens): colocated differs from HF"
        assert d.tokens == ref, f"prompt {i} ({len(prompts[i])} tokens): disaggregated differs from HF/colocated"
        assert d.finish_reason == c.finish_reason == common_pb2.FINISH_REASON_LENGTH
        assert d.usage is not None and d.usage.prompt_tokens == len(prompts[i]) and d.usage.completion_tokens == NEW
        # the prompt KV came from the prefill instance, over the transfer backend
        assert d.prefill_instance_id == prefill.instance_id and c.prefill_instance_id == ""
        assert d.timings is not None and d.timings.transfer_s > 0 and d.timings.prefill_s >= d.timings.transfer_s
    # shared prefixes were served from decode's own prefix cache (pages it received earlier) at least once
    again = await generate(decode.grpc, f"pd-{backend}-again", prompts[1], prefill=prefill.target(), max_tokens=NEW)
    assert again.tokens == reference[1]
    assert again.usage is not None and again.usage.cached_tokens >= 16 * (len(prompts[1]) // 16 - 1)


# ---- bad requests -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
async def test_bad_requests_get_typed_errors_and_decode_keeps_serving(cluster: Cluster, backend: str,
                                                                      prompts: list[list[int]],
                                                                      reference: list[list[int]]):
    prefill, decode = cluster[f"p-{backend}"], cluster[f"d-{backend}"]
    target = prefill.target()
    cases = [  # (request id, prompt, sampling, substring of the message)
        ("too-long", [7] * (CONTEXT + 88), None, "shorten the prompt"),
        ("bad-token", [7, 8, VOCAB + 1000], None, "outside the vocabulary"),
        ("bad-temp", [7, 8, 9], common_pb2.SamplingParams(temperature=-1.0, max_tokens=3), "temperature"),
        ("", [7, 8, 9], None, "request_id"),
    ]
    for rid, prompt, sampling, match in cases:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await generate(decode.grpc, rid, prompt, prefill=target, sampling=sampling)
        err = typed_error(info.value)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.code == common_pb2.ERROR_CODE_INVALID_ARGUMENT and not err.retryable
        assert match in err.message, err.message
        assert err.instance_id == decode.instance_id
    ok = await generate(decode.grpc, f"after-bad-{backend}", prompts[2], prefill=target, max_tokens=NEW)
    assert ok.tokens == reference[2] and ok.prefill_instance_id == prefill.instance_id


# ---- tickets straight to the prefill ---------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
async def test_prefill_replay_is_idempotent_and_stale_epoch_is_refused(cluster: Cluster, backend: str):
    prefill = cluster[f"p-{backend}"]
    prompt = list(range(100, 140))  # 40 tokens: 3 pages
    (first_ref,) = hf_greedy(cluster.model_dir, [prompt], 1)
    local = LocalDecode(cluster.model_dir, backend, f"test-decode-replay-{backend}")
    try:
        pages = [3, 9, 4]
        ticket = local.ticket("replayed", 1000, prompt, pages)
        r1 = await send(prefill.grpc, ticket)
        assert r1.request_id == "replayed" and r1.epoch == 1000 and r1.prefill_instance_id == prefill.instance_id
        assert r1.first_token_id == first_ref[0]
        assert r1.pages_written == 3 and r1.bytes_written == 3 * local.runner.layout.page_bytes
        assert r1.checksum_algorithm == worker_pb2.CHECKSUM_ALGORITHM_CRC32
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
        # a newer epoch runs again and writes
        r3 = await send(prefill.grpc, local.ticket("replayed", 1001, prompt, pages))
        assert r3.epoch == 1001 and r3.first_token_id == first_ref[0] and r3.checksum == local.checksum(pages)
    finally:
        await local.close()


@pytest.mark.parametrize("backend", BACKENDS)
async def test_malformed_and_incompatible_tickets_are_typed_errors(cluster: Cluster, backend: str):
    prefill = cluster[f"p-{backend}"]
    prompt = list(range(200, 240))  # 40 tokens: 3 pages
    local = LocalDecode(cluster.model_dir, backend, f"test-decode-bad-{backend}")
    try:
        layout = local.runner.layout
        pages = [1, 2, 3]
        other_backend = common_pb2.TransferPeer()
        other_backend.CopyFrom(local.transfer.peer_pb())
        other_backend.backend = (common_pb2.TRANSFER_BACKEND_MOONCAKE if backend == "nixl"
                                 else common_pb2.TRANSFER_BACKEND_NIXL)
        wrong_page = common_pb2.KVLayout(dtype=common_pb2.DTYPE_FLOAT32, page_size=8, num_layers=layout.num_layers,
                                         num_kv_heads=layout.num_kv_heads, head_dim=layout.head_dim)
        no_dtype = common_pb2.KVLayout(dtype=common_pb2.DTYPE_UNSPECIFIED, page_size=16,
                                       num_layers=layout.num_layers, num_kv_heads=layout.num_kv_heads,
                                       head_dim=layout.head_dim)
        half_pages = local.transfer.descriptors(pages)
        half_pages.paged.page_bytes //= 2
        cases = [  # (ticket fields, error code, substring of the message)
            (dict(layout=wrong_page), common_pb2.ERROR_CODE_LAYOUT_MISMATCH, "--page-size"),
            (dict(decode_peer=other_backend), common_pb2.ERROR_CODE_LAYOUT_MISMATCH, "--transfer-backend"),
            (dict(layout=no_dtype), common_pb2.ERROR_CODE_INVALID_ARGUMENT, "dtype"),
            (dict(pages=common_pb2.PageDescriptors()), common_pb2.ERROR_CODE_INVALID_ARGUMENT, "no destination pages"),
            (dict(pages=local.transfer.descriptors([1, 2])), common_pb2.ERROR_CODE_INVALID_ARGUMENT, "needs 3"),
            (dict(pages=half_pages), common_pb2.ERROR_CODE_INVALID_ARGUMENT, "bytes"),
            (dict(skip_tokens=5), common_pb2.ERROR_CODE_INVALID_ARGUMENT, "multiple of the page size"),
            (dict(prompt_token_ids=[]), common_pb2.ERROR_CODE_INVALID_ARGUMENT, "prompt tokens"),
            (dict(prompt_token_ids=[5] * (CONTEXT + 10), pages=local.transfer.descriptors(list(range(33)))),
             common_pb2.ERROR_CODE_INVALID_ARGUMENT, "shorten the prompt"),
        ]
        for i, (fields, code, match) in enumerate(cases):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await send(prefill.grpc, local.ticket(f"bad-{i}", 1, prompt, pages, **fields))
            err = typed_error(info.value)
            assert err.code == code, f"case {i} {list(fields)}: {err}"
            assert match in err.message, f"case {i}: {err.message}"
        # still serving: a well-formed ticket works (also under a request id that failed above)
        ok = await send(prefill.grpc, local.ticket("bad-0", 2, prompt, pages))
        assert ok.checksum == local.checksum(pages)
    finally:
        await local.close()


# ---- accounting (last: after everything above) ------------------------------------------------------------------
async def test_no_kv_pages_leak(cluster: Cluster):
    async with Loads(cluster.nats_url, ["colo", *BACKENDS]) as loads:
        await loads.all_pages_free(list(cluster.procs))
