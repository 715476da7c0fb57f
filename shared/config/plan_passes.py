"""The memory plan as a resolution pass, and the plan of a resolved config (for `config show --plan`, `pdrelay up
--dry-run` and the engine's check at start). The arithmetic is memory_plan.py's."""

from __future__ import annotations

import dataclasses

from shared.config.checkpoint import ModelShape, read_model_shape
from shared.config.choices import Dtype, EngineKind, KVCacheDtype
from shared.config.context import PassContext
from shared.config.devices import DeviceKind, cuda_name, process_gpus
from shared.config.errors import ConfigError
from shared.config.memory_plan import MemoryPlan, PlanInputs, plan_memory
from shared.config.probe import HostProbe
from shared.config.resolved import ResolvedConfig
from shared.config.roles import Role

_KV_KEY = "cache.kv_cache_memory_bytes"


def _dtype_bytes(dtype: str) -> int:
    return 4 if dtype == Dtype.FLOAT32 else 1 if dtype == KVCacheDtype.FP8_E4M3 else 2


def user_kv_bytes(cfg: ResolvedConfig) -> int:
    """The KV budget the user gave (0: none; an explicit 0 also means "derive it", as the flag's help says)."""
    return cfg.cache.kv_cache_memory_bytes if cfg.is_user_set(_KV_KEY) else 0


def step_tokens(cfg: ResolvedConfig) -> int:
    """Tokens of the largest forward pass: the step's token budget (chunk), or one per running request when that
    is more (the rule of shared.engine.scheduler.max_step_tokens, which sizes the runner the same way)."""
    s = cfg.scheduler
    return max(min(s.max_prefill_tokens, s.chunked_prefill_size or s.max_prefill_tokens), s.max_running_requests)


def plan_inputs(cfg: ResolvedConfig, shape: ModelShape) -> PlanInputs:
    """The numbers of an engine role's resolved config the plan depends on."""
    cg = cfg.cuda_graph
    graphs = 0 if cg.disable_decode_cuda_graph or not cg.cuda_graph_bs else max(cg.cuda_graph_bs)
    return PlanInputs(
        shape=shape,
        dtype_bytes=_dtype_bytes(cfg.model.dtype),
        kv_dtype_bytes=_dtype_bytes(cfg.cache.kv_cache_dtype),
        page_size=cfg.cache.page_size,
        tp_size=cfg.parallel.tp_size,
        step_tokens=step_tokens(cfg),
        max_rows=cfg.scheduler.max_running_requests,
        graph_max_bs=graphs,
        context_length=cfg.model.context_length or shape.max_position_embeddings,
        fraction=cfg.cache.mem_fraction_static,
        user_kv_bytes=user_kv_bytes(cfg),
        user_num_pages=cfg.cache.num_pages,
    )


def process_devices(cfg: ResolvedConfig) -> tuple[str, ...]:
    """The devices of an engine or encoder process: cuda:N for each of its GPUs (host numbering), or cpu."""
    if cfg.device.device != DeviceKind.CUDA:
        return (str(cfg.device.device),)
    ranks = cfg.parallel.tp_size * cfg.parallel.dp_size if cfg.has("parallel") else 1
    return tuple(cuda_name(g) for g in process_gpus(cfg.device.base_gpu_id, cfg.device.gpu_id_step, ranks))


def plan_for_config(cfg: ResolvedConfig, probe: HostProbe, model_dir: str, *, reserved_bytes: int = 0) -> MemoryPlan:
    """The memory plan of an engine role's process with the free memory `probe` reports now.

    cuda: on the process's GPU with the least free memory, less `reserved_bytes` (another process of the cluster
    sharing it). cpu: host RAM; the KV pool is the resolved budget (never planned from the weights on cpu)."""
    shape = read_model_shape(model_dir)
    inputs = plan_inputs(cfg, shape)
    if cfg.device.device != DeviceKind.CUDA:
        memory, _ = probe.device_memory(DeviceKind.CPU)
        user = cfg.cache.kv_cache_memory_bytes or inputs.user_kv_bytes
        cpu = dataclasses.replace(inputs, user_kv_bytes=user, graph_max_bs=0)
        return plan_memory(cpu, device=DeviceKind.CPU, free=memory, total=memory)
    ranks = cfg.parallel.tp_size * cfg.parallel.dp_size
    measured = [(probe.gpu_memory(g), g) for g in process_gpus(cfg.device.base_gpu_id, cfg.device.gpu_id_step, ranks)]
    (free, total), gpu = min(measured)
    return plan_memory(inputs, device=cuda_name(gpu), free=max(0, free - reserved_bytes), total=total)


def plan_kv_cache_memory(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """On cuda, kv_cache_memory_bytes is what the memory plan leaves (weights from the checkpoint's headers,
    workspace, CUDA graphs) under --mem-fraction-static x the free memory of the process's GPU; a plan that does not
    fit is an error naming the numbers. When the weights are not on disk yet (a bundled model not prepared) it stays
    0: the engine plans at start. A user's --kv-cache-memory-bytes or --num-pages is checked, never changed."""
    if (
        not cfg.has("cache")
        or cfg.device.device != DeviceKind.CUDA
        or cfg.role not in (Role.PREFILL, Role.DECODE, Role.WORKER)
    ):
        return cfg
    if cfg.engine.engine is not EngineKind.REAL:
        return cfg
    model_dir = ctx.locate_model(cfg.model.model, cfg.model.model_cache_dir)
    if model_dir is None:
        if cfg.cache.num_pages or user_kv_bytes(cfg):
            return cfg
        return cfg.derive(
            _KV_KEY, 0, f"sized by the memory plan at engine start ({cfg.model.model} is not on disk yet)"
        )
    try:
        plan = plan_for_config(cfg, ctx.probe, model_dir, reserved_bytes=ctx.reserved_gpu_bytes)
    except (ValueError, KeyError) as e:
        raise ConfigError(f"--model {cfg.model.model}: cannot plan its memory ({e})") from None
    problem = plan.problem()
    if problem is not None:
        raise ConfigError(problem)
    if cfg.cache.num_pages or user_kv_bytes(cfg):
        return cfg
    return cfg.derive(_KV_KEY, plan.kv, plan.summary())
