"""The prefill service: computes prompt KV (reusing its prefix cache) and writes it straight into decode's pages.

Prefill(ticket) is one hand-off: check the layout and the epoch (fencing), run the prompt through the engine with
its pages held after the first token, write those pages into the pages the ticket names, checksum them, release
them, answer. If decode disappears meanwhile (the RPC is cancelled), the engine request is aborted and its pages
are released; nothing stays held.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from proto.pdrelay.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from services.prefill.observe import observe_handoff
from shared.cluster.grpc_errors import abort
from shared.cluster.sampling_pb import sampling_from_pb
from shared.config.choices import Fault
from shared.config.roles import Role
from shared.engine.engine import Engine
from shared.engine.errors import EngineError, InvalidRequest, QueueFull, RequestFailed
from shared.engine.request import MediaInput, RequestOutput
from shared.engine.sampler.sampler import poison_marks
from shared.modelspec.sampling import SamplingParams
from shared.service.faults import Faults
from shared.serving.convert import BACKEND_FROM_PB, layout_from_pb, logprob_to_pb
from shared.serving.decode_servicer import local_media
from shared.serving.engine_service import EngineService
from shared.serving.handoff import (
    COMPUTED_KEY,
    Fence,
    FencingLedger,
    choose_checksum,
    descs_from_pb,
    pages_needed,
)
from shared.serving.kv_transfer import KVTransfer, transfer_options
from shared.serving.kvstore_attach import attach_kvstore
from shared.serving.kvstore_client import KVStoreClient
from shared.serving.remote_media import RemoteVision
from shared.telemetry import spans
from shared.transfer.checksum import PageChecksum
from shared.transfer.descs import PageDesc
from shared.transfer.errors import TransferError

log = logging.getLogger(__name__)


class PrefillService(EngineService):
    role = Role.PREFILL

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.transfer: KVTransfer | None = None
        self.kvstore: KVStoreClient | None = None
        self.remote_vision: RemoteVision | None = None
        self.ledger = FencingLedger()
        self.faults = Faults(self.cfg.disagg.fault_injection, self.instance_id)
        self.pages_written = 0
        self.bytes_written = 0
        self.telemetry.metrics.prefill  # noqa: B018 - queue / compute / transfer metrics exist (at zero) before the first hand-off

    def add_servicers(self, server: grpc.aio.Server) -> Sequence[str]:
        worker_pb2_grpc.add_PrefillServicer_to_server(PrefillServicer(self), server)
        return ("pdrelay.v1.Prefill",)

    async def after_engine(self) -> None:
        assert self.engine is not None
        t = self.cfg.transfer
        self.transfer = await asyncio.to_thread(
            KVTransfer,
            t.transfer_backend,
            self.instance_id,
            t.transfer_host,
            self.engine.runner.kv,
            transfer_options(t),
        )
        self.kvstore = await attach_kvstore(self, self.transfer)
        if self.vision is not None:  # a vision-language model: encoders write image embeddings into an arena here
            # a third of the hand-off deadline: an encoder that hangs leaves time to encode here instead
            self.remote_vision = RemoteVision(
                self.transfer,
                self.vision,
                timeout_s=self.cfg.disagg.handoff_timeout_s / 3,
                tracing=self.telemetry.tracing,
                tls=self.tls,
            )
            self.transfer.start_progress()

    def describe(self) -> dict:
        d = super().describe()
        d["transfer_backend"] = self.cfg.transfer.transfer_backend
        return d

    async def on_stop(self) -> None:
        if self.kvstore is not None:
            await self.kvstore.drain()
            await self.kvstore.close()
        await super().on_stop()
        if self.remote_vision is not None:
            await self.remote_vision.close()
        if self.transfer is not None:
            await self.transfer.close()


@dataclass(frozen=True)
class _Job:
    """A checked ticket: what one hand-off computes and where it writes."""

    ticket: worker_pb2.HandoffTicket
    prompt: list[int]
    params: SamplingParams
    dst: list[PageDesc]  # decode's pages, past the prefix it already holds
    skip_pages: int
    n_pages: int
    t_start: float  # monotonic: when the call arrived
    deadline: float  # monotonic: the ticket's deadline (or --handoff-timeout-s) from t_start
    checksum: PageChecksum  # negotiated when the ticket arrived: the first of decode's offer this side runs


@dataclass(frozen=True)
class _Sent:
    """The pages written into decode's and their checksum (monotonic times: compute done, write done)."""

    pages: int
    nbytes: int
    algorithm: PageChecksum
    checksum: int
    t_computed: float
    t_sent: float


