from collections.abc import Iterable as _Iterable
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar

from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper

from proto.pdrelay.v1 import common_pb2 as _common_pb2

DESCRIPTOR: _descriptor.FileDescriptor

class ChecksumAlgorithm(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHECKSUM_ALGORITHM_UNSPECIFIED: _ClassVar[ChecksumAlgorithm]
    CHECKSUM_ALGORITHM_CRC32: _ClassVar[ChecksumAlgorithm]

class StorageTier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STORAGE_TIER_UNSPECIFIED: _ClassVar[StorageTier]
    STORAGE_TIER_DRAM: _ClassVar[StorageTier]
    STORAGE_TIER_DISK: _ClassVar[StorageTier]
    STORAGE_TIER_PEER: _ClassVar[StorageTier]

CHECKSUM_ALGORITHM_UNSPECIFIED: ChecksumAlgorithm
CHECKSUM_ALGORITHM_CRC32: ChecksumAlgorithm
STORAGE_TIER_UNSPECIFIED: StorageTier
STORAGE_TIER_DRAM: StorageTier
STORAGE_TIER_DISK: StorageTier
STORAGE_TIER_PEER: StorageTier

class PrefillTarget(_message.Message):
    __slots__ = ("instance_id", "grpc_address", "epoch")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    grpc_address: str
    epoch: int
    def __init__(
        self, instance_id: str | None = ..., grpc_address: str | None = ..., epoch: int | None = ...
    ) -> None: ...

class DecodeRequest(_message.Message):
    __slots__ = (
        "request_id",
        "prompt_token_ids",
        "sampling",
        "model",
        "prefill",
        "media",
        "trace",
        "priority",
        "attempt",
    )
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    MEDIA_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _common_pb2.SamplingParams
    model: str
    prefill: PrefillTarget
    media: _containers.RepeatedCompositeFieldContainer[_common_pb2.MediaInput]
    trace: _common_pb2.TraceContext
    priority: int
    attempt: int
    def __init__(
        self,
        request_id: str | None = ...,
        prompt_token_ids: _Iterable[int] | None = ...,
        sampling: _common_pb2.SamplingParams | _Mapping | None = ...,
        model: str | None = ...,
        prefill: PrefillTarget | _Mapping | None = ...,
        media: _Iterable[_common_pb2.MediaInput | _Mapping] | None = ...,
        trace: _common_pb2.TraceContext | _Mapping | None = ...,
        priority: int | None = ...,
        attempt: int | None = ...,
    ) -> None: ...

class DecodeTimings(_message.Message):
    __slots__ = ("queue_s", "prefill_s", "transfer_s")
    QUEUE_S_FIELD_NUMBER: _ClassVar[int]
    PREFILL_S_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_S_FIELD_NUMBER: _ClassVar[int]
    queue_s: float
    prefill_s: float
    transfer_s: float
    def __init__(
        self, queue_s: float | None = ..., prefill_s: float | None = ..., transfer_s: float | None = ...
    ) -> None: ...

class DecodeResponse(_message.Message):
    __slots__ = (
        "request_id",
        "token_ids",
        "logprobs",
        "finish_reason",
        "matched_stop",
        "usage",
        "error",
        "timings",
        "prefill_instance_id",
        "index",
        "prompt_logprobs",
    )
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    MATCHED_STOP_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprob]
    finish_reason: _common_pb2.FinishReason
    matched_stop: _common_pb2.MatchedStop
    usage: _common_pb2.Usage
    error: _common_pb2.Error
    timings: DecodeTimings
    prefill_instance_id: str
    index: int
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprob]
    def __init__(
        self,
        request_id: str | None = ...,
        token_ids: _Iterable[int] | None = ...,
        logprobs: _Iterable[_common_pb2.TokenLogprob | _Mapping] | None = ...,
        finish_reason: _common_pb2.FinishReason | str | None = ...,
        matched_stop: _common_pb2.MatchedStop | _Mapping | None = ...,
        usage: _common_pb2.Usage | _Mapping | None = ...,
        error: _common_pb2.Error | _Mapping | None = ...,
        timings: DecodeTimings | _Mapping | None = ...,
        prefill_instance_id: str | None = ...,
        index: int | None = ...,
        prompt_logprobs: _Iterable[_common_pb2.TokenLogprob | _Mapping] | None = ...,
    ) -> None: ...

