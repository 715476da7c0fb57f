"""Conversions between the wire (proto pdrelay.v1) and the engine's typed objects. Pure functions, no I/O."""

from __future__ import annotations

from proto.pdrelay.v1 import common_pb2
from shared.engine.request import RequestOutput, TokenLogprobs
from shared.engine.sampling_params import SamplingParams
from shared.grammar.spec import GrammarKind, StructuredSpec
from shared.modelspec.kv_layout import KVLayout

_DTYPE_TO_PB = {
    "float32": common_pb2.DTYPE_FLOAT32,
    "bfloat16": common_pb2.DTYPE_BFLOAT16,
    "float16": common_pb2.DTYPE_FLOAT16,
}
_DTYPE_FROM_PB = {v: k for k, v in _DTYPE_TO_PB.items()}
_FINISH_TO_PB = {
    "stop": common_pb2.FINISH_REASON_STOP,
    "length": common_pb2.FINISH_REASON_LENGTH,
    "abort": common_pb2.FINISH_REASON_ABORT,
}
FINISH_FROM_PB = {v: k for k, v in _FINISH_TO_PB.items()}
BACKEND_TO_PB = {"nixl": common_pb2.TRANSFER_BACKEND_NIXL, "mooncake": common_pb2.TRANSFER_BACKEND_MOONCAKE}
BACKEND_FROM_PB = {v: k for k, v in BACKEND_TO_PB.items()}
_GRAMMAR_TO_PB = {
    GrammarKind.JSON_OBJECT: common_pb2.GRAMMAR_KIND_JSON_OBJECT,
    GrammarKind.JSON_SCHEMA: common_pb2.GRAMMAR_KIND_JSON_SCHEMA,
    GrammarKind.REGEX: common_pb2.GRAMMAR_KIND_REGEX,
    GrammarKind.CHOICE: common_pb2.GRAMMAR_KIND_CHOICE,
    GrammarKind.GRAMMAR: common_pb2.GRAMMAR_KIND_GRAMMAR,
}
_GRAMMAR_FROM_PB = {v: k for k, v in _GRAMMAR_TO_PB.items()}


def structured_to_pb(spec: StructuredSpec) -> common_pb2.StructuredOutput:
    return common_pb2.StructuredOutput(
        kind=_GRAMMAR_TO_PB[spec.kind], spec=spec.spec, accepted_token_ids=list(spec.accepted)
    )


def structured_from_pb(pb: common_pb2.SamplingParams) -> StructuredSpec | None:
    if not pb.HasField("structured"):
        return None
    kind = _GRAMMAR_FROM_PB.get(pb.structured.kind)
    if kind is None:
        from shared.engine.errors import InvalidRequest

        raise InvalidRequest(
            f"structured output has no known grammar kind (got enum {pb.structured.kind})", field="response_format"
        )
    return StructuredSpec(kind, pb.structured.spec, tuple(pb.structured.accepted_token_ids))


def layout_to_pb(layout: KVLayout) -> common_pb2.KVLayout:
    return common_pb2.KVLayout(
        dtype=_DTYPE_TO_PB[layout.dtype],
        page_size=layout.page_size,
        num_layers=layout.num_layers,
        num_kv_heads=layout.num_kv_heads,
        head_dim=layout.head_dim,
    )


def layout_from_pb(pb: common_pb2.KVLayout) -> KVLayout:
    """Raises ValueError on a layout message that names no dtype (a malformed ticket)."""
    if pb.dtype not in _DTYPE_FROM_PB:
        raise ValueError(f"KV layout has no known dtype (got enum {pb.dtype}); the peer sent a malformed layout")
    if min(pb.page_size, pb.num_layers, pb.num_kv_heads, pb.head_dim) <= 0:
        raise ValueError(f"KV layout has a zero dimension: {pb}".replace("\n", " "))
    return KVLayout(
        dtype=_DTYPE_FROM_PB[pb.dtype],
        page_size=pb.page_size,
        num_layers=pb.num_layers,
        num_kv_heads=pb.num_kv_heads,
        head_dim=pb.head_dim,
    )


def sampling_from_pb(pb: common_pb2.SamplingParams) -> SamplingParams:
    """Proto -> engine params; unset optional fields take the engine's (OpenAI's) defaults.

    Validation stays in SamplingParams.validate(), so a bad value gets the same message on every path.
    """
    return SamplingParams(
        max_tokens=pb.max_tokens if pb.HasField("max_tokens") else None,
        min_tokens=pb.min_tokens if pb.HasField("min_tokens") else 0,
        temperature=pb.temperature if pb.HasField("temperature") else 1.0,
        top_p=pb.top_p if pb.HasField("top_p") else 1.0,
        top_k=pb.top_k if pb.HasField("top_k") and pb.top_k > 0 else -1,
        min_p=pb.min_p if pb.HasField("min_p") else 0.0,
        repetition_penalty=pb.repetition_penalty if pb.HasField("repetition_penalty") else 1.0,
        frequency_penalty=pb.frequency_penalty,
        presence_penalty=pb.presence_penalty,
        seed=pb.seed if pb.HasField("seed") else None,
        stop=tuple(pb.stop),
        stop_token_ids=tuple(pb.stop_token_ids),
        ignore_eos=pb.ignore_eos,
        logprobs=(pb.top_logprobs if pb.logprobs else None),
        logit_bias=tuple(sorted(pb.logit_bias.items())),
        n=max(1, pb.n),
        structured=structured_from_pb(pb),
        prompt_logprobs=pb.prompt_logprobs if pb.HasField("prompt_logprobs") else None,
    )


def sampling_to_pb(p: SamplingParams) -> common_pb2.SamplingParams:
    pb = common_pb2.SamplingParams(
        temperature=p.temperature,
        top_p=p.top_p,
        min_p=p.min_p,
        stop=list(p.stop),
        stop_token_ids=list(p.stop_token_ids),
        min_tokens=p.min_tokens,
        ignore_eos=p.ignore_eos,
        logprobs=p.logprobs is not None,
        top_logprobs=p.logprobs or 0,
        presence_penalty=p.presence_penalty,
        frequency_penalty=p.frequency_penalty,
        repetition_penalty=p.repetition_penalty,
    )
    if p.top_k > 0:
        pb.top_k = p.top_k
    if p.max_tokens is not None:
        pb.max_tokens = p.max_tokens
    if p.seed is not None:
        pb.seed = p.seed
    if p.logit_bias:
        pb.logit_bias.update(dict(p.logit_bias))
    if p.n > 1:
        pb.n = p.n
    if p.prompt_logprobs is not None:
        pb.prompt_logprobs = p.prompt_logprobs
    if p.structured is not None:
        pb.structured.CopyFrom(structured_to_pb(p.structured))
    return pb


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
