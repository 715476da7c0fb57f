from proto.pdrelay.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChecksumAlgorithm(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHECKSUM_ALGORITHM_UNSPECIFIED: _ClassVar[ChecksumAlgorithm]
    CHECKSUM_ALGORITHM_CRC32: _ClassVar[ChecksumAlgorithm]
    CHECKSUM_ALGORITHM_XXH3_64: _ClassVar[ChecksumAlgorithm]
    CHECKSUM_ALGORITHM_WORDSUM64: _ClassVar[ChecksumAlgorithm]

class StorageTier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STORAGE_TIER_UNSPECIFIED: _ClassVar[StorageTier]
    STORAGE_TIER_DRAM: _ClassVar[StorageTier]
    STORAGE_TIER_DISK: _ClassVar[StorageTier]
    STORAGE_TIER_PEER: _ClassVar[StorageTier]
CHECKSUM_ALGORITHM_UNSPECIFIED: ChecksumAlgorithm
CHECKSUM_ALGORITHM_CRC32: ChecksumAlgorithm
CHECKSUM_ALGORITHM_XXH3_64: ChecksumAlgorithm
CHECKSUM_ALGORITHM_WORDSUM64: ChecksumAlgorithm
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
    def __init__(self, instance_id: _Optional[str] = ..., grpc_address: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class DecodeRequest(_message.Message):
    __slots__ = ("request_id", "prompt_token_ids", "sampling", "model", "prefill", "media", "trace", "priority", "attempt")
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
    def __init__(self, request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., model: _Optional[str] = ..., prefill: _Optional[_Union[PrefillTarget, _Mapping]] = ..., media: _Optional[_Iterable[_Union[_common_pb2.MediaInput, _Mapping]]] = ..., trace: _Optional[_Union[_common_pb2.TraceContext, _Mapping]] = ..., priority: _Optional[int] = ..., attempt: _Optional[int] = ...) -> None: ...

class DecodeTimings(_message.Message):
    __slots__ = ("queue_s", "prefill_s", "transfer_s")
    QUEUE_S_FIELD_NUMBER: _ClassVar[int]
    PREFILL_S_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_S_FIELD_NUMBER: _ClassVar[int]
    queue_s: float
    prefill_s: float
    transfer_s: float
    def __init__(self, queue_s: _Optional[float] = ..., prefill_s: _Optional[float] = ..., transfer_s: _Optional[float] = ...) -> None: ...

class DecodeResponse(_message.Message):
    __slots__ = ("request_id", "token_ids", "logprobs", "finish_reason", "matched_stop", "usage", "error", "timings", "prefill_instance_id", "index", "prompt_logprobs")
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
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprob, _Mapping]]] = ..., finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., matched_stop: _Optional[_Union[_common_pb2.MatchedStop, _Mapping]] = ..., usage: _Optional[_Union[_common_pb2.Usage, _Mapping]] = ..., error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., timings: _Optional[_Union[DecodeTimings, _Mapping]] = ..., prefill_instance_id: _Optional[str] = ..., index: _Optional[int] = ..., prompt_logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprob, _Mapping]]] = ...) -> None: ...

class HandoffTicket(_message.Message):
    __slots__ = ("request_id", "epoch", "decode_instance_id", "decode_instance_epoch", "decode_peer", "pages", "layout", "prompt_token_ids", "skip_tokens", "sampling", "trace", "media", "deadline_s", "attempt", "checksums")
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
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
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
    checksums: _containers.RepeatedScalarFieldContainer[ChecksumAlgorithm]
    def __init__(self, request_id: _Optional[str] = ..., epoch: _Optional[int] = ..., decode_instance_id: _Optional[str] = ..., decode_instance_epoch: _Optional[int] = ..., decode_peer: _Optional[_Union[_common_pb2.TransferPeer, _Mapping]] = ..., pages: _Optional[_Union[_common_pb2.PageDescriptors, _Mapping]] = ..., layout: _Optional[_Union[_common_pb2.KVLayout, _Mapping]] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., skip_tokens: _Optional[int] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., trace: _Optional[_Union[_common_pb2.TraceContext, _Mapping]] = ..., media: _Optional[_Iterable[_Union[_common_pb2.MediaInput, _Mapping]]] = ..., deadline_s: _Optional[float] = ..., attempt: _Optional[int] = ..., checksums: _Optional[_Iterable[_Union[ChecksumAlgorithm, str]]] = ...) -> None: ...

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
    def __init__(self, queue_s: _Optional[float] = ..., compute_s: _Optional[float] = ..., transfer_s: _Optional[float] = ..., total_s: _Optional[float] = ...) -> None: ...

