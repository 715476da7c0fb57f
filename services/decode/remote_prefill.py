"""Decode's side of the KV hand-off: wait for a slot, reserve pages, ticket a prefill instance, verify, then decode.

The hand-off retry (`RemotePrefillClient.run`): one hand-off tries the prefills prefill_targets.py orders (the
gateway's choice first, fenced by epoch, then others, 1 + --handoff-retries in all). Each attempt has its own
epoch, its own pages and its own deadline (prefill_choice.py: it follows the prompt), and its call is watched
(prefill_call.py). A failed attempt's pages go to quarantine for that deadline (a slow prefill could still be
writing into them) before they are reused, unless the prefill refused the ticket outright (then they are freed at
once); the retry reserves new ones. When every attempt failed, the gateway's retry loop re-chooses the pair
(services/gateway/backends/retry_loop.py); docs/architecture.md, "Where retries and fencing live", has both.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace

import grpc

from proto.pdrelay.v1 import common_pb2, worker_pb2
from services.decode.admission import AdmissionQueue
from services.decode.liveness import PrefillSilent
from services.decode.prefill_call import PrefillCaller
from services.decode.prefill_choice import PrefillChoice, is_refusal, is_sick
from services.decode.prefill_targets import PrefillTargets
from shared.cluster.grpc_errors import error_from_rpc
from shared.cluster.membership import Membership
from shared.cluster.sampling_pb import sampling_to_pb
from shared.cluster.tls import TlsFiles
from shared.config.choices import Fault
from shared.config.groups import DisaggConfig
from shared.engine.async_engine import AsyncEngine
from shared.engine.errors import InvalidRequest, RequestFailed
from shared.engine.request import MediaInput, RequestOutput, TokenLogprobs
from shared.engine.scheduler.handoff_pages import Reservation
from shared.modelspec.sampling import SamplingParams
from shared.service.faults import Faults
from shared.serving.convert import layout_to_pb, logprob_from_pb
from shared.serving.decode_servicer import HandoffFailed
from shared.serving.handoff import EpochClock, accept_response, checksums_to_pb, pages_needed
from shared.serving.kv_transfer import KVTransfer
from shared.telemetry import spans
from shared.telemetry.metrics import CountersCollector, error_label
from shared.telemetry.service import ServiceTelemetry
from shared.telemetry.tracing import SpanKind, add_event, current_span, inject, set_error
from shared.transfer.checksum import PageChecksum

log = logging.getLogger(__name__)


@dataclass
class _Failure:
    """The last failed attempt of a hand-off (what the final error reports)."""

    code: int = common_pb2.ERROR_CODE_UNAVAILABLE
    message: str = "no prefill instance is ready"


@dataclass(frozen=True)
class _Delivered:
    """A verified hand-off: the prompt KV is in decode's pages; what activating the request needs."""

    resp: worker_pb2.PrefillResponse
    first_logprob: TokenLogprobs | None
    prompt_logprobs: tuple[TokenLogprobs, ...]
    written: tuple[int, ...]  # the pages the prefill wrote (past the prefix this decode held)


