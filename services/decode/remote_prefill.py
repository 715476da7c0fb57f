"""Decode's side of the KV hand-off: wait for a slot, reserve pages, ticket a prefill instance, verify, then decode.

Each attempt has its own epoch, its own pages and its own deadline (prefill_choice.py: it follows the prompt). A
failed attempt's pages go to quarantine for that deadline (a slow prefill could still be writing into them) before
they are reused, unless the prefill refused the ticket outright (then they are freed at once); the retry reserves
new ones. The first attempt goes to the prefill the gateway chose, unless its breaker is open here or the gateway
saw an older incarnation of it (PrefillTarget.epoch below the epoch in etcd: it restarted, its cache is gone and its
address may be another process's; the current incarnation is asked instead); retries go to other ready prefills.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

import grpc

from proto.pdrelay.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from shared.cluster.grpc_errors import error_from_rpc
from shared.cluster.tls import open_channel
from shared.engine.errors import InvalidRequest
from shared.engine.request import MediaInput, RequestOutput
from shared.engine.sampling_params import SamplingParams
from shared.serving.convert import layout_to_pb, logprob_from_pb, sampling_to_pb
from shared.serving.decode_servicer import HandoffFailed
from services.decode.admission import AdmissionQueue
from services.decode.prefill_choice import PrefillChoice, is_refusal, is_sick
from shared.serving.handoff import EpochClock, accept_response, pages_needed
from shared.telemetry import spans
from shared.telemetry.metrics import CountersCollector, error_label
from shared.telemetry.tracing import SpanKind, add_event, current_span, inject, set_error

if TYPE_CHECKING:
    from services.decode.service import DecodeService

log = logging.getLogger(__name__)


class RemotePrefillClient:
    def __init__(self, svc: DecodeService) -> None:
        self.svc = svc
        self.epochs = EpochClock()
        self._channels: dict[str, grpc.aio.Channel] = {}
        d = svc.cfg.disagg
        self.choice = PrefillChoice(max_timeout_s=d.handoff_timeout_s, min_timeout_s=d.handoff_min_timeout_s)
        self.admission = AdmissionQueue(svc.cfg.scheduler.max_queued_requests)
        self.stale_targets = 0  # gateway choices refused for an older epoch than etcd's
        self.handoffs_ok = 0
        self.handoffs_failed = 0
        self.retries = 0
        svc.telemetry.metrics.registry.register(CountersCollector(self, [
            ("pdrelay:handoffs", "KV hand-offs that delivered a request's prompt KV", "handoffs_ok"),
            ("pdrelay:handoffs_failed", "KV hand-off attempts that failed (each retried or reported)",
             "handoffs_failed"),
            ("pdrelay:handoff_retries", "Hand-off attempts on another prefill after a failed one", "retries"),
            ("pdrelay:handoff_stale_targets", "Prefill choices of the gateway refused for a stale epoch",
             "stale_targets"),
            ("pdrelay:admission_refused", "Requests refused because the waiting queue was full",
             "admission_refused")]))

    @property
    def admission_refused(self) -> int:
        return self.admission.refused

    def wants(self, request: worker_pb2.DecodeRequest) -> bool:
        threshold = self.svc.cfg.disagg.local_prefill_threshold
        if threshold and len(request.prompt_token_ids) < threshold:
            return False  # short prompt: computing it here costs less than a hand-off
        # No prefill target: the gateway chose local prefill here (e.g. no prefill instance was ready).
        if not request.prefill.grpc_address:
            return False
        # Every prefill this decode could ask has an open breaker (hung, corrupting, unreachable): computing the
        # prompt here is slower than a working hand-off but faster than waiting on a sick prefill for a deadline.
        candidates = {request.prefill.instance_id, *(i for i, _ in self._alternates(""))}
        return any(self.choice.breakers.allows(i) for i in candidates)

    def _first_target(self, target: worker_pb2.PrefillTarget) -> tuple[str, str] | None:
        """The gateway's choice, fenced by its epoch: an instance etcd knows with a newer epoch restarted since the
        gateway saw it (the old incarnation is gone); its current incarnation is used when ready, else none."""
        if not target.grpc_address:
            return None
        members = self.svc.prefills
        if members is None or not target.epoch:
            return target.instance_id, target.grpc_address
        current = next((m for m in members.instances("prefill") if m.instance_id == target.instance_id), None)
        if current is None or current.epoch <= target.epoch:
            return target.instance_id, target.grpc_address  # our view may lag the gateway's: trust it
        self.stale_targets += 1
        log.warning("%s: prefill %s epoch %d chosen by the gateway is stale (etcd has epoch %d); refused",
                    self.svc.instance_id, target.instance_id, target.epoch, current.epoch)
        ready = {m.instance_id for m in members.ready("prefill")}
        return (current.instance_id, current.grpc_address) if current.instance_id in ready else None

    def _alternates(self, exclude: str) -> list[tuple[str, str]]:
        members = self.svc.prefills
        if members is None:
            return []
        return [(m.instance_id, m.grpc_address) for m in members.ready("prefill") if m.instance_id != exclude]

    def _stub(self, address: str) -> worker_pb2_grpc.PrefillStub:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = open_channel(address, self.svc.tls)
        return worker_pb2_grpc.PrefillStub(ch)

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()

    async def run(self, request: worker_pb2.DecodeRequest, rid: str, params: SamplingParams,
                  head: worker_pb2.DecodeResponse) -> AsyncIterator[RequestOutput]:
        svc = self.svc
        aengine, transfer = svc.aengine, svc.transfer
        assert aengine is not None and transfer is not None
        engine = aengine.engine
        prompt = list(request.prompt_token_ids)
        if pages_needed(len(prompt), engine.page_size) > engine.runner.num_pages:
            raise InvalidRequest(f"a {len(prompt)}-token prompt needs more KV pages than {svc.instance_id} has "
                                 f"({engine.runner.num_pages} of {engine.page_size} tokens)")
        targets: list[tuple[str, str]] = []
        first = self._first_target(request.prefill)
        if first is not None:
            targets.append(first)
        targets += [t for t in self._alternates(request.prefill.instance_id) if t not in targets]
        targets = self.choice.order(targets)[: 1 + svc.cfg.disagg.handoff_retries]
        tr = svc.telemetry.tracing
        t0 = time.monotonic()
        last_error = "no prefill instance is ready"
        last_code = common_pb2.ERROR_CODE_UNAVAILABLE
        for attempt, (target_id, address) in enumerate(targets):
            if attempt:
                self.retries += 1
                add_event(current_span(), spans.EVENT_RETRY, {
                    spans.ATTEMPT: attempt, spans.PREFILL_INSTANCE: target_id, spans.ERROR_CODE: error_label(last_code),
                    "pdrelay.error.message": last_error})
            t_admit = time.monotonic()
            try:
                res = await self.admission.admit(
                    lambda: aengine.call(lambda: engine.reserve_remote(rid, prompt, params, request.priority,
                                                                       media_spans(request.media))))
            except asyncio.CancelledError:
                aengine.abort(rid)  # queued after the reservation: undoes it if it was made before we left
                raise
            if not attempt:
                head.timings.queue_s = time.monotonic() - t_admit
            tr.record(spans.DECODE_ADMIT, t_admit, time.monotonic(),
                      {spans.PAGES: len(res.page_ids), spans.SKIP_TOKENS: res.skip_tokens})
            epoch = self.epochs.next(svc.epoch)
            computed = len(prompt) - res.skip_tokens
            handoff_try = self.choice.attempt(target_id, computed)
            timeout_s = handoff_try.deadline_s
            ticket = worker_pb2.HandoffTicket(
                request_id=request.request_id, epoch=epoch, decode_instance_id=svc.instance_id,
                decode_instance_epoch=svc.epoch, decode_peer=transfer.peer_pb(),
                pages=transfer.descriptors(res.page_ids[res.skip_tokens // engine.page_size:]),
                layout=layout_to_pb(engine.runner.layout), prompt_token_ids=prompt,
                skip_tokens=res.skip_tokens, sampling=sampling_to_pb(params), trace=request.trace,
                deadline_s=timeout_s, attempt=request.attempt, media=request.media)
            handoff = tr.start_span(spans.DECODE_HANDOFF, kind=SpanKind.CLIENT, attributes={
                spans.PREFILL_INSTANCE: target_id, spans.HANDOFF_EPOCH: epoch, spans.ATTEMPT: attempt,
                spans.SERVER_ADDRESS: address, spans.RPC_SYSTEM: "grpc",
                spans.RPC_METHOD: "pdrelay.v1.Prefill/Prefill"})
            inject(handoff, ticket.trace)  # prefill's spans are children of this call
            transfer.begin_receive()
            activated = False
            refused = False  # the prefill answered that it wrote nothing: no quarantine
            sick = False  # the attempt failed in a way that counts against the prefill's breaker
            t_call = time.monotonic()
            try:
                resp = await self._stub(address).Prefill(ticket, timeout=timeout_s)
                tr.end(handoff)
                why = accept_response(resp, request.request_id, epoch)
                if why is not None:
                    raise HandoffFailed(why, common_pb2.ERROR_CODE_STALE_EPOCH)
                written = list(res.page_ids[res.skip_tokens // engine.page_size:])
                t_verify = time.monotonic()
                mine = await asyncio.to_thread(transfer.checksum, written)
                tr.record(spans.DECODE_VERIFY, t_verify, time.monotonic(),
                          {spans.PAGES: len(written), "pdrelay.checksum.ok": mine == resp.checksum})
                if mine != resp.checksum:
                    raise HandoffFailed(f"checksum of the {len(written)} pages received from {target_id} is "
                                        f"{mine:#x}, prefill wrote {resp.checksum:#x}",
                                        common_pb2.ERROR_CODE_CHECKSUM_MISMATCH)
                lp = logprob_from_pb(resp.first_logprob) if resp.HasField("first_logprob") else None
                activated = True
            except grpc.aio.AioRpcError as e:
                err = error_from_rpc(e)
                last_code = err.code if err is not None else common_pb2.ERROR_CODE_UNAVAILABLE
                refused, sick = is_refusal(last_code, err is not None), is_sick(last_code, err is not None)
                if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    last_code = common_pb2.ERROR_CODE_TIMEOUT
                last_error = (f"prefill {target_id} at {address}: {err.message if err else e.details()}"
                              + (f" (hand-off deadline {timeout_s:.1f} s)" if last_code == common_pb2.ERROR_CODE_TIMEOUT
                                 else ""))
                set_error(handoff, last_error, {spans.ERROR_CODE: error_label(last_code)})
                if last_code == common_pb2.ERROR_CODE_INVALID_ARGUMENT:
                    await aengine.call(lambda: engine.cancel_remote(rid, 0.0))
                    raise InvalidRequest(last_error) from None
            except HandoffFailed as e:
                last_code, last_error, sick = e.code, f"prefill {target_id}: {e}", True
            finally:
                tr.end(handoff)  # when the call failed (no-op when it already ended)
                transfer.end_receive()
                self.choice.done(handoff_try, time.monotonic() - t_call, ok=activated, sick=sick)
                if not activated:
                    # The prefill may still be writing (timeout, cancellation): quarantine, do not reuse yet. One
                    # that refused the ticket wrote nothing: its pages are free at once.
                    quarantine_s = 0.0 if refused else timeout_s + 1.0
                    await asyncio.shield(aengine.call(lambda: engine.cancel_remote(rid, quarantine_s)))
                    self.admission.freed()
            if activated:
                self.handoffs_ok += 1
                head.timings.prefill_s = time.monotonic() - t0
                head.timings.transfer_s = resp.timings.transfer_s
                head.prefill_instance_id = resp.prefill_instance_id or target_id
                first_token = resp.first_token_id
                n = 0
                t_activate = time.monotonic()
                try:
                    async for out in aengine.stream(rid, lambda: engine.activate_remote(rid, first_token, lp),
                                                    n=params.n):
                        if not n:
                            tr.record(spans.DECODE_FIRST_TOKEN, t_activate, time.monotonic())
                        yield out
                        n += 1
                        if n == 2:
                            svc.faults.crash_if("decode_crash_mid_stream")
                finally:
                    self.admission.freed()  # its slot and pages: the next waiting request may fit now
                return
            self.handoffs_failed += 1
            log.warning("%s: hand-off of %s failed (attempt %d): %s", svc.instance_id, rid, attempt + 1, last_error)
        raise HandoffFailed(f"prompt KV of {request.request_id} not obtained after {len(targets)} attempt(s): "
                            f"{last_error}", last_code)


def media_spans(media: Sequence[common_pb2.MediaInput]) -> list[MediaInput]:
    """Placeholder spans and hashes only: decode hashes image pages like prefill, it never embeds them."""
    return [MediaInput(m.token_offset, m.num_tokens, m.media_hash) for m in media]
