"""One frozen dataclass per concern. Roles compose the groups they need (see roles.py).

Field names are unique across groups: each becomes one CLI flag and one ``PDRELAY_*`` environment twin.
A value of ``None`` / ``0`` where documented means "derive it" (a resolution pass fills it in and records why).
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.config.choices import (
    ENCODER_FAULTS,
    HANDOFF_FAULTS,
    AttentionBackend,
    Fault,
    LinearBackend,
    SchedulePolicy,
    TransferBackend,
)
from shared.config.fields import A, Arg

BUNDLED_MODEL = "bundled:smollm2-135m-instruct"


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    model: A[
        str,
        Arg(
            "Model: 'bundled:smollm2-135m-instruct' or a local Hugging Face model directory", aliases=("--model-path",)
        ),
    ] = BUNDLED_MODEL
    served_model_name: A[str | None, Arg("Name clients use in the 'model' field (default: derived from --model)")] = (
        None
    )
    dtype: A[
        str,
        Arg(
            "Weight and activation dtype ('auto': bfloat16 on GPU and on CPUs with avx512_bf16, else float32)",
            choices=("auto", "float32", "bfloat16", "float16"),
        ),
    ] = "auto"
    context_length: A[int | None, Arg("Maximum tokens per sequence (default: the model's own)", min=16)] = None
    model_cache_dir: A[str | None, Arg("Where prepared models live (default: $XDG_CACHE_HOME/pdrelay/models)")] = None
    trust_remote_code: A[bool, Arg("Allow model code from the model directory (never needed for Llama/Qwen2)")] = False


@dataclass(frozen=True, kw_only=True)
class TokenizerConfig:
    tokenizer: A[str | None, Arg("Tokenizer directory (default: the model's)", aliases=("--tokenizer-path",))] = None
    chat_template: A[str | None, Arg("Jinja chat template file overriding the model's")] = None


@dataclass(frozen=True, kw_only=True)
class DeviceConfig:
    device: A[str, Arg("Compute device ('auto': cuda when available, else cpu)", choices=("auto", "cpu", "cuda"))] = (
        "auto"
    )
    threads: A[
        int,
        Arg(
            "torch intra-op threads for this process (0: 1 when services share the box, else all cores)",
            min=0,
            max=1024,
        ),
    ] = 0
    random_seed: A[int, Arg("Seed for anything random the service does itself", min=0)] = 0


@dataclass(frozen=True, kw_only=True)
class CacheConfig:
    page_size: A[int, Arg("Tokens per KV page (a power of two)", min=1, max=1024)] = 16
    num_pages: A[int, Arg("KV pages in the pool (0: derived from --mem-fraction-static)", min=0)] = 0
    mem_fraction_static: A[
        float, Arg("Fraction of device memory (host RAM on CPU) for weights + KV pool", min=0.01, max=0.95)
    ] = 0.9
    kv_cache_memory_bytes: A[
        int, Arg("KV pool budget in bytes (0: derived from memory fraction and weights)", min=0)
    ] = 0
    kv_cache_dtype: A[
        str, Arg("KV cache dtype ('auto': the model dtype)", choices=("auto", "float32", "bfloat16", "float16"))
    ] = "auto"
    disable_radix_cache: A[bool, Arg("Turn off prefix sharing between requests")] = False


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    max_running_requests: A[int, Arg("Most requests decoding at once", min=1, max=4096)] = 64
    max_queued_requests: A[int, Arg("Most requests waiting; more are refused with a retryable error", min=1)] = 1024
    max_queue_wait_s: A[
        float,
        Arg(
            "Longest a request waits for a slot in the disaggregated decode's queue: one "
            "whose estimated wait is longer is refused at once, with 429 + Retry-After "
            "(0: bounded by --max-queued-requests only)",
            min=0,
        ),
    ] = 30.0
    chunked_prefill_size: A[int, Arg("Most prompt tokens per prefill chunk (0: derived by device and role)", min=0)] = 0
    max_prefill_tokens: A[int, Arg("Most prompt tokens in one step, all requests together", min=16)] = 4096
    schedule_policy: A[str, Arg("Order of waiting requests", choices=tuple(SchedulePolicy))] = SchedulePolicy.FCFS.value
    new_token_ratio: A[
        float, Arg("Share of max_tokens reserved when admitting (lower admits more, may preempt)", min=0.0, max=1.0)
    ] = 0.4
    stream_interval: A[
        int, Arg("Tokens per streamed delta: the first and last go at once, the rest in groups of N", min=1, max=1024)
    ] = 1


@dataclass(frozen=True, kw_only=True)
class EngineSimConfig:
    engine: A[
        str,
        Arg(
            "What runs the steps: 'real' (the model) or 'mock' (the real scheduler, cache and hand-off "
            "with the forward pass replaced by a timing model of the real one; no weights)",
            choices=("real", "mock"),
        ),
    ] = "real"
    mock_timing_table: A[
        str | None,
        Arg("Step-time table of --engine mock (default: the bundled model's, measured with shared/engine/mock/fit.py)"),
    ] = None
    mock_speedup: A[
        float,
        Arg(
            "--engine mock steps run this many times faster than the table says (time-compressed simulations)",
            min=0.01,
            max=1000,
        ),
    ] = 1.0


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    tp_size: A[int, Arg("Tensor-parallel degree (1 on CPU)", min=1, max=64)] = 1
    dp_size: A[int, Arg("Data-parallel engine replicas in this service", min=1, max=64)] = 1


@dataclass(frozen=True, kw_only=True)
class KernelConfig:
    attention_backend: A[
        str,
        Arg(
            "Attention kernels ('auto': triton on GPU; on CPU native (C decode kernel) for "
            "float32 where it builds, else torch)",
            choices=tuple(AttentionBackend),
        ),
    ] = AttentionBackend.AUTO.value
    linear_backend: A[
        str,
        Arg(
            "Dense projections ('auto': for fp32 on CPU the native few-row kernel for decode steps and oneDNN over "
            "prepacked weights for larger ones; torch's F.linear elsewhere)",
            choices=tuple(LinearBackend),
        ),
    ] = LinearBackend.AUTO.value
    sampling_backend: A[str, Arg("Sampling implementation", choices=("torch",))] = "torch"
    grammar_backend: A[
        str,
        Arg(
            "Structured outputs (response_format json_object / json_schema, guided_*): "
            "'xgrammar' constrains sampling with a token bitmask; 'none' refuses them",
            choices=("xgrammar", "none"),
        ),
    ] = "xgrammar"


@dataclass(frozen=True, kw_only=True)
class CudaGraphConfig:
    disable_cuda_graph: A[bool, Arg("Run every step eagerly (always true on CPU)")] = False
    disable_decode_cuda_graph: A[bool | None, Arg("Skip decode graphs (default: true for the prefill role)")] = None
    disable_prefill_cuda_graph: A[
        bool | None, Arg("Skip prefill graphs (default: true except for the prefill role)")
    ] = None
    cuda_graph_max_bs: A[int, Arg("Largest decode batch captured", min=1, max=1024)] = 64
    cuda_graph_bs: A[
        tuple[int, ...], Arg("Decode batch sizes captured (default: derived from --cuda-graph-max-bs)")
    ] = ()


@dataclass(frozen=True, kw_only=True)
class DisaggConfig:
    local_prefill_threshold: A[int, Arg("Decode prefills prompts shorter than this itself (0: never)", min=0)] = 0
    handoff_timeout_s: A[
        float,
        Arg(
            "Seconds a KV hand-off may take before its pages are freed (the longest "
            "deadline; each hand-off's own follows its prompt and the measured prefill "
            "rate)",
            min=0.1,
        ),
    ] = 30.0
    handoff_min_timeout_s: A[
        float,
        Arg(
            "Shortest deadline of a KV hand-off (the deadline grows from it with the "
            "prompt, up to --handoff-timeout-s)",
            min=0.1,
        ),
    ] = 3.0
    handoff_retries: A[int, Arg("Retries of a failed hand-off on another prefill instance", min=0, max=10)] = 1
    # Fault injection is a product feature: operators rehearse failures on a staging cluster with the real code.
    fault_injection: A[
        str,
        Arg(
            "Inject one failure into every hand-off, or into every request with the stop string pdrelay:poison "
            "(request_poison) (chaos testing; never in production)",
            choices=HANDOFF_FAULTS,
        ),
    ] = Fault.NONE.value


@dataclass(frozen=True, kw_only=True)
class TransferConfig:
    transfer_backend: A[str, Arg("KV transfer engine", choices=tuple(TransferBackend))] = TransferBackend.NIXL.value
    transfer_host: A[str, Arg("Address the transfer engine advertises to peers")] = "127.0.0.1"


@dataclass(frozen=True, kw_only=True)
class DiscoveryConfig:
    etcd_endpoints: A[tuple[str, ...], Arg("etcd client URLs", aliases=("--etcd",))] = ("http://127.0.0.1:2379",)
    cluster: A[str, Arg("Cluster name (etcd prefix /pdrelay/<cluster>/, NATS subject prefix)")] = "default"
    instance_id: A[str | None, Arg("Instance id (default: <role>-<host>-<pid>)")] = None
    lease_ttl_s: A[int, Arg("etcd lease TTL; an instance vanishes this long after it dies", min=1, max=600)] = 5


@dataclass(frozen=True, kw_only=True)
class BusConfig:
    nats_url: A[str, Arg("NATS server URL", aliases=("--nats",))] = "nats://127.0.0.1:4222"
    load_report_interval_s: A[float, Arg("Seconds between load reports", min=0.01, max=60)] = 0.2
    bus_outage_policy: A[str, Arg("What a publish does while NATS is down", choices=("buffer", "drop"))] = "buffer"
    admin_secret_file: A[
        str | None,
        Arg(
            "File holding the cluster secret that signs admin commands on NATS (drain, "
            "scale); unsigned ones are then refused (`pdrelay up` makes one)"
        ),
    ] = None


@dataclass(frozen=True, kw_only=True)
class GrpcConfig:
    host: A[str, Arg("Address to bind (127.0.0.1 keeps the service local)")] = "127.0.0.1"
    grpc_port: A[int, Arg("gRPC port (0: pick a free one)", min=0, max=65535)] = 0


@dataclass(frozen=True, kw_only=True)
class TlsConfig:
    tls_ca_file: A[
        str | None,
        Arg(
            "CA certificate (PEM) that signs every service's certificate; with it gRPC between "
            "services is mutual TLS, and https:// etcd / tls:// NATS use it (`pdrelay certs`)"
        ),
    ] = None
    tls_certfile: A[
        str | None, Arg("This service's certificate (PEM), signed by --tls-ca-file; presented as server and as client")
    ] = None
    tls_keyfile: A[str | None, Arg("Private key (PEM) of --tls-certfile")] = None


@dataclass(frozen=True, kw_only=True)
class HttpConfig:
    port: A[int, Arg("HTTP port of the gateway", min=0, max=65535)] = 8000
    api_key: A[
        str | None,
        Arg(
            "Require 'Authorization: Bearer <key>' on the HTTP API and gRPC metadata "
            "'authorization: Bearer <key>' on the gRPC API",
            secret=True,
        ),
    ] = None
    ssl_certfile: A[
        str | None, Arg("Certificate (PEM) of the public front door: HTTPS, and TLS on the gateway's gRPC API")
    ] = None
    ssl_keyfile: A[str | None, Arg("Private key (PEM) of --ssl-certfile")] = None
    ssl_keyfile_password: A[str | None, Arg("Password of an encrypted --ssl-keyfile", secret=True)] = None
    ssl_ca_certs: A[str | None, Arg("CA bundle: clients of the public API must present a certificate it signed")] = None
    max_request_bytes: A[int, Arg("Largest request body accepted", min=1024)] = 4 * 1024 * 1024
    routing_policy: A[
        str, Arg("How the gateway picks a prefill/decode pair", choices=("kv_aware", "least_load", "round_robin"))
    ] = "kv_aware"
    request_retries: A[int, Arg("Retries of a failed request on another pair", min=0, max=10)] = 2
    encoder_timeout_s: A[
        float, Arg("Seconds an encoder call may take before it is retried on another encoder", min=0.1)
    ] = 30.0
    # images in chat requests: where they may come from and how large they may be (services/gateway/http/media/)
    limit_mm_per_prompt: A[int, Arg("Most images in one request", min=0, max=64)] = 4
    allowed_local_media_path: A[
        str | None, Arg("Directory file:// image URLs may read from (default: file:// refused)")
    ] = None
    allowed_media_domains: A[
        tuple[str, ...], Arg("Hosts http(s):// image URLs may be fetched from (default: none, remote URLs refused)")
    ] = ()
    max_image_bytes: A[int, Arg("Largest encoded image accepted (bytes)", min=1024)] = 20 * 1024 * 1024
    max_image_pixels: A[int, Arg("Largest decoded image accepted (width x height)", min=1)] = 4096 * 4096
    media_fetch_timeout_s: A[float, Arg("Seconds an http(s) image fetch may take", min=0.1)] = 5.0


@dataclass(frozen=True, kw_only=True)
class TelemetryConfig:
    log_level: A[str, Arg("Log level", choices=("debug", "info", "warning", "error"))] = "info"
    log_json: A[bool, Arg("Structured JSON logs")] = False
    otlp_traces_endpoint: A[str | None, Arg("OTLP/gRPC endpoint for traces (off when unset)")] = None
    trace_sample_ratio: A[
        float,
        Arg(
            "Share of new traces recorded (a request arriving with a trace context follows its caller's decision)",
            min=0.0,
            max=1.0,
        ),
    ] = 1.0
    enable_metrics: A[bool, Arg("Serve Prometheus /metrics")] = True
    metrics_port: A[int, Arg("Port of /metrics on workers (0: pick a free one)", min=0, max=65535)] = 0


BUNDLED_EMBEDDING_MODEL = "bundled:all-minilm-l6-v2"


@dataclass(frozen=True, kw_only=True)
class EncoderConfig:
    # The vision tower comes from --model (a vision-language model directory); embeddings from this one.
    encoder_model: A[
        str,
        Arg(
            "Embedding model the encoder serves: 'bundled:all-minilm-l6-v2' or a "
            "sentence-transformers directory ('none': no embeddings)"
        ),
    ] = BUNDLED_EMBEDDING_MODEL
    encoder_cache_items: A[int, Arg("Encoder outputs kept, keyed by media hash", min=0)] = 1024
    encoder_cache_bytes: A[int, Arg("Bytes of encoder outputs kept (least recently used dropped first)", min=0)] = (
        512 * 1024 * 1024
    )
    encoder_max_batch_size: A[int, Arg("Most embedding inputs in one forward", min=1, max=4096)] = 64
    encoder_max_batch_tokens: A[int, Arg("Most padded tokens in one embedding forward", min=16)] = 8192
    encoder_batch_wait_ms: A[
        float, Arg("How long an idle encoder waits for more requests to batch with the first", min=0.0, max=1000.0)
    ] = 2.0
    encoder_fault_injection: A[
        str,
        Arg(
            "Inject one failure into every encoder request (chaos testing; never in production)", choices=ENCODER_FAULTS
        ),
    ] = Fault.NONE.value


@dataclass(frozen=True, kw_only=True)
class KVStoreConfig:
    kvstore_dram_bytes: A[int, Arg("Host DRAM tier size in bytes", min=0)] = 1 << 30
    kvstore_disk_dir: A[str | None, Arg("Local disk tier directory (off when unset)")] = None
    kvstore_disk_bytes: A[int, Arg("Local disk tier size in bytes", min=0)] = 8 << 30
    kvstore_lease_s: A[
        float,
        Arg("Longest read lease: a looked-up or loading page is not evicted for up to this long", min=0.1, max=600),
    ] = 10.0
    kvstore_high_watermark: A[
        float,
        Arg(
            "DRAM fill (share of --kvstore-dram-bytes) above which pages are demoted "
            "to disk (or evicted without a disk tier)",
            min=0.1,
            max=1.0,
        ),
    ] = 0.9
    kvstore_chunk_pages: A[int, Arg("Pages per disk chunk file and per Mooncake Store object", min=1, max=1024)] = 16
    kvstore_mooncake_master: A[
        str | None, Arg("Mooncake Store master HOST:PORT for the shared tier T3 (off when unset)")
    ] = None
    kvstore_mooncake_metadata_url: A[
        str | None,
        Arg(
            "Mooncake transfer metadata URL (e.g. "
            "http://HOST:PORT/metadata, the master's HTTP metadata "
            "server); required with --kvstore-mooncake-master"
        ),
    ] = None
    kvstore_mooncake_segment_bytes: A[
        int, Arg("Memory this kvstore contributes to the Mooncake Store pool", min=1 << 20)
    ] = 256 << 20
    kvstore_mooncake_bytes: A[
        int, Arg("Byte budget of the chunks this kvstore puts into the Mooncake Store (oldest removed past it)", min=0)
    ] = 256 << 20
    kvstore_mooncake_timeout_s: A[
        float,
        Arg(
            "Timeout of every Mooncake Store call; the tier is skipped for a few seconds after a failure",
            min=0.05,
            max=60,
        ),
    ] = 2.0


@dataclass(frozen=True, kw_only=True)
class KVStoreClientConfig:
    """How an engine (prefill, decode, worker) uses the cluster's kvstore."""

    kvstore_use: A[
        str, Arg("Use a kvstore of the cluster ('auto': when one is registered)", choices=("auto", "off"))
    ] = "auto"
    kvstore_min_pages: A[
        int, Arg("Smallest prefix-cache miss (pages beyond the local prefix) worth a store lookup", min=1)
    ] = 2
    kvstore_load_timeout_s: A[
        float,
        Arg(
            "Deadline of a store load (0: derived from the prompt: a share of the time "
            "computing the missed tokens would take)",
            min=0.0,
        ),
    ] = 0.0
    kvstore_write_policy: A[
        str,
        Arg(
            "Which pages engines store: write_through (every new full page: prefill's "
            "prompts, finished requests), write_back (finished requests only), selective "
            "(only requests that reused a cached prefix)",
            choices=("write_through", "write_back", "selective"),
        ),
    ] = "write_through"