class RemotePrefillClient:
    """Decode's hand-off client. Built with the service (its servicer and load reports use it at once); the engine,
    the transfer engine and the prefill membership exist only after warm-up and are handed over by attach()."""

    def __init__(
        self,
        *,
        instance_id: str,
        disagg: DisaggConfig,
        admission: AdmissionQueue,
        telemetry: ServiceTelemetry,
        faults: Faults,
    ) -> None:
        self.instance_id = instance_id
        self.disagg = disagg
        self.admission = admission
        self.telemetry = telemetry
        self.faults = faults
        self.epochs = EpochClock()
        self.choice = PrefillChoice(max_timeout_s=disagg.handoff_timeout_s, min_timeout_s=disagg.handoff_min_timeout_s)
        self.targets = PrefillTargets(instance_id, self.choice, disagg.handoff_retries)
        self.caller = PrefillCaller(disagg.handoff_min_timeout_s)
        self.aengine: AsyncEngine | None = None
        self.transfer: KVTransfer | None = None
        self._instance_epoch: Callable[[], int] = lambda: 0
        self.handoffs_ok = 0
        self.handoffs_failed = 0
        self.retries = 0
        telemetry.metrics.registry.register(
            CountersCollector(
                self,
                [
                    ("pdrelay:handoffs", "KV hand-offs that delivered a request's prompt KV", "handoffs_ok"),
                    (
                        "pdrelay:handoffs_failed",
                        "KV hand-off attempts that failed (each retried or reported)",
                        "handoffs_failed",
                    ),
                    ("pdrelay:handoff_retries", "Hand-off attempts on another prefill after a failed one", "retries"),
                    (
                        "pdrelay:handoff_stale_targets",
                        "Prefill choices of the gateway refused for a stale epoch",
                        "stale_targets",
                    ),
                    (
                        "pdrelay:admission_refused",
                        "Requests refused because the waiting queue was full",
                        "admission_refused",
                    ),
                ],
            )
        )

    def attach(
        self,
        *,
        aengine: AsyncEngine,
        transfer: KVTransfer,
        prefills: Membership,
        tls: TlsFiles | None,
        instance_epoch: Callable[[], int],
    ) -> None:
        """What exists once the service warmed up: its engine, transfer engine over the KV pool, the prefill
        membership, the cluster's TLS identity and its registration epoch (a new one after a lost lease)."""
        self.aengine, self.transfer = aengine, transfer
        self.targets.members, self.caller.tls = prefills, tls
        self._instance_epoch = instance_epoch

    @property
    def admission_refused(self) -> int:
        return self.admission.refused

    @property
    def stale_targets(self) -> int:
        return self.targets.stale

    def wants(self, request: worker_pb2.DecodeRequest) -> bool:
        threshold = self.disagg.local_prefill_threshold
        if threshold and len(request.prompt_token_ids) < threshold:
            return False  # short prompt: computing it here costs less than a hand-off
        # No prefill target: the gateway chose local prefill here (e.g. no prefill instance was ready).
        if not request.prefill.grpc_address:
            return False
        # Every prefill this decode could ask has an open breaker (hung, corrupting, unreachable): computing the
        # prompt here is slower than a working hand-off but faster than waiting on a sick prefill for a deadline.
        candidates = {request.prefill.instance_id, *(i for i, _ in self.targets.alternates(""))}
        return any(self.choice.breakers.allows(i) for i in candidates)

    async def close(self) -> None:
        await self.caller.close()

    async def run(
        self, request: worker_pb2.DecodeRequest, rid: str, params: SamplingParams, head: worker_pb2.DecodeResponse
    ) -> AsyncIterator[RequestOutput]:
        """The hand-off retry: hand the prompt to a prefill, retrying on the others in order (see the module
        docstring) until one delivers its KV, then stream the request's deltas from the batch. HandoffFailed when
        none did; InvalidRequest / RequestFailed when a prefill refused the request itself (no other would take
        it)."""
        aengine = self.aengine
        assert aengine is not None and self.transfer is not None, "run() before attach()"
        engine = aengine.engine
        prompt = list(request.prompt_token_ids)
        if pages_needed(len(prompt), engine.page_size) > engine.runner.num_pages:
            raise InvalidRequest(
                f"a {len(prompt)}-token prompt needs more KV pages than {self.instance_id} has "
                f"({engine.runner.num_pages} of {engine.page_size} tokens)"
            )
        targets = self.targets.order(request.prefill)
        t0 = time.monotonic()
        failure = _Failure()
        for attempt, (target_id, address) in enumerate(targets):
            if attempt:
                self.retries += 1
                add_event(
                    current_span(),
                    spans.EVENT_RETRY,
                    {
                        spans.ATTEMPT: attempt,
                        spans.PREFILL_INSTANCE: target_id,
                        spans.ERROR_CODE: error_label(failure.code),
                        "pdrelay.error.message": failure.message,
                    },
                )
            res, t_slot = await self._reserve(request, rid, prompt, params, head if not attempt else None)
            delivered = await self._hand_off(request, rid, prompt, params, res, target_id, address, attempt, failure)
            if delivered is not None:
                self.handoffs_ok += 1
                head.timings.prefill_s = time.monotonic() - t0
                head.timings.transfer_s = delivered.resp.timings.transfer_s
                head.prefill_instance_id = delivered.resp.prefill_instance_id or target_id
                async for out in self._decode(rid, params, delivered, t_slot):
                    yield out
                return
            self.handoffs_failed += 1
            log.warning(
                "%s: hand-off of %s failed (attempt %d): %s", self.instance_id, rid, attempt + 1, failure.message
            )
        raise HandoffFailed(
            f"prompt KV of {request.request_id} not obtained after {len(targets)} attempt(s): {failure.message}",
            failure.code,
        )

    async def _reserve(
        self,
        request: worker_pb2.DecodeRequest,
        rid: str,
        prompt: list[int],
        params: SamplingParams,
        head: worker_pb2.DecodeResponse | None,
    ) -> tuple[Reservation, float]:
        """Wait for a slot and reserve the prompt's pages; (the reservation, when the slot was obtained). head: the
        first attempt's, which reports the time spent queued."""
        aengine = self.aengine
        assert aengine is not None
        engine = aengine.engine
        t_admit = time.monotonic()
        try:
            res = await self.admission.admit(
                lambda: aengine.call(
                    lambda: engine.reserve_remote(rid, prompt, params, request.priority, media_spans(request.media))
                )
            )
        except asyncio.CancelledError:
            aengine.abort(rid)  # queued after the reservation: undoes it if it was made before we left
            raise
        if head is not None:
            head.timings.queue_s = time.monotonic() - t_admit
        t_slot = time.monotonic()
        self.telemetry.tracing.record(
            spans.DECODE_ADMIT,
            t_admit,
            time.monotonic(),
            {spans.PAGES: len(res.page_ids), spans.SKIP_TOKENS: res.skip_tokens},
        )
        return res, t_slot

    def _ticket(
        self,
        request: worker_pb2.DecodeRequest,
        prompt: list[int],
        params: SamplingParams,
        res: Reservation,
        epoch: int,
        deadline_s: float,
    ) -> worker_pb2.HandoffTicket:
        """What the prefill needs: the prompt, where to write (our pages past the cached prefix) and how."""
        assert self.aengine is not None and self.transfer is not None
        engine, transfer = self.aengine.engine, self.transfer
        return worker_pb2.HandoffTicket(
            request_id=request.request_id,
            epoch=epoch,
            decode_instance_id=self.instance_id,
            decode_instance_epoch=self._instance_epoch(),
            decode_peer=transfer.peer_pb(),
            pages=transfer.descriptors(res.page_ids[res.skip_tokens // engine.page_size :]),
            layout=layout_to_pb(engine.runner.layout),
            prompt_token_ids=prompt,
            skip_tokens=res.skip_tokens,
            sampling=sampling_to_pb(params),
            trace=request.trace,
            deadline_s=deadline_s,
            attempt=request.attempt,
            media=request.media,
            checksums=checksums_to_pb(transfer.checksums),
        )

    async def _hand_off(
        self,
        request: worker_pb2.DecodeRequest,
        rid: str,
        prompt: list[int],
        params: SamplingParams,
        res: Reservation,
        target_id: str,
        address: str,
        attempt: int,
        failure: _Failure,
    ) -> _Delivered | None:
        """One attempt: ticket the prefill, wait for its answer, verify what it wrote. None when it failed (failure
        says why; the pages are quarantined or freed); InvalidRequest when the prefill refused the request as
        invalid (no other prefill would take it)."""
        aengine, transfer = self.aengine, self.transfer
        assert aengine is not None and transfer is not None
        engine = aengine.engine
        tr = self.telemetry.tracing
        epoch = self.epochs.next(self._instance_epoch())
        handoff_try = self.choice.attempt(target_id, len(prompt) - res.skip_tokens)
        timeout_s = handoff_try.deadline_s
        ticket = self._ticket(request, prompt, params, res, epoch, timeout_s)
        handoff = tr.start_span(
            spans.DECODE_HANDOFF,
            kind=SpanKind.CLIENT,
            attributes={
                spans.PREFILL_INSTANCE: target_id,
                spans.HANDOFF_EPOCH: epoch,
                spans.ATTEMPT: attempt,
                spans.SERVER_ADDRESS: address,
                spans.RPC_SYSTEM: "grpc",
                spans.RPC_METHOD: "pdrelay.v1.Prefill/Prefill",
            },
        )
        inject(handoff, ticket.trace)  # prefill's spans are children of this call
        transfer.begin_receive()
        delivered: _Delivered | None = None
        refused = False  # the prefill answered that it wrote nothing: no quarantine
        sick = False  # the attempt failed in a way that counts against the prefill's breaker
        silent = False  # the prefill stopped answering health probes: its breaker opens at once
        t_call = time.monotonic()
        try:
            resp = await self.caller.call(address, target_id, ticket, timeout_s)
            tr.end(handoff)
            await self._verify(resp, request.request_id, epoch, res, target_id)
            lp = logprob_from_pb(resp.first_logprob) if resp.HasField("first_logprob") else None
            written = tuple(res.page_ids[res.skip_tokens // engine.page_size :])
            delivered = _Delivered(resp, lp, tuple(logprob_from_pb(x) for x in resp.prompt_logprobs), written)
        except grpc.aio.AioRpcError as e:
            err = error_from_rpc(e)
            failure.code = err.code if err is not None else common_pb2.ERROR_CODE_UNAVAILABLE
            refused, sick = is_refusal(failure.code, err is not None), is_sick(failure.code, err is not None)
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                failure.code = common_pb2.ERROR_CODE_TIMEOUT
            failure.message = f"prefill {target_id} at {address}: {err.message if err else e.details()}" + (
                f" (hand-off deadline {timeout_s:.1f} s)" if failure.code == common_pb2.ERROR_CODE_TIMEOUT else ""
            )
            set_error(handoff, failure.message, {spans.ERROR_CODE: error_label(failure.code)})
            if failure.code == common_pb2.ERROR_CODE_INVALID_ARGUMENT:
                await aengine.call(lambda: engine.cancel_remote(rid, 0.0))
                raise InvalidRequest(failure.message) from None
            if failure.code == common_pb2.ERROR_CODE_REQUEST_FAILED:  # it would fail the same way on any prefill
                await aengine.call(lambda: engine.cancel_remote(rid, 0.0))
                raise RequestFailed(failure.message) from None
        except HandoffFailed as e:
            failure.code, failure.message, sick = e.code, f"prefill {target_id}: {e}", True
            silent = isinstance(e, PrefillSilent)
        finally:
            tr.end(handoff)  # when the call failed (no-op when it already ended)
            transfer.end_receive()
            ok = delivered is not None
            self.choice.done(handoff_try, time.monotonic() - t_call, ok=ok, sick=sick, silent=silent)
            if not ok:
                # The prefill may still be writing (timeout, cancellation): quarantine, do not reuse yet. One
                # that refused the ticket wrote nothing: its pages are free at once.
                quarantine_s = 0.0 if refused else timeout_s + 1.0
                await asyncio.shield(aengine.call(lambda: engine.cancel_remote(rid, quarantine_s)))
                self.admission.freed()
        return delivered

    async def _verify(
        self, resp: worker_pb2.PrefillResponse, request_id: str, epoch: int, res: Reservation, target_id: str
    ) -> None:
        """The answer is this attempt's, and the pages hold what the prefill says it wrote (HandoffFailed if not)."""
        assert self.aengine is not None and self.transfer is not None
        why = accept_response(resp, request_id, epoch)
        if why is not None:
            raise HandoffFailed(why, common_pb2.ERROR_CODE_STALE_EPOCH)
        written = list(res.page_ids[res.skip_tokens // self.aengine.engine.page_size :])
        t_verify = time.monotonic()
        try:
            algorithm = PageChecksum(resp.checksum_algorithm)
        except ValueError:
            raise HandoffFailed(
                f"prefill {target_id} summed the pages with checksum algorithm {resp.checksum_algorithm}, "
                "which this decode does not know",
                common_pb2.ERROR_CODE_CHECKSUM_MISMATCH,
            ) from None
        mine = await asyncio.to_thread(self.transfer.checksum, written, algorithm)
        self.telemetry.tracing.record(
            spans.DECODE_VERIFY,
            t_verify,
            time.monotonic(),
            {spans.PAGES: len(written), "pdrelay.checksum.ok": mine == resp.checksum},
        )
        if mine != resp.checksum:
            raise HandoffFailed(
                f"checksum of the {len(written)} pages received from {target_id} is "
                f"{mine:#x}, prefill wrote {resp.checksum:#x}",
                common_pb2.ERROR_CODE_CHECKSUM_MISMATCH,
            )

    async def _decode(
        self, rid: str, params: SamplingParams, delivered: _Delivered, t_slot: float
    ) -> AsyncIterator[RequestOutput]:
        """Activate the request with its first token and stream its deltas from the running batch."""
        aengine = self.aengine
        assert aengine is not None
        engine = aengine.engine
        first_token, lp, plps = delivered.resp.first_token_id, delivered.first_logprob, delivered.prompt_logprobs
        n = 0
        t_activate = time.monotonic()
        try:
            # the pages the prefill wrote reach the model first (its ranks' pools at --tp-size > 1)
            received = delivered.written
            async for out in aengine.stream(
                rid, lambda: engine.activate_remote(rid, first_token, lp, plps, received), n=params.n
            ):
                if not n:
                    self.telemetry.tracing.record(spans.DECODE_FIRST_TOKEN, t_activate, time.monotonic())
                if out.finished:  # usage: the prompt tokens prefill did not compute (its prefix cache, the kvstore)
                    out = replace(out, num_cached_tokens=min(delivered.resp.cached_tokens, out.num_prompt_tokens))
                yield out
                n += 1
                if n == 2:
                    self.faults.crash_if(Fault.DECODE_CRASH_MID_STREAM)
        finally:
            # its slot and pages: the next waiting request may fit now (and how long it held them)
            self.admission.freed(time.monotonic() - t_slot)


def media_spans(media: Sequence[common_pb2.MediaInput]) -> list[MediaInput]:
    """Placeholder spans and hashes only: decode hashes image pages like prefill, it never embeds them."""
    return [MediaInput(m.token_offset, m.num_tokens, m.media_hash) for m in media]
