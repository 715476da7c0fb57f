"""Disaggregated serving with real processes (etcd, NATS, prefill, decode, worker) on a tiny model, per backend.

- 16 prompts (3..190 tokens, shared prefixes, up to 12 pages) sent at once: decode + prefill output equals the
  colocated worker's and HF generate's, token for token.
- Bad requests get typed errors (pdrelay Error in trailing metadata) and decode keeps serving.
- No KV page leaks: every instance's load report shows free_pages == total_pages once idle.
"""

from __future__ import annotations

import grpc
import pytest

from proto.pdrelay.v1 import common_pb2
from shared.cluster.grpc_errors import error_from_rpc
from tests.services.disagg.disagg_client import Loads, generate, generate_all, hf_greedy, mixed_prompts
from tests.services.disagg.disagg_procs import BackendCluster, Servers, ServiceProc

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NEW = 12
VOCAB = 512  # the tiny model's
CONTEXT = 512


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return mixed_prompts(VOCAB)


@pytest.fixture(scope="module")
def reference(servers: Servers, prompts: list[list[int]]) -> list[list[int]]:
    return hf_greedy(servers.model_dir, prompts, NEW)


async def test_disaggregated_output_equals_colocated_and_hf(
    pd: BackendCluster, worker: ServiceProc, prompts: list[list[int]], reference: list[list[int]]
):
    prefill, decode = pd["pa-healthy"], pd["d"]
    colo = await generate_all(worker.grpc, prompts, f"colo-{pd.backend}", max_tokens=NEW)
    disagg = await generate_all(decode.grpc, prompts, "pd", prefill=prefill.target(), max_tokens=NEW)
    for i, (d, c, ref) in enumerate(zip(disagg, colo, reference, strict=True)):
        assert c.tokens == ref, f"prompt {i} ({len(prompts[i])} tokens): colocated differs from HF"
        assert d.tokens == ref, f"prompt {i} ({len(prompts[i])} tokens): disaggregated differs from HF/colocated"
        assert d.finish_reason == c.finish_reason == common_pb2.FINISH_REASON_LENGTH
        assert d.usage is not None and d.usage.prompt_tokens == len(prompts[i]) and d.usage.completion_tokens == NEW
        # the prompt KV came from the prefill instance, over the transfer backend
        assert d.prefill_instance_id == prefill.instance_id and c.prefill_instance_id == ""
        assert d.timings is not None and d.timings.transfer_s > 0 and d.timings.prefill_s >= d.timings.transfer_s
    # the same prompt again: decode's own prefix cache (pages it received before) covers its full pages
    again = await generate(decode.grpc, "pd-again", prompts[1], prefill=prefill.target(), max_tokens=NEW)
    assert again.tokens == reference[1]
    assert again.usage is not None and again.usage.cached_tokens == 16 * ((len(prompts[1]) - 1) // 16)
    async with Loads(pd.nats_url, [pd.cluster, "colo"]) as loads:
        await loads.all_pages_free([decode.instance_id, prefill.instance_id, worker.instance_id])


async def test_bad_requests_get_typed_errors_and_decode_keeps_serving(
    pd: BackendCluster, prompts: list[list[int]], reference: list[list[int]]
):
    prefill, decode = pd["pa-healthy"], pd["d"]
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
        err = error_from_rpc(info.value)
        assert err is not None, f"no pdrelay Error in the trailers: {info.value.details()}"
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.code == common_pb2.ERROR_CODE_INVALID_ARGUMENT and not err.retryable
        assert match in err.message, err.message
        assert err.instance_id == decode.instance_id
    ok = await generate(decode.grpc, "after-bad", prompts[2], prefill=target, max_tokens=NEW)
    assert ok.tokens == reference[2] and ok.prefill_instance_id == prefill.instance_id
    async with Loads(pd.nats_url, [pd.cluster]) as loads:
        await loads.all_pages_free([decode.instance_id, prefill.instance_id])
