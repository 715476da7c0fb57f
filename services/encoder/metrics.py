"""Prometheus metrics of the encoder (on its --metrics-port, beside the common request-error counter):

pdrelay:encoder_request_latency_seconds   histogram  Embed / Encode RPC arrival -> answer, by kind
pdrelay:encoder_batch_size                histogram  inputs per embedding forward
pdrelay:encoder_batch_tokens              histogram  padded tokens per embedding forward
pdrelay:encoder_forward_seconds           histogram  one embedding forward
pdrelay:encoder_inputs_total              counter    embedding inputs computed
pdrelay:encoder_prompt_tokens_total       counter    their tokens
pdrelay:encoder_cache_queries_total / pdrelay:encoder_cache_hits_total   counters (media hash cache)
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from shared.telemetry.metrics import E2E_BUCKETS

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768)


class EncoderMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.latency = Histogram(
            "pdrelay:encoder_request_latency_seconds",
            "Encoder RPC arrival -> answer",
            ("kind",),
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self.embed_latency = self.latency.labels("embed")
        self.encode_latency = self.latency.labels("encode")
        self.batch_size = Histogram(
            "pdrelay:encoder_batch_size", "Inputs per embedding forward", buckets=BATCH_BUCKETS, registry=r
        )
        self.batch_tokens = Histogram(
            "pdrelay:encoder_batch_tokens", "Padded tokens per embedding forward", buckets=TOKEN_BUCKETS, registry=r
        )
        self.forward = Histogram(
            "pdrelay:encoder_forward_seconds", "One embedding forward", buckets=E2E_BUCKETS, registry=r
        )
        self.inputs = Counter("pdrelay:encoder_inputs", "Embedding inputs computed", registry=r)
        self.tokens = Counter("pdrelay:encoder_prompt_tokens", "Tokens of the embedding inputs", registry=r)
        self.cache_queries = Counter(
            "pdrelay:encoder_cache_queries", "Media looked up in the encoder cache", registry=r
        )
        self.cache_hits = Counter("pdrelay:encoder_cache_hits", "Media found in the encoder cache", registry=r)

    def observe_batch(self, size: int, padded_tokens: int, seconds: float) -> None:
        self.batch_size.observe(size)
        self.batch_tokens.observe(padded_tokens)
        self.forward.observe(seconds)
        self.inputs.inc(size)

    def observe_cache(self, queries: int, hits: int) -> None:
        self.cache_queries.inc(queries)
        self.cache_hits.inc(hits)
