"""What an instance registers in etcd, and where: `/pdrelay/<cluster>/instances/<role>/<instance-id>` -> JSON.

The value is a frozen msgspec Struct, decoded against its declared type on read (a foreign or broken value is
skipped with a log line, never trusted). The epoch increases every time the instance (re-)registers; peers use it
to fence a restarted or partitioned instance whose old work must not be accepted any more.
"""

from __future__ import annotations

import enum
import re

import msgspec

from shared.modelspec.kv_layout import KVLayout

ROOT = "/pdrelay"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")


class InstanceState(enum.StrEnum):
    STARTING = "starting"  # registered, warming up: not routable yet
    READY = "ready"
    DRAINING = "draining"  # finishing in-flight work, refusing new work; the key disappears when done


class Capacity(msgspec.Struct, frozen=True, kw_only=True):
    max_running_requests: int = 0
    num_pages: int = 0  # KV pages in the pool (0: no KV cache, e.g. the gateway)
    page_size: int = 0
    tp_size: int = 0  # tensor-parallel ranks (processes) of an engine instance (0: not an engine)


class Modality(enum.StrEnum):
    """What an encoder instance turns into vectors."""

    EMBEDDING = "embedding"  # texts / token ids -> one sentence embedding each (/v1/embeddings)
    IMAGE = "image"  # images -> embeddings a vision-language model's prefill splices into its prompt


class EncoderInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What an encoder serves (role "encoder" only)."""

    modalities: tuple[Modality, ...] = ()
    embedding_model: str = ""  # served name of its embedding model ("" when none)
    embedding_dim: int = 0
    max_seq_len: int = 0  # tokens per embedding input, special tokens included
    vision_model: str = ""  # served name of the vision-language model whose tower it runs ("" when none)


class InstanceInfo(msgspec.Struct, frozen=True, kw_only=True):
    cluster: str
    role: str
    instance_id: str
    grpc_address: str  # "host:port" of the gRPC server
    epoch: int = 0  # set by the registrar (0: not registered yet)
    state: InstanceState = InstanceState.STARTING
    model: str = ""
    kv_layout: KVLayout | None = None
    capacity: Capacity = Capacity()
    transfer_backend: str = ""  # "nixl" | "mooncake" | ""
    transfer_endpoint: str = ""  # how peers reach the transfer engine (backend-specific)
    metrics_address: str = ""  # "host:port" of /metrics
    http_address: str = ""  # "host:port" of the OpenAI API (gateway)
    host: str = ""
    pid: int = 0
    started_at: float = 0.0  # unix seconds
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    encoder: EncoderInfo | None = None  # role "encoder": its models and modalities

    def __post_init__(self) -> None:
        check_name("cluster", self.cluster)
        check_name("role", self.role)
        check_name("instance id", self.instance_id)

    @property
    def key(self) -> str:
        return instance_key(self.cluster, self.role, self.instance_id)


def check_name(what: str, value: str) -> None:
    """Names become etcd path segments and NATS subject tokens: letters, digits, '_' and '-'."""
    if not _NAME.match(value):
        raise ValueError(
            f"{what} {value!r} may only contain letters, digits, '_' and '-' (at most 128, starting "
            f"with a letter or digit); e.g. 'decode-1'"
        )


def cluster_prefix(cluster: str) -> str:
    return f"{ROOT}/{cluster}/"


def instances_prefix(cluster: str, role: str | None = None) -> str:
    """Prefix of every instance key of the cluster (of one role when given); ends with '/'."""
    base = f"{ROOT}/{cluster}/instances/"
    return base if role is None else f"{base}{role}/"


def instance_key(cluster: str, role: str, instance_id: str) -> str:
    return f"{instances_prefix(cluster, role)}{instance_id}"


def epoch_counter_key(cluster: str) -> str:
    """A cluster-wide counter: every registration takes the next value, so epochs never repeat in a cluster."""
    return f"{ROOT}/{cluster}/epoch"


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(InstanceInfo)


def encode_instance(info: InstanceInfo) -> bytes:
    return _encoder.encode(info)


def decode_instance(data: bytes) -> InstanceInfo:
    """Raises msgspec.DecodeError / msgspec.ValidationError / ValueError on a value that is not an InstanceInfo."""
    return _decoder.decode(data)