class HandoffTicket(_message.Message):
    __slots__ = (
        "request_id",
        "epoch",
        "decode_instance_id",
        "decode_instance_epoch",
        "decode_peer",
        "pages",
        "layout",
        "prompt_token_ids",
        "skip_tokens",
        "sampling",
        "trace",
        "media",
        "deadline_s",
        "attempt",
    )
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    DECODE_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    DECODE_INSTANCE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    DECODE_PEER_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SKIP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    MEDIA_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    epoch: int
    decode_instance_id: str
    decode_instance_epoch: int
    decode_peer: _common_pb2.TransferPeer
    pages: _common_pb2.PageDescriptors
    layout: _common_pb2.KVLayout
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    skip_tokens: int
    sampling: _common_pb2.SamplingParams
    trace: _common_pb2.TraceContext
    media: _containers.RepeatedCompositeFieldContainer[_common_pb2.MediaInput]
    deadline_s: float
    attempt: int
    def __init__(
        self,
        request_id: str | None = ...,
        epoch: int | None = ...,
        decode_instance_id: str | None = ...,
        decode_instance_epoch: int | None = ...,
        decode_peer: _common_pb2.TransferPeer | _Mapping | None = ...,
        pages: _common_pb2.PageDescriptors | _Mapping | None = ...,
        layout: _common_pb2.KVLayout | _Mapping | None = ...,
        prompt_token_ids: _Iterable[int] | None = ...,
        skip_tokens: int | None = ...,
        sampling: _common_pb2.SamplingParams | _Mapping | None = ...,
        trace: _common_pb2.TraceContext | _Mapping | None = ...,
        media: _Iterable[_common_pb2.MediaInput | _Mapping] | None = ...,
        deadline_s: float | None = ...,
        attempt: int | None = ...,
    ) -> None: ...

class PrefillTimings(_message.Message):
    __slots__ = ("queue_s", "compute_s", "transfer_s", "total_s")
    QUEUE_S_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_S_FIELD_NUMBER: _ClassVar[int]
    TOTAL_S_FIELD_NUMBER: _ClassVar[int]
    queue_s: float
    compute_s: float
    transfer_s: float
    total_s: float
    def __init__(
        self,
        queue_s: float | None = ...,
        compute_s: float | None = ...,
        transfer_s: float | None = ...,
        total_s: float | None = ...,
    ) -> None: ...

class PrefillResponse(_message.Message):
    __slots__ = (
        "request_id",
        "epoch",
        "first_token_id",
        "first_logprob",
        "checksum_algorithm",
        "checksum",
        "pages_written",
        "bytes_written",
        "cached_tokens",
        "computed_tokens",
        "timings",
        "prefill_instance_id",
        "finish_reason",
        "prompt_logprobs",
    )
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    PAGES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    epoch: int
    first_token_id: int
    first_logprob: _common_pb2.TokenLogprob
    checksum_algorithm: ChecksumAlgorithm
    checksum: int
    pages_written: int
    bytes_written: int
    cached_tokens: int
    computed_tokens: int
    timings: PrefillTimings
    prefill_instance_id: str
    finish_reason: _common_pb2.FinishReason
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprob]
    def __init__(
        self,
        request_id: str | None = ...,
        epoch: int | None = ...,
        first_token_id: int | None = ...,
        first_logprob: _common_pb2.TokenLogprob | _Mapping | None = ...,
        checksum_algorithm: ChecksumAlgorithm | str | None = ...,
        checksum: int | None = ...,
        pages_written: int | None = ...,
        bytes_written: int | None = ...,
        cached_tokens: int | None = ...,
        computed_tokens: int | None = ...,
        timings: PrefillTimings | _Mapping | None = ...,
        prefill_instance_id: str | None = ...,
        finish_reason: _common_pb2.FinishReason | str | None = ...,
        prompt_logprobs: _Iterable[_common_pb2.TokenLogprob | _Mapping] | None = ...,
    ) -> None: ...

class EncodeRequest(_message.Message):
    __slots__ = ("request_id", "media", "trace", "destination_peer", "destination")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MEDIA_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_PEER_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    media: _containers.RepeatedCompositeFieldContainer[_common_pb2.MediaInput]
    trace: _common_pb2.TraceContext
    destination_peer: _common_pb2.TransferPeer
    destination: _common_pb2.PageDescriptors
    def __init__(
        self,
        request_id: str | None = ...,
        media: _Iterable[_common_pb2.MediaInput | _Mapping] | None = ...,
        trace: _common_pb2.TraceContext | _Mapping | None = ...,
        destination_peer: _common_pb2.TransferPeer | _Mapping | None = ...,
        destination: _common_pb2.PageDescriptors | _Mapping | None = ...,
    ) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("dtype", "shape", "data")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    dtype: _common_pb2.DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(
        self, dtype: _common_pb2.DType | str | None = ..., shape: _Iterable[int] | None = ..., data: bytes | None = ...
    ) -> None: ...

class MediaEmbedding(_message.Message):
    __slots__ = ("media_hash", "embedding", "cache_hit", "checksum")
    MEDIA_HASH_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    CACHE_HIT_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    media_hash: str
    embedding: Tensor
    cache_hit: bool
    checksum: int
    def __init__(
        self,
        media_hash: str | None = ...,
        embedding: Tensor | _Mapping | None = ...,
        cache_hit: bool | None = ...,
        checksum: int | None = ...,
    ) -> None: ...

