"""One frozen dataclass per concern. Roles compose the groups they need (see roles.py).

Field names are unique across groups: each becomes one CLI flag and one ``PDRELAY_*`` environment twin.
A value of ``None`` / ``0`` where documented means "derive it" (a resolution pass fills it in and records why).
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.config.choices import (
    HANDOFF_FAULTS,
    AttentionBackend,
    BusOutagePolicy,
    Dtype,
    EngineKind,
    Fault,
    GrammarBackendKind,
    KVCacheDtype,
    LinearBackend,
    LogLevel,
    Quantization,
    ReasoningParser,
    RoutingPolicy,
    SamplingBackend,
    SchedulePolicy,
    ToolCallParser,
    TransferBackend,
    TransferProtocol,
)
from shared.config.fields import A, Arg
from shared.config.service_groups import (
    BUNDLED_EMBEDDING_MODEL,
    EncoderConfig,
    KVStoreClientConfig,
    KVStoreConfig,
    PlannerConfig,
)

__all__ = [  # the service groups are declared in service_groups.py and re-exported here
    "BUNDLED_EMBEDDING_MODEL",
    "BUNDLED_MODEL",
    "GROUPS",
    "BusConfig",
    "CacheConfig",
    "CudaGraphConfig",
    "DeviceConfig",
    "DisaggConfig",
    "DiscoveryConfig",
    "EncoderConfig",
    "EngineSimConfig",
    "GrpcConfig",
    "HttpConfig",
    "KVStoreClientConfig",
    "KVStoreConfig",
    "KernelConfig",
    "ModelConfig",
    "ParallelConfig",
    "PlannerConfig",
    "SchedulerConfig",
    "TelemetryConfig",
    "TlsConfig",
    "TokenizerConfig",
    "TransferConfig",
]

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
        Dtype,
        Arg(
            "Weight and activation dtype ('auto': bfloat16 on GPU and on CPUs with avx512_bf16, else float32)",
        ),
    ] = Dtype.AUTO
    quantization: A[
        Quantization | None,
        Arg(
            "Weight quantization the checkpoint must carry (default: whatever its config.json declares; a method the "
            "engine cannot run is refused at start)"
        ),
    ] = None
    context_length: A[int | None, Arg("Maximum tokens per sequence (default: the model's own)", min=16)] = None
    model_cache_dir: A[str | None, Arg("Where prepared models live (default: $XDG_CACHE_HOME/pdrelay/models)")] = None
    trust_remote_code: A[bool, Arg("Allow model code from the model directory (never needed for Llama/Qwen2)")] = False


@dataclass(frozen=True, kw_only=True)
class TokenizerConfig:
    tokenizer: A[str | None, Arg("Tokenizer directory (default: the model's)", aliases=("--tokenizer-path",))] = None
    chat_template: A[str | None, Arg("Jinja chat template file overriding the model's")] = None


@dataclass(frozen=True, kw_only=True)
class DeviceConfig:
    device: A[
        str,
        Arg(
            "Compute device: 'auto' (cuda when available, else cpu), 'cpu', 'cuda', or 'cuda:N' (GPU N, the same "
            "as --base-gpu-id N)"
        ),
    ] = "auto"
    base_gpu_id: A[
        int,
        Arg(
            "First GPU of this process, as the host numbers them (SGLang's --base-gpu-id); `pdrelay up` sets it "
            "for each engine",
            min=0,
            max=1023,
        ),
    ] = 0
    gpu_id_step: A[
        int,
        Arg("Distance between the GPUs of this process's ranks: rank i uses base + i x step", min=1, max=64),
    ] = 1
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
        float,
        Arg(
            "Fraction of the device memory free at start (host RAM on CPU) for weights, activations, CUDA graphs and "
            "the KV pool",
            min=0.01,
            max=0.99,
        ),
    ] = 0.9
    kv_cache_memory_bytes: A[
        int, Arg("KV pool budget in bytes (0: what the memory plan leaves after weights and activations)", min=0)
    ] = 0
    kv_cache_dtype: A[
        KVCacheDtype,
        Arg(
            "KV cache dtype ('auto': the model dtype; fp8_e4m3: 1-byte pages, scale 1.0 or the checkpoint's k/v_scale)"
        ),
    ] = KVCacheDtype.AUTO
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
    schedule_policy: A[SchedulePolicy, Arg("Order of waiting requests")] = SchedulePolicy.FCFS
    new_token_ratio: A[
        float, Arg("Share of max_tokens reserved when admitting (lower admits more, may preempt)", min=0.0, max=1.0)
    ] = 0.4
    stream_interval: A[
        int, Arg("Tokens per streamed delta: the first and last go at once, the rest in groups of N", min=1, max=1024)
    ] = 1


@dataclass(frozen=True, kw_only=True)
class EngineSimConfig:
    engine: A[
        EngineKind,
        Arg(
            "What runs the steps: 'real' (the model) or 'mock' (the real scheduler, cache and hand-off "
            "with the forward pass replaced by a timing model of the real one; no weights)",
        ),
    ] = EngineKind.REAL
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
    tp_size: A[
        int, Arg("Tensor-parallel degree: one process per rank (GPUs on cuda; the cores split on cpu)", min=1, max=64)
    ] = 1
    dp_size: A[int, Arg("Data-parallel engine replicas in this service (only 1 for now)", min=1, max=64)] = 1


@dataclass(frozen=True, kw_only=True)
class KernelConfig:
    attention_backend: A[
        AttentionBackend,
        Arg(
            "Attention kernels ('auto': triton on GPU; on CPU native (C decode kernel) for "
            "float32 where it builds, else torch)",
        ),
    ] = AttentionBackend.AUTO
    linear_backend: A[
        LinearBackend,
        Arg(
            "Dense projections ('auto': for fp32 on CPU the native few-row kernel for decode steps and oneDNN over "
            "prepacked weights for larger ones; torch's F.linear elsewhere)",
        ),
    ] = LinearBackend.AUTO
    sampling_backend: A[SamplingBackend, Arg("Sampling implementation")] = SamplingBackend.TORCH
    grammar_backend: A[
        GrammarBackendKind,
        Arg(
            "Structured outputs (response_format json_object / json_schema, guided_*): "
            "'xgrammar' constrains sampling with a token bitmask; 'none' refuses them",
        ),
    ] = GrammarBackendKind.XGRAMMAR


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
        Fault,
        Arg(
            "Inject one failure into every hand-off, or into every request with the stop string pdrelay:poison "
            "(request_poison) (chaos testing; never in production)",
            choices=HANDOFF_FAULTS,
        ),
    ] = Fault.NONE


@dataclass(frozen=True, kw_only=True)
class TransferConfig:
    transfer_backend: A[TransferBackend, Arg("KV transfer engine")] = TransferBackend.NIXL
    transfer_host: A[str, Arg("Address the transfer engine advertises to peers")] = "127.0.0.1"
    ib_device: A[
        str | None,
        Arg(
            "RDMA device(s) the KV transfer uses, e.g. mlx5_0 or mlx5_0,mlx5_1 (checked against "
            "/sys/class/infiniband; default: none, TCP)",
            aliases=("--disaggregation-ib-device",),
        ),
    ] = None
    transfer_protocol: A[
        TransferProtocol,
        Arg("Wire of the Mooncake engine ('auto': rdma with --ib-device, else tcp)"),
    ] = TransferProtocol.AUTO
    ucx_transports: A[
        tuple[str, ...],
        Arg(
            "UCX transports of the NIXL engine (UCX_TLS), e.g. cuda_copy,cuda_ipc,rc ('auto' when empty: UCX picks; "
            "with --ib-device and a GPU pool: rc,cuda_copy,cuda_ipc)"
        ),
    ] = ()


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
    bus_outage_policy: A[BusOutagePolicy, Arg("What a publish does while NATS is down")] = BusOutagePolicy.BUFFER
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
    routing_policy: A[RoutingPolicy, Arg("How the gateway picks a prefill/decode pair")] = RoutingPolicy.KV_AWARE
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
    # chat answers: thinking and tool calls read out of the model's text (services/gateway/openai/)
    reasoning_parser: A[
        ReasoningParser | None,
        Arg("Split <think>...</think> into message.reasoning_content (default: off, all text is content)"),
    ] = None
    tool_call_parser: A[
        ToolCallParser | None,
        Arg("Format of the model's tool calls (default: recognised from the chat template, else hermes)"),
    ] = None
    max_parallel_tool_calls: A[
        int,
        Arg(
            "Most tool calls in one answer (a request may raise it with max_parallel_tool_calls): the bound of "
            "tool_choice=required's array, and auto mode keeps the first this many",
            min=1,
            max=128,
        ),
    ] = 8


@dataclass(frozen=True, kw_only=True)
class TelemetryConfig:
    log_level: A[LogLevel, Arg("Log level")] = LogLevel.INFO
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