@dataclass(frozen=True, kw_only=True)
class PlannerConfig:
    ttft_target_ms: A[
        float, Arg("Time-to-first-token target: prefill scales up when its estimate breaks it", min=1)
    ] = 3000.0
    itl_target_ms: A[float, Arg("Inter-token latency target: decode scales up when its estimate breaks it", min=1)] = (
        250.0
    )
    min_prefill: A[int, Arg("Fewest prefill instances", min=0, max=10000)] = 1
    max_prefill: A[int, Arg("Most prefill instances", min=0, max=10000)] = 8
    min_decode: A[int, Arg("Fewest decode instances", min=1, max=10000)] = 1
    max_decode: A[int, Arg("Most decode instances", min=1, max=10000)] = 8
    budget: A[int, Arg("Most prefill + decode instances together (0: max-prefill + max-decode)", min=0)] = 0
    evaluation_interval_s: A[float, Arg("Seconds between evaluations", min=0.1, max=3600)] = 5.0
    scale_up_cooldown_s: A[float, Arg("After scaling a role up, wait this long before scaling it up again", min=0)] = (
        10.0
    )
    scale_down_cooldown_s: A[float, Arg("After any change of a role, wait this long before scaling it down", min=0)] = (
        30.0
    )
    hysteresis: A[
        float,
        Arg(
            "Scale down only when the estimate with one instance fewer stays this far under the "
            "target (0.3: under 0.7 x the target)",
            min=0,
            max=0.95,
        ),
    ] = 0.3
    idle_threshold: A[
        float,
        Arg("Scale down only when the instances left would be busy less than this share of the time", min=0, max=1),
    ] = 0.5
    max_scale_step: A[int, Arg("Most instances added to a role in one decision", min=1, max=100)] = 2
    scale_up_timeout_s: A[
        float,
        Arg("A scale-up whose instances have not registered by then has failed (it is retried with backoff)", min=1),
    ] = 120.0
    scale_retry_max_s: A[
        float, Arg("Longest wait between retries of a failed scale-up (backoff doubles up to it)", min=0.1)
    ] = 60.0
    manual_pin_s: A[
        float, Arg("How long a manual `pdrelay scale` pins a role (0: until `pdrelay planner unpin`)", min=0)
    ] = 0.0
    actuator: A[
        str,
        Arg(
            "What carries out decisions: the local supervisor of `pdrelay up`, or Kubernetes",
            choices=("local", "kubernetes"),
        ),
    ] = "local"
    k8s_namespace: A[str | None, Arg("Namespace of the Deployments (default: the planner pod's own)")] = None
    k8s_deployments: A[tuple[str, ...], Arg("ROLE=DEPLOYMENT for each scaled role")] = (
        "prefill=prefill",
        "decode=decode",
    )
    planner_log_size: A[int, Arg("Decisions the planner keeps for `pdrelay planner log`", min=1)] = 1000


# name on the resolved config -> group class. Order is the order `config show` prints.
GROUPS: dict[str, type] = {
    "model": ModelConfig,
    "tokenizer": TokenizerConfig,
    "device": DeviceConfig,
    "cache": CacheConfig,
    "scheduler": SchedulerConfig,
    "engine": EngineSimConfig,
    "parallel": ParallelConfig,
    "kernels": KernelConfig,
    "cuda_graph": CudaGraphConfig,
    "disagg": DisaggConfig,
    "transfer": TransferConfig,
    "discovery": DiscoveryConfig,
    "bus": BusConfig,
    "grpc": GrpcConfig,
    "tls": TlsConfig,
    "http": HttpConfig,
    "telemetry": TelemetryConfig,
    "encoder": EncoderConfig,
    "kvstore": KVStoreConfig,
    "kvstore_client": KVStoreClientConfig,
    "planner": PlannerConfig,
}