class PrefillResponse(_message.Message):
    __slots__ = ("request_id", "epoch", "first_token_id", "first_logprob", "checksum_algorithm", "checksum", "pages_written", "bytes_written", "cached_tokens", "computed_tokens", "timings", "prefill_instance_id", "finish_reason", "prompt_logprobs")
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
    def __init__(self, request_id: _Optional[str] = ..., epoch: _Optional[int] = ..., first_token_id: _Optional[int] = ..., first_logprob: _Optional[_Union[_common_pb2.TokenLogprob, _Mapping]] = ..., checksum_algorithm: _Optional[_Union[ChecksumAlgorithm, str]] = ..., checksum: _Optional[int] = ..., pages_written: _Optional[int] = ..., bytes_written: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., computed_tokens: _Optional[int] = ..., timings: _Optional[_Union[PrefillTimings, _Mapping]] = ..., prefill_instance_id: _Optional[str] = ..., finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., prompt_logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprob, _Mapping]]] = ...) -> None: ...

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
    def __init__(self, request_id: _Optional[str] = ..., media: _Optional[_Iterable[_Union[_common_pb2.MediaInput, _Mapping]]] = ..., trace: _Optional[_Union[_common_pb2.TraceContext, _Mapping]] = ..., destination_peer: _Optional[_Union[_common_pb2.TransferPeer, _Mapping]] = ..., destination: _Optional[_Union[_common_pb2.PageDescriptors, _Mapping]] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("dtype", "shape", "data")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    dtype: _common_pb2.DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, dtype: _Optional[_Union[_common_pb2.DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

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
    def __init__(self, media_hash: _Optional[str] = ..., embedding: _Optional[_Union[Tensor, _Mapping]] = ..., cache_hit: _Optional[bool] = ..., checksum: _Optional[int] = ...) -> None: ...

class EncodeResponse(_message.Message):
    __slots__ = ("embeddings",)
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    embeddings: _containers.RepeatedCompositeFieldContainer[MediaEmbedding]
    def __init__(self, embeddings: _Optional[_Iterable[_Union[MediaEmbedding, _Mapping]]] = ...) -> None: ...

class EmbedTokens(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class EmbedRequest(_message.Message):
    __slots__ = ("model", "texts", "normalize", "token_inputs", "truncate_prompt_tokens", "dimensions", "request_id", "trace")
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
    def __init__(self, model: _Optional[str] = ..., texts: _Optional[_Iterable[str]] = ..., normalize: _Optional[bool] = ..., token_inputs: _Optional[_Iterable[_Union[EmbedTokens, _Mapping]]] = ..., truncate_prompt_tokens: _Optional[int] = ..., dimensions: _Optional[int] = ..., request_id: _Optional[str] = ..., trace: _Optional[_Union[_common_pb2.TraceContext, _Mapping]] = ...) -> None: ...

class EmbedResponse(_message.Message):
    __slots__ = ("embeddings", "prompt_tokens", "instance_id")
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    embeddings: Tensor
    prompt_tokens: int
    instance_id: str
    def __init__(self, embeddings: _Optional[_Union[Tensor, _Mapping]] = ..., prompt_tokens: _Optional[int] = ..., instance_id: _Optional[str] = ...) -> None: ...

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
    def __init__(self, block_hashes: _Optional[_Iterable[int]] = ..., layout: _Optional[_Union[_common_pb2.KVLayout, _Mapping]] = ..., model: _Optional[str] = ..., lease_s: _Optional[float] = ..., trace: _Optional[_Union[_common_pb2.TraceContext, _Mapping]] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("num_hit_pages", "tiers")
    NUM_HIT_PAGES_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    num_hit_pages: int
    tiers: _containers.RepeatedScalarFieldContainer[StorageTier]
    def __init__(self, num_hit_pages: _Optional[int] = ..., tiers: _Optional[_Iterable[_Union[StorageTier, str]]] = ...) -> None: ...

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
    def __init__(self, request_id: _Optional[str] = ..., block_hashes: _Optional[_Iterable[int]] = ..., layout: _Optional[_Union[_common_pb2.KVLayout, _Mapping]] = ..., source_peer: _Optional[_Union[_common_pb2.TransferPeer, _Mapping]] = ..., source: _Optional[_Union[_common_pb2.PageDescriptors, _Mapping]] = ..., trace: _Optional[_Union[_common_pb2.TraceContext, _Mapping]] = ..., model: _Optional[str] = ..., backend: _Optional[_Union[_common_pb2.TransferBackend, str]] = ...) -> None: ...

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
    def __init__(self, pages_stored: _Optional[int] = ..., pages_present: _Optional[int] = ..., put_id: _Optional[int] = ..., indexes: _Optional[_Iterable[int]] = ..., store_peer: _Optional[_Union[_common_pb2.TransferPeer, _Mapping]] = ..., slots: _Optional[_Union[_common_pb2.PageDescriptors, _Mapping]] = ..., expires_s: _Optional[float] = ...) -> None: ...

class CommitPutRequest(_message.Message):
    __slots__ = ("put_id", "page_checksums", "abort")
    PUT_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    ABORT_FIELD_NUMBER: _ClassVar[int]
    put_id: int
    page_checksums: _containers.RepeatedScalarFieldContainer[int]
    abort: bool
    def __init__(self, put_id: _Optional[int] = ..., page_checksums: _Optional[_Iterable[int]] = ..., abort: _Optional[bool] = ...) -> None: ...

class CommitPutResponse(_message.Message):
    __slots__ = ("pages_stored", "pages_rejected")
    PAGES_STORED_FIELD_NUMBER: _ClassVar[int]
    PAGES_REJECTED_FIELD_NUMBER: _ClassVar[int]
    pages_stored: int
    pages_rejected: int
    def __init__(self, pages_stored: _Optional[int] = ..., pages_rejected: _Optional[int] = ...) -> None: ...

class GetPagesRequest(_message.Message):
    __slots__ = ("request_id", "epoch", "block_hashes", "layout", "destination_peer", "destination", "trace", "model", "deadline_s")
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
    def __init__(self, request_id: _Optional[str] = ..., epoch: _Optional[int] = ..., block_hashes: _Optional[_Iterable[int]] = ..., layout: _Optional[_Union[_common_pb2.KVLayout, _Mapping]] = ..., destination_peer: _Optional[_Union[_common_pb2.TransferPeer, _Mapping]] = ..., destination: _Optional[_Union[_common_pb2.PageDescriptors, _Mapping]] = ..., trace: _Optional[_Union[_common_pb2.TraceContext, _Mapping]] = ..., model: _Optional[str] = ..., deadline_s: _Optional[float] = ...) -> None: ...

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
    def __init__(self, pages_written: _Optional[int] = ..., checksum_algorithm: _Optional[_Union[ChecksumAlgorithm, str]] = ..., checksum: _Optional[int] = ..., transfer_s: _Optional[float] = ..., page_checksums: _Optional[_Iterable[int]] = ..., pages_corrupt: _Optional[int] = ...) -> None: ...

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
    def __init__(self, tier: _Optional[_Union[StorageTier, str]] = ..., used_bytes: _Optional[int] = ..., capacity_bytes: _Optional[int] = ..., pages: _Optional[int] = ...) -> None: ...

class KVStoreStatsResponse(_message.Message):
    __slots__ = ("tiers", "lookups", "hit_pages", "stored_pages", "evicted_pages", "corrupt_pages", "get_pages", "model", "layout")
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
    def __init__(self, tiers: _Optional[_Iterable[_Union[TierStats, _Mapping]]] = ..., lookups: _Optional[int] = ..., hit_pages: _Optional[int] = ..., stored_pages: _Optional[int] = ..., evicted_pages: _Optional[int] = ..., corrupt_pages: _Optional[int] = ..., get_pages: _Optional[int] = ..., model: _Optional[str] = ..., layout: _Optional[_Union[_common_pb2.KVLayout, _Mapping]] = ...) -> None: ...
