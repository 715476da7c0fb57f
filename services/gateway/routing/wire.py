"""Gateway backend types <-> the worker API (proto pdrelay.v1 Decode.Generate). Pure functions.

Replay: when a stream breaks after some tokens were sent to the client, the next attempt continues it. Its prompt is
the original prompt followed by the tokens already streamed, max_tokens / min_tokens shrink by what was sent, and
the client sees one continuous stream. Greedy output is identical to an unbroken run; seeded sampling restarts
its generator on the new context, and frequency/presence penalties no longer see the replayed tokens as output.
"""

from __future__ import annotations

from collections.abc import Sequence

from proto.pdrelay.v1 import common_pb2, worker_pb2
from services.gateway.backend import BackendChunk, BackendRequest, FinishReason, TokenLogprob, TopLogprob
from services.gateway.routing.views import RoutePlan
from shared.cluster.sampling_pb import sampling_to_pb

_FINISH: dict[int, FinishReason] = {
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_LENGTH: "length",
    common_pb2.FINISH_REASON_ABORT: "abort",
}


def decode_request(req: BackendRequest, plan: RoutePlan, sent: Sequence[int], attempt: int) -> worker_pb2.DecodeRequest:
    """Attempt number `attempt` of `req` on `plan`, continuing after the `sent` tokens."""
    msg = worker_pb2.DecodeRequest(
        request_id=req.request_id,
        prompt_token_ids=[*req.prompt_token_ids, *sent],
        sampling=sampling_to_pb(req.sampling, len(sent), sent),
        model=req.model,
        attempt=attempt,
        priority=req.priority,
    )
    if plan.prefill is not None:
        p = plan.prefill
        msg.prefill.CopyFrom(
            worker_pb2.PrefillTarget(instance_id=p.instance_id, grpc_address=p.grpc_address, epoch=p.epoch)
        )
    msg.media.extend(
        common_pb2.MediaInput(
            media_hash=m.media_hash, mime_type=m.mime_type, data=m.data, token_offset=m.offset, num_tokens=m.num_tokens
        )
        for m in req.media
    )
    trace = dict(req.trace_headers)
    if "traceparent" in trace:
        msg.trace.CopyFrom(
            common_pb2.TraceContext(traceparent=trace["traceparent"], tracestate=trace.get("tracestate", ""))
        )
    return msg


def logprobs_from_pb(entries: Sequence[common_pb2.TokenLogprob]) -> tuple[TokenLogprob, ...]:
    return tuple(
        TokenLogprob(e.token_id, e.logprob, tuple(TopLogprob(t.token_id, t.logprob) for t in e.top_logprobs), e.rank)
        for e in entries
    )


def stop_reason_of(resp: worker_pb2.DecodeResponse) -> int | str | None:
    if not resp.HasField("matched_stop"):
        return None
    which = resp.matched_stop.WhichOneof("what")
    if which == "token_id":
        return int(resp.matched_stop.token_id)
    if which == "text":
        return str(resp.matched_stop.text)
    return None


def chunk_from_pb(
    resp: worker_pb2.DecodeResponse, *, want_logprobs: bool, num_prompt_tokens: int, first: bool
) -> BackendChunk:
    """One worker message -> one backend chunk. Usage is reported against the client's original prompt (a replayed
    attempt's prompt includes the tokens streamed before it)."""
    finish = _FINISH.get(resp.finish_reason)
    cached: int | None = None
    if finish is not None and resp.HasField("usage"):
        cached = min(resp.usage.cached_tokens, num_prompt_tokens)
    return BackendChunk(
        token_ids=tuple(resp.token_ids),
        logprobs=logprobs_from_pb(resp.logprobs) if want_logprobs else None,
        finish_reason=finish,
        stop_reason=stop_reason_of(resp) if finish == "stop" else None,
        num_prompt_tokens=num_prompt_tokens if first or finish is not None else None,
        num_cached_tokens=cached,
        index=resp.index,
        prompt_logprobs=logprobs_from_pb(resp.prompt_logprobs) if resp.prompt_logprobs else None,
    )