class PrefillServicer(worker_pb2_grpc.PrefillServicer):
    def __init__(self, svc: PrefillService) -> None:
        self.svc = svc

    async def Prefill(
        self, ticket: worker_pb2.HandoffTicket, context: grpc.aio.ServicerContext
    ) -> worker_pb2.PrefillResponse:
        """`_prefill`, observed: the prefill.handoff span (a child of decode's hand-off call, from ticket.trace),
        errors by code, the request id in the logs."""
        svc = self.svc
        attrs = {
            spans.HANDOFF_EPOCH: ticket.epoch,
            spans.DECODE_INSTANCE: ticket.decode_instance_id,
            spans.ATTEMPT: ticket.attempt,
            spans.EPOCH: svc.epoch,
            spans.PROMPT_TOKENS: len(ticket.prompt_token_ids),
            spans.SKIP_TOKENS: ticket.skip_tokens,
        }
        with svc.telemetry.server_rpc(spans.PREFILL_HANDOFF, ticket.trace, context, ticket.request_id, attrs) as rpc:
            resp = await self._prefill(ticket, context)
            if rpc.span is not None and rpc.span.is_recording():
                rpc.span.set_attributes(
                    {
                        spans.CACHED_TOKENS: resp.cached_tokens,
                        spans.COMPUTED_TOKENS: resp.computed_tokens,
                        spans.TRANSFER_PAGES: resp.pages_written,
                        spans.TRANSFER_BYTES: resp.bytes_written,
                    }
                )
            return resp

    async def _prefill(
        self, ticket: worker_pb2.HandoffTicket, context: grpc.aio.ServicerContext
    ) -> worker_pb2.PrefillResponse:
        """Check the ticket, fence it by epoch, run it (or answer a replay as before)."""
        svc = self.svc
        me = svc.instance_id
        aengine, transfer = svc.aengine, svc.transfer
        if aengine is None or transfer is None:
            await abort(context, common_pb2.ERROR_CODE_UNAVAILABLE, f"{me} is still warming up; retry", instance_id=me)
        assert aengine is not None and transfer is not None
        job = await self._check(ticket, time.monotonic(), aengine.engine, transfer, context)
        # ---- fencing -------------------------------------------------------------------------------------------
        # Epochs are ordered per owner: each decode numbers its own hand-offs, so a request retried on another
        # decode (gateway failover) is a new transaction, not a stale one.
        owner_key = f"{ticket.decode_instance_id}/{ticket.request_id}"
        state, cached = svc.ledger.check(owner_key, ticket.epoch)
        if state is Fence.STALE:
            await abort(
                context,
                common_pb2.ERROR_CODE_STALE_EPOCH,
                f"ticket epoch {ticket.epoch} of {ticket.request_id} is older than one already seen; refused",
                instance_id=me,
            )
        if state is Fence.BUSY:
            await abort(
                context,
                common_pb2.ERROR_CODE_OVERLOADED,
                f"hand-off {ticket.request_id} epoch {ticket.epoch} is already running here; retry later",
                instance_id=me,
            )
        if state is Fence.REPLAY:
            assert cached is not None
            return cached
        svc.ledger.begin(owner_key, ticket.epoch)
        response: worker_pb2.PrefillResponse | None = None
        try:
            response = await self._run(job, context)
            return response
        finally:
            svc.ledger.finish(owner_key, ticket.epoch, response)

    async def _check(
        self,
        ticket: worker_pb2.HandoffTicket,
        t_start: float,
        engine: Engine,
        transfer: KVTransfer,
        context: grpc.aio.ServicerContext,
    ) -> _Job:
        """The ticket as a job, or the call aborted: malformed -> INVALID_ARGUMENT, incompatible -> LAYOUT_MISMATCH."""
        me = self.svc.instance_id

        async def fail(code: int, msg: str) -> None:
            await abort(context, code, msg, instance_id=me)

        if not ticket.request_id or not ticket.prompt_token_ids:
            await fail(common_pb2.ERROR_CODE_INVALID_ARGUMENT, "ticket needs a request_id and prompt tokens")
        want_backend = BACKEND_FROM_PB.get(ticket.decode_peer.backend)
        if want_backend != transfer.backend:
            await fail(
                common_pb2.ERROR_CODE_LAYOUT_MISMATCH,
                f"decode uses transfer backend {want_backend or 'unspecified'!r} but {me} uses "
                f"{transfer.backend!r}; run both with the same --transfer-backend",
            )
        try:
            layout = layout_from_pb(ticket.layout)
        except ValueError as e:
            await fail(common_pb2.ERROR_CODE_INVALID_ARGUMENT, f"malformed ticket: {e}")
        mine = engine.runner.layout
        if not mine.compatible_with(layout):
            await fail(
                common_pb2.ERROR_CODE_LAYOUT_MISMATCH,
                f"decode's KV layout {layout} differs from {me}'s {mine}; run both with the same model, "
                "--dtype/--kv-cache-dtype and --page-size",
            )
        P = layout.page_size
        prompt = list(ticket.prompt_token_ids)
        if ticket.skip_tokens % P or ticket.skip_tokens >= len(prompt):
            await fail(
                common_pb2.ERROR_CODE_INVALID_ARGUMENT,
                f"skip_tokens {ticket.skip_tokens} must be a multiple of the page size {P} and shorter "
                f"than the prompt ({len(prompt)} tokens)",
            )
        skip_pages = ticket.skip_tokens // P
        n_pages = pages_needed(len(prompt), P)
        try:
            dst = descs_from_pb(ticket.pages, layout)
        except ValueError as e:
            await fail(common_pb2.ERROR_CODE_INVALID_ARGUMENT, f"malformed ticket: {e}")
        if len(dst) != n_pages - skip_pages:
            await fail(
                common_pb2.ERROR_CODE_INVALID_ARGUMENT,
                f"ticket names {len(dst)} pages but a {len(prompt)}-token prompt needs "
                f"{n_pages - skip_pages} after skipping {skip_pages}",
            )
        try:
            params = sampling_from_pb(ticket.sampling).validate(vocab_size=engine.runner.vocab_size)
        except InvalidRequest as e:
            await fail(common_pb2.ERROR_CODE_INVALID_ARGUMENT, str(e))
        deadline = t_start + (ticket.deadline_s or self.svc.cfg.disagg.handoff_timeout_s)
        try:
            algorithm = choose_checksum(ticket, transfer.checksums, transfer.pool.buffer.device.type)
        except ValueError as e:
            await fail(common_pb2.ERROR_CODE_LAYOUT_MISMATCH, str(e))
        return _Job(ticket, prompt, params, dst, skip_pages, n_pages, t_start, deadline, algorithm)

    async def _run(self, job: _Job, context: grpc.aio.ServicerContext) -> worker_pb2.PrefillResponse:
        """Compute the prompt with its pages held, write them into decode's, release them, answer."""
        svc = self.svc
        ticket = job.ticket
        rid = svc.ids.open(ticket.request_id, int(ticket.epoch))
        # The store keys pages by text-only page hashes: prompts with images neither load nor store (their pages
        # depend on the image, which those keys do not see).
        # The store's part of the prompt, within half the hand-off's time (0 on any miss).
        if svc.kvstore is not None and not ticket.media:
            await svc.kvstore.load(rid, job.prompt, budget_s=(job.deadline - time.monotonic()) / 2, trace=ticket.trace)
        try:
            first, t_accepted = await self._compute(job, rid, context)
            sent = await self._send_pages(job, rid, first, t_accepted, context)
        finally:
            await self._release(rid, ticket.request_id)
        kv = svc.kvstore
        if kv is not None and not ticket.media and kv.wants_store(finished=False, reused=first.num_cached_tokens > 0):
            kv.store_later(job.prompt, trace=ticket.trace)  # after the release: the pages sit in the prefix cache
        svc.pages_written += sent.pages
        svc.bytes_written += sent.nbytes
        return self._response(job, first, sent)

    async def _compute(self, job: _Job, rid: str, context: grpc.aio.ServicerContext) -> tuple[RequestOutput, float]:
        """Run the prompt to its first token, pages held; (its last delta, when the engine took the request)."""
        svc = self.svc
        me = svc.instance_id
        aengine = svc.aengine
        assert aengine is not None
        engine = aengine.engine
        ticket, params = job.ticket, job.params
        # One token only, sampled with the request's own parameters; stop strings are decode's business (but for
        # the request_poison fault's marker). n > 1 samples fork at decode, after this one prefill.
        first_params = dataclasses.replace(
            params, max_tokens=1, min_tokens=min(params.min_tokens, 1), stop=poison_marks(params.stop), n=1
        )
        accepted: list[float] = []  # when the engine thread took the request: the end of its queue wait

        def admit() -> list[RequestOutput]:
            accepted.append(time.monotonic())
            engine.add_request(rid, job.prompt, first_params, hold_pages=True, media=media)
            return []

        try:
            # a third of what is left of the hand-off for the encoders: a hung one leaves time to encode here
            media = (
                await prefill_media(svc, rid, ticket.media, budget_s=(job.deadline - time.monotonic()) / 3)
                if ticket.media
                else ()
            )
            first = None
            async for out in aengine.stream(rid, admit):  # generate(), but timed where the engine admits it
                first = out
        except InvalidRequest as e:
            await abort(context, common_pb2.ERROR_CODE_INVALID_ARGUMENT, str(e), instance_id=me)
        except QueueFull as e:
            await abort(context, common_pb2.ERROR_CODE_OVERLOADED, str(e), instance_id=me)
        except RequestFailed as e:  # the request's own failure, not this instance's
            await abort(context, common_pb2.ERROR_CODE_REQUEST_FAILED, str(e), instance_id=me)
        except EngineError as e:
            await abort(context, common_pb2.ERROR_CODE_INTERNAL, str(e), instance_id=me)
        assert first is not None and first.new_token_ids
        if first.finish_reason == "abort":
            await abort(context, common_pb2.ERROR_CODE_CANCELLED, f"prefill of {rid} was aborted", instance_id=me)
        return first, accepted[0]

    async def _send_pages(
        self, job: _Job, rid: str, first: RequestOutput, t_accepted: float, context: grpc.aio.ServicerContext
    ) -> _Sent:
        """Tell decode the compute is done, write the held pages into its pages, checksum what was written."""
        svc = self.svc
        me = svc.instance_id
        aengine, transfer = svc.aengine, svc.transfer
        assert aengine is not None and transfer is not None
        engine = aengine.engine
        ticket, deadline = job.ticket, job.deadline
        t_computed = time.monotonic()
        # Tells decode the compute is done: from here only the write remains, which it waits for only briefly
        # (a prefill that hangs now is given up on in seconds, whatever the compute deadline was).
        await context.send_initial_metadata(((COMPUTED_KEY, "1"),))

        def held() -> list[int]:
            # the pages to send, in the layout every TP size shares (a gather of the ranks' heads at tp > 1)
            ids = list(engine.held_pages(rid)[job.skip_pages : job.n_pages])
            engine.export_pages(ids)
            return ids

        src_pages = await aengine.call(held)
        t_pinned = time.monotonic()
        if time.monotonic() >= deadline:
            await abort(
                context,
                common_pb2.ERROR_CODE_TIMEOUT,
                f"prefill of {ticket.request_id} finished after its hand-off deadline; not writing",
                instance_id=me,
            )
        svc.faults.crash_if(Fault.PREFILL_CRASH_BEFORE_WRITE)
        await svc.faults.hang_if(Fault.PREFILL_HANG, deadline - time.monotonic() + 1.0)
        t_write = time.monotonic()
        try:
            # a known peer without a thread hop (a busy box delays to_thread by milliseconds)
            peer = transfer.connected(ticket.decode_peer)
            if not peer:
                peer = await asyncio.to_thread(transfer.connect, ticket.decode_peer)
            handle = transfer.write_pages(peer, src_pages, job.dst, f"{ticket.request_id}:{ticket.epoch}".encode())
            svc.faults.crash_if(Fault.PREFILL_CRASH_MID_TRANSFER)
            await transfer.wait(handle, max(0.05, deadline - time.monotonic()))
        except TransferError as e:
            await abort(
                context, common_pb2.ERROR_CODE_TRANSFER_FAILED, f"KV write to decode failed: {e}", instance_id=me
            )
        t_sent = time.monotonic()
        algorithm = job.checksum
        checksum = await asyncio.to_thread(transfer.checksum, src_pages, algorithm)
        observe_handoff(
            svc.telemetry,
            transfer.backend,
            first,
            job.t_start,
            t_accepted,
            t_pinned,
            t_write,
            t_sent,
            len(src_pages),
            handle.nbytes,
            handle.num_descs,
            ticket.decode_instance_id,
        )
        if svc.faults.active(Fault.PREFILL_CORRUPT_CHECKSUM):
            checksum ^= 1
        return _Sent(len(src_pages), handle.nbytes, algorithm, checksum, t_computed, t_sent)

    async def _release(self, rid: str, request_id: str) -> None:
        """Always, and shielded: when decode goes away (the RPC is cancelled) the request may have finished in the
        engine, its pages held, just before we saw its last delta. stream() queued an abort first, so this runs
        after it: a request still running is aborted, a finished one released."""
        svc = self.svc
        aengine = svc.aengine
        assert aengine is not None
        engine = aengine.engine
        t_release = time.monotonic()
        try:
            await asyncio.shield(aengine.call(lambda: engine.release_held(rid)))
        except EngineError:  # the engine is shutting down: its pages go with it
            pass
        svc.telemetry.tracing.record(spans.PREFILL_RELEASE, t_release, time.monotonic())
        svc.ids.close(request_id, rid)

    def _response(self, job: _Job, first: RequestOutput, sent: _Sent) -> worker_pb2.PrefillResponse:
        ticket, t_start = job.ticket, job.t_start
        resp = worker_pb2.PrefillResponse(
            request_id=ticket.request_id,
            epoch=ticket.epoch,
            first_token_id=first.new_token_ids[0],
            checksum_algorithm=worker_pb2.ChecksumAlgorithm.Value(f"CHECKSUM_ALGORITHM_{sent.algorithm.name}"),
            checksum=sent.checksum,
            pages_written=sent.pages,
            bytes_written=sent.nbytes,
            cached_tokens=first.num_cached_tokens,
            computed_tokens=len(job.prompt) - first.num_cached_tokens,
            prefill_instance_id=self.svc.instance_id,
            timings=worker_pb2.PrefillTimings(
                compute_s=sent.t_computed - t_start,
                transfer_s=sent.t_sent - sent.t_computed,
                total_s=time.monotonic() - t_start,
            ),
        )
        if first.new_logprobs:
            resp.first_logprob.CopyFrom(logprob_to_pb(first.new_logprobs[0]))
        if first.prompt_logprobs:
            resp.prompt_logprobs.extend(logprob_to_pb(lp) for lp in first.prompt_logprobs)
        return resp


async def prefill_media(
    svc: PrefillService, rid: str, media: Sequence[common_pb2.MediaInput], *, budget_s: float | None = None
) -> list[MediaInput]:
    """Embeddings from the encoders the gateway picked (written into our arena, each call within `budget_s`), else
    from our own tower."""
    if svc.remote_vision is not None:
        return await svc.remote_vision.embed(rid, media, budget_s=budget_s)
    return await local_media(svc, media)
