"""The closed sets configuration options choose from, as StrEnums.

An option whose values form a closed set is declared with its enum as its type (``dtype: A[Dtype, Arg(...)]``):
its choices come from the enum, so the set is written once, the resolved value is a member, and consumers compare
members (``cfg.model.dtype is Dtype.AUTO``), so a typo fails where it is written instead of silently selecting
nothing. StrEnum members equal their values, so a value compares,
hashes, prints and serialises (JSON, msgspec) exactly as the plain string did.
"""

from __future__ import annotations

import enum


class Dtype(enum.StrEnum):
    """Weights and activations (--dtype); AUTO: chosen by device."""

    AUTO = "auto"
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"


class KVCacheDtype(enum.StrEnum):
    """The KV cache (--kv-cache-dtype): the model's dtypes, or fp8 e4m3 pages (half of bf16's bytes; kv_pool.py);
    AUTO: the model dtype."""

    AUTO = "auto"
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    FP8_E4M3 = "fp8_e4m3"


class Quantization(enum.StrEnum):
    """Weight quantization (--quantization, SGLang's values); unset: what the checkpoint's config.json declares."""

    FP8 = "fp8"
    AWQ = "awq"
    GPTQ = "gptq"
    COMPRESSED_TENSORS = "compressed-tensors"


class EngineKind(enum.StrEnum):
    """The model engine behind a role (--engine): the real one, or a timing mock for scale tests."""

    REAL = "real"
    MOCK = "mock"


class SamplingBackend(enum.StrEnum):
    TORCH = "torch"


class GrammarBackendKind(enum.StrEnum):
    """Structured outputs (--grammar-backend): xgrammar token bitmasks, or none (such requests are refused)."""

    XGRAMMAR = "xgrammar"
    NONE = "none"


class TransferProtocol(enum.StrEnum):
    """The Mooncake engine's wire (--transfer-protocol); AUTO: rdma with --ib-device, else tcp."""

    AUTO = "auto"
    TCP = "tcp"
    RDMA = "rdma"


class BusOutagePolicy(enum.StrEnum):
    """What a NATS publish does while the server is down (--bus-outage-policy)."""

    BUFFER = "buffer"
    DROP = "drop"


class RoutingPolicy(enum.StrEnum):
    """How the gateway picks an instance or a prefill/decode pair (--routing-policy)."""

    KV_AWARE = "kv_aware"
    LEAST_LOAD = "least_load"
    ROUND_ROBIN = "round_robin"


class ReasoningParser(enum.StrEnum):
    """How the gateway splits a reasoning model's thinking from its answer (--reasoning-parser; SGLang's names).

    QWEN3: a `<think>` at the start of the output opens the reasoning. DEEPSEEK_R1: the output starts inside the
    reasoning (its template opens `<think>` in the prompt), which ends at `</think>`."""

    QWEN3 = "qwen3"
    DEEPSEEK_R1 = "deepseek-r1"
    GPT_OSS = "gpt-oss"  # harmony channels: analysis is reasoning, final is the answer


class ToolCallParser(enum.StrEnum):
    """The format a model writes tool calls in (--tool-call-parser; SGLang's names)."""

    HERMES = "hermes"  # <tool_call>{"name": ..., "arguments": {...}}</tool_call>
    LLAMA3 = "llama3"  # [<|python_tag|>]{"name": ..., "parameters": {...}}
    MISTRAL = "mistral"  # [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]
    QWEN3_CODER = "qwen3_coder"  # <tool_call><function=f><parameter=p>value</parameter></function></tool_call>
    DEEPSEEK_V3 = "deepseekv3"  # <｜tool▁call▁begin｜>function<｜tool▁sep｜>f ```json {...}```<｜tool▁call▁end｜>
    DEEPSEEK_V31 = "deepseekv31"  # <｜tool▁call▁begin｜>f<｜tool▁sep｜>{...}<｜tool▁call▁end｜> (the same reader)
    GPT_OSS = "gpt-oss"  # <|channel|>commentary to=functions.f <|constrain|>json<|message|>{...}<|call|>


class LogLevel(enum.StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class KVStoreUse(enum.StrEnum):
    """Whether an engine uses the cluster's kvstore (--kvstore-use); AUTO: when one is registered."""

    AUTO = "auto"
    OFF = "off"


class KVStoreWritePolicy(enum.StrEnum):
    """Which pages engines store (--kvstore-write-policy)."""

    WRITE_THROUGH = "write_through"
    WRITE_BACK = "write_back"
    SELECTIVE = "selective"


class PlannerActuator(enum.StrEnum):
    """What carries out the planner's decisions (--actuator)."""

    LOCAL = "local"
    KUBERNETES = "kubernetes"


class SchedulePolicy(enum.StrEnum):
    """Order of waiting requests (shared/engine/scheduler/policy.py)."""

    FCFS = "fcfs"
    PRIORITY = "priority"


class AttentionBackend(enum.StrEnum):
    AUTO = "auto"
    TORCH = "torch"
    NATIVE = "native"
    TRITON = "triton"


class LinearBackend(enum.StrEnum):
    AUTO = "auto"
    TORCH = "torch"
    ONEDNN = "onednn"
    NATIVE = "native"


class TransferBackend(enum.StrEnum):
    NIXL = "nixl"
    MOONCAKE = "mooncake"


class Fault(enum.StrEnum):
    """A failure injected at one well-defined point (--fault-injection, --encoder-fault-injection)."""

    NONE = "none"
    PREFILL_CRASH_BEFORE_WRITE = "prefill_crash_before_write"
    PREFILL_CRASH_MID_TRANSFER = "prefill_crash_mid_transfer"
    PREFILL_HANG = "prefill_hang"
    PREFILL_CORRUPT_CHECKSUM = "prefill_corrupt_checksum"
    DECODE_CRASH_MID_STREAM = "decode_crash_mid_stream"
    ENCODER_CRASH = "encoder_crash"
    ENCODER_HANG = "encoder_hang"
    # a request with the stop string "pdrelay:poison" fails in its logits processing (prefill, decode, worker)
    REQUEST_POISON = "request_poison"


HANDOFF_FAULTS: tuple[Fault, ...] = (
    Fault.NONE,
    Fault.PREFILL_CRASH_BEFORE_WRITE,
    Fault.PREFILL_CRASH_MID_TRANSFER,
    Fault.PREFILL_HANG,
    Fault.PREFILL_CORRUPT_CHECKSUM,
    Fault.DECODE_CRASH_MID_STREAM,
    Fault.REQUEST_POISON,
)
ENCODER_FAULTS: tuple[Fault, ...] = (Fault.NONE, Fault.ENCODER_CRASH, Fault.ENCODER_HANG)
