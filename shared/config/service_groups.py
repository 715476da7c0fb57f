"""The groups of the services beside the engines: the encoder, the kvstore (and how engines use it), the planner.

Split from groups.py (which re-exports them) only to keep each file short; the same rules hold: one frozen dataclass
per concern, each field declared once as ``A[T, Arg(...)]``.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.config.choices import ENCODER_FAULTS, Fault, KVStoreUse, KVStoreWritePolicy, PlannerActuator
from shared.config.fields import A, Arg

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
        Fault,
        Arg(
            "Inject one failure into every encoder request (chaos testing; never in production)", choices=ENCODER_FAULTS
        ),
    ] = Fault.NONE


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

    kvstore_use: A[KVStoreUse, Arg("Use a kvstore of the cluster ('auto': when one is registered)")] = KVStoreUse.AUTO
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
        KVStoreWritePolicy,
        Arg(
            "Which pages engines store: write_through (every new full page: prefill's "
            "prompts, finished requests), write_back (finished requests only), selective "
            "(only requests that reused a cached prefix)",
        ),
    ] = KVStoreWritePolicy.WRITE_THROUGH


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
        PlannerActuator,
        Arg(
            "What carries out decisions: the local supervisor of `pdrelay up`, or Kubernetes",
        ),
    ] = PlannerActuator.LOCAL
    k8s_namespace: A[str | None, Arg("Namespace of the Deployments (default: the planner pod's own)")] = None
    k8s_deployments: A[tuple[str, ...], Arg("ROLE=DEPLOYMENT for each scaled role")] = (
        "prefill=prefill",
        "decode=decode",
    )
    planner_log_size: A[int, Arg("Decisions the planner keeps for `pdrelay planner log`", min=1)] = 1000