class EncodeResponse(_message.Message):
    __slots__ = ("embeddings",)
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    embeddings: _containers.RepeatedCompositeFieldContainer[MediaEmbedding]
    def __init__(self, embeddings: _Iterable[MediaEmbedding | _Mapping] | None = ...) -> None: ...

class EmbedTokens(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Iterable[int] | None = ...) -> None: ...

class EmbedRequest(_message.Message):
    __slots__ = (
        "model",
        "texts",
        "normalize",
        "token_inputs",
        "truncate_prompt_tokens",
        "dimensions",
        "request_id",
        "trace",
    )
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_INPUTS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    model: str
    texts: _containers.RepeatedScalarFieldContainer[str]
    normalize: bool
    token_inputs: _containers.RepeatedCompositeFieldContainer[EmbedTokens]
    truncate_prompt_tokens: int
    dimensions: int
    request_id: str
    trace: _common_pb2.TraceContext
    def __init__(
        self,
        model: str | None = ...,
        texts: _Iterable[str] | None = ...,
        normalize: bool | None = ...,
        token_inputs: _Iterable[EmbedTokens | _Mapping] | None = ...,
        truncate_prompt_tokens: int | None = ...,
        dimensions: int | None = ...,
        request_id: str | None = ...,
        trace: _common_pb2.TraceContext | _Mapping | None = ...,
    ) -> None: ...

class EmbedResponse(_message.Message):
    __slots__ = ("embeddings", "prompt_tokens", "instance_id")
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    embeddings: Tensor
    prompt_tokens: int
    instance_id: str
    def __init__(
        self, embeddings: Tensor | _Mapping | None = ..., prompt_tokens: int | None = ..., instance_id: str | None = ...
    ) -> None: ...

class LookupRequest(_message.Message):
    __slots__ = ("block_hashes", "layout", "model", "lease_s", "trace")
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LEASE_S_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    layout: _common_pb2.KVLayout
    model: str
    lease_s: float
    trace: _common_pb2.TraceContext
    def __init__(
        self,
        block_hashes: _Iterable[int] | None = ...,
        layout: _common_pb2.KVLayout | _Mapping | None = ...,
        model: str | None = ...,
        lease_s: float | None = ...,
        trace: _common_pb2.TraceContext | _Mapping | None = ...,
    ) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("num_hit_pages", "tiers")
    NUM_HIT_PAGES_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    num_hit_pages: int
    tiers: _containers.RepeatedScalarFieldContainer[StorageTier]
    def __init__(self, num_hit_pages: int | None = ..., tiers: _Iterable[StorageTier | str] | None = ...) -> None: ...

class PutPagesRequest(_message.Message):
    __slots__ = ("request_id", "block_hashes", "layout", "source_peer", "source", "trace", "model", "backend")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_PEER_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    layout: _common_pb2.KVLayout
    source_peer: _common_pb2.TransferPeer
    source: _common_pb2.PageDescriptors
    trace: _common_pb2.TraceContext
    model: str
    backend: _common_pb2.TransferBackend
    def __init__(
        self,
        request_id: str | None = ...,
        block_hashes: _Iterable[int] | None = ...,
        layout: _common_pb2.KVLayout | _Mapping | None = ...,
        source_peer: _common_pb2.TransferPeer | _Mapping | None = ...,
        source: _common_pb2.PageDescriptors | _Mapping | None = ...,
        trace: _common_pb2.TraceContext | _Mapping | None = ...,
        model: str | None = ...,
        backend: _common_pb2.TransferBackend | str | None = ...,
    ) -> None: ...

class PutPagesResponse(_message.Message):
    __slots__ = ("pages_stored", "pages_present", "put_id", "indexes", "store_peer", "slots", "expires_s")
    PAGES_STORED_FIELD_NUMBER: _ClassVar[int]
    PAGES_PRESENT_FIELD_NUMBER: _ClassVar[int]
    PUT_ID_FIELD_NUMBER: _ClassVar[int]
    INDEXES_FIELD_NUMBER: _ClassVar[int]
    STORE_PEER_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_S_FIELD_NUMBER: _ClassVar[int]
    pages_stored: int
    pages_present: int
    put_id: int
    indexes: _containers.RepeatedScalarFieldContainer[int]
    store_peer: _common_pb2.TransferPeer
    slots: _common_pb2.PageDescriptors
    expires_s: float
    def __init__(
        self,
        pages_stored: int | None = ...,
        pages_present: int | None = ...,
        put_id: int | None = ...,
        indexes: _Iterable[int] | None = ...,
        store_peer: _common_pb2.TransferPeer | _Mapping | None = ...,
        slots: _common_pb2.PageDescriptors | _Mapping | None = ...,
        expires_s: float | None = ...,
    ) -> None: ...

