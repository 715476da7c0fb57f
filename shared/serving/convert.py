"""Conversions between the wire (proto pdrelay.v1) and the engine's typed objects. Pure functions, no I/O. The
sampling parameters' are shared/cluster/sampling_pb.py (the gateway sends them too)."""

from __future__ import annotations

from proto.pdrelay.v1 import common_pb2
from shared.engine.request import RequestOutput, TokenLogprobs
from shared.modelspec.kv_layout import KVLayout

_DTYPE_TO_PB = {
    "float32": common_pb2.DTYPE_FLOAT32,
    "bfloat16": common_pb2.DTYPE_BFLOAT16,
    "float16": common_pb2.DTYPE_FLOAT16,
    "fp8_e4m3": common_pb2.DTYPE_FP8_E4M3,
}
_DTYPE_FROM_PB = {v: k for k, v in _DTYPE_TO_PB.items()}
_FINISH_TO_PB = {
    "stop": common_pb2.FINISH_REASON_STOP,
    "length": common_pb2.FINISH_REASON_LENGTH,
    "abort": common_pb2.FINISH_REASON_ABORT,
}
FINISH_FROM_PB = {v: k for k, v in _FINISH_TO_PB.items()}
_KIND_TO_PB = {"mha": common_pb2.KV_LAYOUT_KIND_MHA, "mla": common_pb2.KV_LAYOUT_KIND_MLA}
_KIND_FROM_PB = {v: k for k, v in _KIND_TO_PB.items()}
BACKEND_TO_PB = {"nixl": common_pb2.TRANSFER_BACKEND_NIXL, "mooncake": common_pb2.TRANSFER_BACKEND_MOONCAKE}
BACKEND_FROM_PB = {v: k for k, v in BACKEND_TO_PB.items()}


def layout_to_pb(layout: KVLayout) -> common_pb2.KVLayout:
    return common_pb2.KVLayout(
        dtype=_DTYPE_TO_PB[layout.dtype],
        page_size=layout.page_size,
        num_layers=layout.num_layers,
        num_kv_heads=layout.num_kv_heads,
        head_dim=layout.head_dim,
        kind=_KIND_TO_PB[layout.kind],  # mha is the enum's 0: an mha layout encodes to the same bytes as before
    )


def layout_from_pb(pb: common_pb2.KVLayout) -> KVLayout:
    """Raises ValueError on a layout message that names no dtype or an unknown kind (a malformed ticket)."""
    if pb.dtype not in _DTYPE_FROM_PB:
        raise ValueError(f"KV layout has no known dtype (got enum {pb.dtype}); the peer sent a malformed layout")
    if pb.kind not in _KIND_FROM_PB:
        raise ValueError(f"KV layout has an unknown kind (got enum {pb.kind}); the peer runs a newer layout")
    if min(pb.page_size, pb.num_layers, pb.num_kv_heads, pb.head_dim) <= 0:
        raise ValueError(f"KV layout has a zero dimension: {pb}".replace("\n", " "))
    return KVLayout(
        dtype=_DTYPE_FROM_PB[pb.dtype],
        page_size=pb.page_size,
        num_layers=pb.num_layers,
        num_kv_heads=pb.num_kv_heads,
        head_dim=pb.head_dim,
        kind=_KIND_FROM_PB[pb.kind],  # an mla kind with several KV heads is refused by KVLayout itself
    )


def logprob_to_pb(lp: TokenLogprobs) -> common_pb2.TokenLogprob:
    return common_pb2.TokenLogprob(
        token_id=lp.token_id,
        logprob=lp.logprob,
        rank=lp.rank,
        top_logprobs=[common_pb2.TopLogprob(token_id=t, logprob=v) for t, v in lp.top],
    )


def logprob_from_pb(pb: common_pb2.TokenLogprob) -> TokenLogprobs:
    return TokenLogprobs(pb.token_id, pb.logprob, tuple((t.token_id, t.logprob) for t in pb.top_logprobs), pb.rank)


def finish_to_pb(out: RequestOutput) -> common_pb2.FinishReason:
    if not out.finished or out.finish_reason is None:
        return common_pb2.FINISH_REASON_UNSPECIFIED
    return _FINISH_TO_PB[out.finish_reason]


def matched_stop_to_pb(stop: int | str | None) -> common_pb2.MatchedStop | None:
    if stop is None:
        return None
    if isinstance(stop, str):
        return common_pb2.MatchedStop(text=stop)
    return common_pb2.MatchedStop(token_id=int(stop))
