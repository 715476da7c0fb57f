"""Span, event and attribute names: stable, part of the product (dashboards and `pdrelay trace` read them).

One request is one trace. With every hop traced, a disaggregated request looks like this (process in brackets):

    gateway.request            [gateway]  SERVER  the HTTP request, arrival to last byte; events first_token, retry,
     |                                            migration
     +- gateway.tokenize       [gateway]          body read, validation, chat template, tokenization
     +- gateway.route          [gateway]          one routing decision: mode, chosen pair, policy and reason
     +- gateway.decode_call    [gateway]  CLIENT  one attempt's Decode.Generate stream; event first_token
         +- decode.generate    [decode]   SERVER  the attempt on decode; events retry (hand-off retries)
             +- decode.admit              KV pages reserved for prompt + headroom
             +- decode.handoff            CLIENT  one Prefill(ticket) call
             |   +- prefill.handoff [prefill] SERVER
             |       +- prefill.queue_wait        ticket arrived -> the engine accepted the request
             |       +- prefill.compute           engine accepted -> first token sampled, prompt KV pinned
             |       +- kv.transfer               KV pages written into decode's pages (backend, bytes, pages, GB/s)
             |       +- prefill.checksum          checksum of the written pages
             |       +- prefill.release           source pages released
             +- decode.verify             decode's checksum of the received pages
             +- decode.first_token        pages activated -> first token out of the engine
             +- decode.stream             first token -> last token (output tokens)

A colocated worker (or a decode instance prefilling a short prompt itself) records `decode.prefill` (arrival ->
first token: queue wait and compute) instead of admit / hand-off / verify / first_token. A NATS cancellation
records `request.cancel` on every instance that received it, in the trace of the request it cancels.

TTFT as the gateway measures it (arrival -> first token chunk, `pdrelay:time_to_first_token_seconds`) is covered
by tokenize + route + the first attempt's decode_call up to its first_token event; inside decode, by the phases
above. Errors set the span status to ERROR with the pdrelay error code in `pdrelay.error.code`.
"""

from __future__ import annotations

# ---- span names ----------------------------------------------------------------------------------------------------
GATEWAY_REQUEST = "gateway.request"
GATEWAY_TOKENIZE = "gateway.tokenize"
GATEWAY_ROUTE = "gateway.route"
GATEWAY_DECODE_CALL = "gateway.decode_call"
DECODE_GENERATE = "decode.generate"
DECODE_ADMIT = "decode.admit"
DECODE_PREFILL = "decode.prefill"
DECODE_HANDOFF = "decode.handoff"
DECODE_VERIFY = "decode.verify"
DECODE_FIRST_TOKEN = "decode.first_token"
DECODE_STREAM = "decode.stream"
PREFILL_HANDOFF = "prefill.handoff"
PREFILL_QUEUE_WAIT = "prefill.queue_wait"
PREFILL_COMPUTE = "prefill.compute"
KV_TRANSFER = "kv.transfer"
PREFILL_CHECKSUM = "prefill.checksum"
PREFILL_RELEASE = "prefill.release"
PREFILL_ENCODE = "prefill.encode"  # prefill -> encoder Encode call (images embedded elsewhere, EPD)
ENCODER_ENCODE = "encoder.encode"  # the encoder's side: tower (or cache) + the embeddings' transfer
REQUEST_CANCEL = "request.cancel"
KVSTORE_LOOKUP = "kvstore.lookup"  # engine side: how much of the prompt's miss the store holds
KVSTORE_LOAD = "kvstore.load"  # engine side: store -> own KV pool, verified, inside the request's TTFT
KVSTORE_STORE = "kvstore.store"  # engine side: pages -> store, off the TTFT path
KVSTORE_GET = "kvstore.get"  # store side of a load

ALL_SPANS = (
    GATEWAY_REQUEST,
    GATEWAY_TOKENIZE,
    GATEWAY_ROUTE,
    GATEWAY_DECODE_CALL,
    DECODE_GENERATE,
    DECODE_ADMIT,
    DECODE_PREFILL,
    DECODE_HANDOFF,
    DECODE_VERIFY,
    DECODE_FIRST_TOKEN,
    DECODE_STREAM,
    PREFILL_HANDOFF,
    PREFILL_QUEUE_WAIT,
    PREFILL_COMPUTE,
    KV_TRANSFER,
    PREFILL_CHECKSUM,
    PREFILL_RELEASE,
    PREFILL_ENCODE,
    ENCODER_ENCODE,
    REQUEST_CANCEL,
    KVSTORE_LOOKUP,
    KVSTORE_LOAD,
    KVSTORE_STORE,
    KVSTORE_GET,
)

# ---- events --------------------------------------------------------------------------------------------------------
EVENT_FIRST_TOKEN = "first_token"
EVENT_RETRY = "retry"  # a failed attempt, retried (gateway: another pair; decode: another prefill)
EVENT_MIGRATION = "migration"  # a stream that had sent tokens continues on another instance (replay)

# ---- attributes ----------------------------------------------------------------------------------------------------
REQUEST_ID = "pdrelay.request_id"
ATTEMPT = "pdrelay.attempt"
MODEL = "pdrelay.model"
INSTANCE = "pdrelay.instance_id"  # the instance that recorded the span (servers) or was called (clients)
EPOCH = "pdrelay.instance.epoch"
PROMPT_TOKENS = "pdrelay.prompt_tokens"
CACHED_TOKENS = "pdrelay.cached_tokens"
COMPUTED_TOKENS = "pdrelay.computed_tokens"
OUTPUT_TOKENS = "pdrelay.output_tokens"
FINISH_REASON = "pdrelay.finish_reason"
TTFT_MS = "pdrelay.ttft_ms"
ERROR_CODE = "pdrelay.error.code"
ROUTE_MODE = "pdrelay.route.mode"
ROUTE_DECODE = "pdrelay.route.decode"
ROUTE_PREFILL = "pdrelay.route.prefill"
ROUTE_POLICY = "pdrelay.route.policy"
ROUTE_REASON = "pdrelay.route.reason"
ROUTE_CACHED_TOKENS = "pdrelay.route.cached_tokens"
HANDOFF_EPOCH = "pdrelay.handoff.epoch"
PREFILL_INSTANCE = "pdrelay.prefill.instance_id"
DECODE_INSTANCE = "pdrelay.decode.instance_id"
PAGES = "pdrelay.kv.pages"
SKIP_TOKENS = "pdrelay.kv.skip_tokens"
TRANSFER_BACKEND = "pdrelay.transfer.backend"
TRANSFER_BYTES = "pdrelay.transfer.bytes"
TRANSFER_PAGES = "pdrelay.transfer.pages"
TRANSFER_DESCS = "pdrelay.transfer.descriptors"  # after coalescing adjacent pages: what the backend moved
TRANSFER_GBPS = "pdrelay.transfer.gb_per_s"
KVSTORE_HIT_PAGES = "pdrelay.kvstore.hit_pages"
KVSTORE_LOADED_PAGES = "pdrelay.kvstore.loaded_pages"
KVSTORE_CORRUPT_PAGES = "pdrelay.kvstore.corrupt_pages"
KVSTORE_OUTCOME = "pdrelay.kvstore.outcome"  # loaded | miss | timeout | error | checksum
HTTP_ROUTE = "http.route"
HTTP_STATUS = "http.response.status_code"
RPC_SYSTEM = "rpc.system"
RPC_METHOD = "rpc.method"
SERVER_ADDRESS = "server.address"