class CommitPutRequest(_message.Message):
    __slots__ = ("put_id", "page_checksums", "abort")
    PUT_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    ABORT_FIELD_NUMBER: _ClassVar[int]
    put_id: int
    page_checksums: _containers.RepeatedScalarFieldContainer[int]
    abort: bool
    def __init__(
        self, put_id: int | None = ..., page_checksums: _Iterable[int] | None = ..., abort: bool | None = ...
    ) -> None: ...

class CommitPutResponse(_message.Message):
    __slots__ = ("pages_stored", "pages_rejected")
    PAGES_STORED_FIELD_NUMBER: _ClassVar[int]
    PAGES_REJECTED_FIELD_NUMBER: _ClassVar[int]
    pages_stored: int
    pages_rejected: int
    def __init__(self, pages_stored: int | None = ..., pages_rejected: int | None = ...) -> None: ...

class GetPagesRequest(_message.Message):
    __slots__ = (
        "request_id",
        "epoch",
        "block_hashes",
        "layout",
        "destination_peer",
        "destination",
        "trace",
        "model",
        "deadline_s",
    )
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_PEER_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    epoch: int
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    layout: _common_pb2.KVLayout
    destination_peer: _common_pb2.TransferPeer
    destination: _common_pb2.PageDescriptors
    trace: _common_pb2.TraceContext
    model: str
    deadline_s: float
    def __init__(
        self,
        request_id: str | None = ...,
        epoch: int | None = ...,
        block_hashes: _Iterable[int] | None = ...,
        layout: _common_pb2.KVLayout | _Mapping | None = ...,
        destination_peer: _common_pb2.TransferPeer | _Mapping | None = ...,
        destination: _common_pb2.PageDescriptors | _Mapping | None = ...,
        trace: _common_pb2.TraceContext | _Mapping | None = ...,
        model: str | None = ...,
        deadline_s: float | None = ...,
    ) -> None: ...

class GetPagesResponse(_message.Message):
    __slots__ = ("pages_written", "checksum_algorithm", "checksum", "transfer_s", "page_checksums", "pages_corrupt")
    PAGES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_S_FIELD_NUMBER: _ClassVar[int]
    PAGE_CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    PAGES_CORRUPT_FIELD_NUMBER: _ClassVar[int]
    pages_written: int
    checksum_algorithm: ChecksumAlgorithm
    checksum: int
    transfer_s: float
    page_checksums: _containers.RepeatedScalarFieldContainer[int]
    pages_corrupt: int
    def __init__(
        self,
        pages_written: int | None = ...,
        checksum_algorithm: ChecksumAlgorithm | str | None = ...,
        checksum: int | None = ...,
        transfer_s: float | None = ...,
        page_checksums: _Iterable[int] | None = ...,
        pages_corrupt: int | None = ...,
    ) -> None: ...

class KVStoreStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TierStats(_message.Message):
    __slots__ = ("tier", "used_bytes", "capacity_bytes", "pages")
    TIER_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    tier: StorageTier
    used_bytes: int
    capacity_bytes: int
    pages: int
    def __init__(
        self,
        tier: StorageTier | str | None = ...,
        used_bytes: int | None = ...,
        capacity_bytes: int | None = ...,
        pages: int | None = ...,
    ) -> None: ...

class KVStoreStatsResponse(_message.Message):
    __slots__ = (
        "tiers",
        "lookups",
        "hit_pages",
        "stored_pages",
        "evicted_pages",
        "corrupt_pages",
        "get_pages",
        "model",
        "layout",
    )
    TIERS_FIELD_NUMBER: _ClassVar[int]
    LOOKUPS_FIELD_NUMBER: _ClassVar[int]
    HIT_PAGES_FIELD_NUMBER: _ClassVar[int]
    STORED_PAGES_FIELD_NUMBER: _ClassVar[int]
    EVICTED_PAGES_FIELD_NUMBER: _ClassVar[int]
    CORRUPT_PAGES_FIELD_NUMBER: _ClassVar[int]
    GET_PAGES_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    tiers: _containers.RepeatedCompositeFieldContainer[TierStats]
    lookups: int
    hit_pages: int
    stored_pages: int
    evicted_pages: int
    corrupt_pages: int
    get_pages: int
    model: str
    layout: _common_pb2.KVLayout
    def __init__(
        self,
        tiers: _Iterable[TierStats | _Mapping] | None = ...,
        lookups: int | None = ...,
        hit_pages: int | None = ...,
        stored_pages: int | None = ...,
        evicted_pages: int | None = ...,
        corrupt_pages: int | None = ...,
        get_pages: int | None = ...,
        model: str | None = ...,
        layout: _common_pb2.KVLayout | _Mapping | None = ...,
    ) -> None: ...
