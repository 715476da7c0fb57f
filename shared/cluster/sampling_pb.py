"""Sampling parameters on the wire: SamplingParams (shared/modelspec/sampling.py) <-> proto pdrelay.v1.SamplingParams,
one pair of functions for every hop (gateway -> decode or worker, decode -> prefill in the hand-off ticket)."""

from __future__ import annotations

from collections.abc import Sequence

from proto.pdrelay.v1 import common_pb2
from shared.grammar.spec import GrammarKind, StructuredSpec
from shared.modelspec.errors import InvalidRequest
from shared.modelspec.sampling import SamplingParams

_GRAMMAR_TO_PB = {
    GrammarKind.JSON_OBJECT: common_pb2.GRAMMAR_KIND_JSON_OBJECT,
    GrammarKind.JSON_SCHEMA: common_pb2.GRAMMAR_KIND_JSON_SCHEMA,
    GrammarKind.REGEX: common_pb2.GRAMMAR_KIND_REGEX,
    GrammarKind.CHOICE: common_pb2.GRAMMAR_KIND_CHOICE,
    GrammarKind.GRAMMAR: common_pb2.GRAMMAR_KIND_GRAMMAR,
}
_GRAMMAR_FROM_PB = {v: k for k, v in _GRAMMAR_TO_PB.items()}


def remaining_max_tokens(sp: SamplingParams, num_sent: int) -> int | None:
    """max_tokens left after `num_sent` output tokens (None: until the context is full)."""
    return None if sp.max_tokens is None else max(0, sp.max_tokens - num_sent)


def sampling_to_pb(sp: SamplingParams, num_sent: int = 0, sent_ids: Sequence[int] = ()) -> common_pb2.SamplingParams:
    """The parameters on the wire. A replay (the gateway continuing a broken stream on another instance) passes the
    `num_sent` output tokens already streamed, `sent_ids`: max_tokens and min_tokens shrink by as many, a grammar's
    matcher first consumes them, and the prompt logprobs (already sent) are not asked for again."""
    pb = common_pb2.SamplingParams(
        temperature=sp.temperature,
        top_p=sp.top_p,
        min_p=sp.min_p,
        stop=list(sp.stop),
        stop_token_ids=list(sp.stop_token_ids),
        min_tokens=max(0, sp.min_tokens - num_sent),
        ignore_eos=sp.ignore_eos,
        logprobs=sp.logprobs is not None,
        top_logprobs=sp.logprobs or 0,
        presence_penalty=sp.presence_penalty,
        frequency_penalty=sp.frequency_penalty,
        repetition_penalty=sp.repetition_penalty,
    )
    if sp.top_k > 0:
        pb.top_k = sp.top_k
    max_tokens = remaining_max_tokens(sp, num_sent)
    if max_tokens is not None:
        pb.max_tokens = max_tokens
    if sp.seed is not None:
        pb.seed = sp.seed
    if sp.logit_bias:
        pb.logit_bias.update(dict(sp.logit_bias))
    if sp.prompt_logprobs is not None and not num_sent:
        pb.prompt_logprobs = sp.prompt_logprobs
    if sp.structured is not None:
        st = sp.structured
        pb.structured.CopyFrom(
            common_pb2.StructuredOutput(
                kind=_GRAMMAR_TO_PB[st.kind], spec=st.spec, accepted_token_ids=[*st.accepted, *sent_ids]
            )
        )
    if sp.n > 1:
        pb.n = sp.n
    return pb


def structured_from_pb(pb: common_pb2.SamplingParams) -> StructuredSpec | None:
    if not pb.HasField("structured"):
        return None
    kind = _GRAMMAR_FROM_PB.get(pb.structured.kind)
    if kind is None:
        raise InvalidRequest(
            f"structured output has no known grammar kind (got enum {pb.structured.kind})", field="response_format"
        )
    return StructuredSpec(kind, pb.structured.spec, tuple(pb.structured.accepted_token_ids))


def sampling_from_pb(pb: common_pb2.SamplingParams) -> SamplingParams:
    """Proto -> params; unset optional fields take OpenAI's defaults. Validation stays in SamplingParams.validate(),
    so a bad value gets the same message on every path."""
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
