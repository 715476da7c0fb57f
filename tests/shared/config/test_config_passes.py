"""Each resolution pass: its contract, its provenance, and the user values it must leave alone."""

from __future__ import annotations

import pytest

from shared.config import PASSES, ConfigError, PassContext, Provenance, StaticProbe, resolve
from shared.config import passes as P


def _derived(cfg, key: str) -> str:
    prov = cfg.provenance[key]
    assert prov.source == "derived", (key, prov)
    assert prov.detail, f"{key} derived without a reason"
    return prov.detail


def test_passes_are_named_functions_in_order() -> None:
    names = [p.__name__ for p in PASSES]
    assert len(names) == len(set(names))
    assert names[0] == "resolve_device" and names[-1] == "check_transfer_backend"
    assert all(p.__doc__ for p in PASSES), "every pass states its contract"


def test_passes_return_new_objects_and_leave_the_input_alone(ctx: PassContext) -> None:
    from shared.config import defaults

    before = defaults("decode")
    after = P.run_passes(before, ctx)
    assert before.device.device == "auto" and before.provenance["device.device"] == Provenance("default")
    assert after.device.device == "cpu" and after is not before


# -- device ---------------------------------------------------------------------------------------------------------
def test_device_auto(make_ctx) -> None:
    cfg = resolve("decode", env={}, ctx=make_ctx(cuda=False))
    assert cfg.device.device == "cpu" and "no CUDA" in _derived(cfg, "device.device")
    cfg = resolve("decode", env={}, ctx=make_ctx(cuda=True, gpus=1))
    assert cfg.device.device == "cuda" and "is_available" in _derived(cfg, "device.device")


def test_explicit_cuda_without_gpu_is_an_error(ctx: PassContext) -> None:
    with pytest.raises(ConfigError, match=r"^--device cuda but torch sees no CUDA device; use --device cpu"):
        resolve("decode", ["--device", "cuda"], env={}, ctx=ctx)


def test_real_probe_detects_this_host() -> None:
    import torch

    cfg = resolve("gateway", env={}, ctx=PassContext(check_transfer_backends=False))
    assert cfg.device.device == ("cuda" if torch.cuda.is_available() else "cpu")


def test_parallel_conflicts(make_ctx, ctx: PassContext) -> None:
    # tensor parallelism runs one process per rank: on cpu the ranks share the cores
    assert resolve("worker", ["--tp-size", "2"], env={}, ctx=ctx).parallel.tp_size == 2
    with pytest.raises(ConfigError, match=r"--tp-size 4 x --dp-size 1 needs 4 GPUs but 2 are visible"):
        resolve("decode", ["--tp-size", "4"], env={}, ctx=make_ctx(cuda=True, gpus=2))
    assert resolve("decode", ["--tp-size", "2"], env={}, ctx=make_ctx(cuda=True, gpus=2)).parallel.tp_size == 2
    # data-parallel replicas are not built: refused, never silently ignored
    with pytest.raises(ConfigError, match=r"^--dp-size 2 is not supported yet \(an instance runs one engine\); use"):
        resolve("decode", ["--dp-size", "2"], env={}, ctx=ctx)


def test_dtypes(make_ctx, ctx: PassContext) -> None:
    cpu = resolve("decode", env={}, ctx=ctx)
    assert (cpu.model.dtype, cpu.cache.kv_cache_dtype) == ("float32", "float32")
    _derived(cpu, "model.dtype"), _derived(cpu, "cache.kv_cache_dtype")
    gpu = resolve("decode", env={}, ctx=make_ctx(cuda=True, gpus=1))
    assert (gpu.model.dtype, gpu.cache.kv_cache_dtype) == ("bfloat16", "bfloat16")
    mixed = resolve("decode", ["--dtype", "float16"], env={}, ctx=ctx)
    assert mixed.cache.kv_cache_dtype == "float16" and mixed.provenance["model.dtype"].source == "cli"
    kept = resolve("decode", ["--kv-cache-dtype", "bfloat16"], env={}, ctx=ctx)
    assert kept.cache.kv_cache_dtype == "bfloat16" and kept.provenance["cache.kv_cache_dtype"].source == "cli"


ZEN4 = "fpu sse2 avx avx2 fma avx512f avx512dq avx512bw avx512vl avx512_bf16 avx512_vnni"
SKYLAKE_X = "fpu sse2 avx avx2 fma avx512f avx512dq avx512bw avx512vl"
ZEN3 = "fpu sse2 avx avx2 fma"


@pytest.mark.parametrize(
    ("flags", "compiler", "dtype", "why"),
    [
        (ZEN4, True, "bfloat16", "avx512_bf16 runs the native bf16 kernels"),
        (ZEN4 + " amx_bf16 amx_tile", True, "bfloat16", "AMX-BF16 present"),
        (ZEN4, False, "float32", "no C compiler"),
        (SKYLAKE_X, True, "float32", "no avx512_bf16 (avx512 kernels run float32)"),
        (ZEN3, True, "float32", "no avx512_bf16 (avx2 kernels run float32)"),
        ("", True, "float32", "no avx512_bf16 (plain kernels"),
    ],
)
def test_cpu_dtype_auto_follows_the_native_kernels(make_ctx, flags: str, compiler: bool, dtype: str, why: str) -> None:
    """--dtype auto on cpu: bf16 where the native bf16 kernels run (as vLLM-cpu picks bf16 there), float32 elsewhere;
    `config show` says which flag decided. A user's --dtype is never overridden."""
    ctx = make_ctx(flags=frozenset(flags.split()), compiler=compiler)
    cfg = resolve("worker", env={}, ctx=ctx)
    assert (cfg.model.dtype, cfg.cache.kv_cache_dtype) == (dtype, dtype)
    assert why in _derived(cfg, "model.dtype")
    user = resolve("worker", ["--dtype", "float32"], env={}, ctx=ctx)
    assert user.model.dtype == "float32" and user.provenance["model.dtype"].source == "cli"
    assert resolve("decode", env={}, ctx=ctx).model.dtype == dtype == resolve("prefill", env={}, ctx=ctx).model.dtype
    encoder = resolve("encoder", env={}, ctx=ctx)  # its models run torch ops: float32 whatever the CPU
    assert encoder.model.dtype == "float32" and "for the encoder" in _derived(encoder, "model.dtype")


def test_threads(make_ctx, ctx: PassContext) -> None:
    cfg = resolve("decode", env={}, ctx=ctx)
    assert cfg.device.threads == 1 and "share" in _derived(cfg, "device.threads")
    bench = PassContext(probe=StaticProbe(cores=7, modules=frozenset({"nixl_cu12._api"})), exclusive_host=True)
    cfg = resolve("decode", env={}, ctx=bench)
    assert cfg.device.threads == 7 and "7 cores" in _derived(cfg, "device.threads")
    assert resolve("decode", ["--threads", "3"], env={}, ctx=bench).device.threads == 3


def test_threads_split_the_cores_among_the_engines_on_the_host() -> None:
    probe = StaticProbe(cores=2, modules=frozenset({"nixl_cu12._api"}))
    lone = resolve("worker", env={}, ctx=PassContext(probe=probe, engines_on_host=1))  # worker beside a gateway
    assert lone.device.threads == 2 and "1 engine process(es) share 2 cores" in _derived(lone, "device.threads")
    assert resolve("decode", env={}, ctx=PassContext(probe=probe, engines_on_host=2)).device.threads == 1
    assert resolve("decode", env={}, ctx=PassContext(probe=probe, engines_on_host=3)).device.threads == 1
    user = resolve("worker", ["--threads", "1"], env={}, ctx=PassContext(probe=probe, engines_on_host=1))
    assert user.device.threads == 1 and user.provenance["device.threads"].source == "cli"


def test_an_encoder_beside_llm_engines_takes_one_thread_and_is_left_out_of_their_split() -> None:
    probe = StaticProbe(cores=2, modules=frozenset({"nixl_cu12._api"}))
    ctx = PassContext(probe=probe, engines_on_host=1, encoders_on_host=1)  # `pdrelay up --worker 1 --prefill 0 ...`
    worker = resolve("worker", env={}, ctx=ctx)
    assert worker.device.threads == 2 and "1 engine process(es) share 2 cores" in _derived(worker, "device.threads")
    encoder = resolve("encoder", env={}, ctx=ctx)
    assert encoder.device.threads == 1 and "beside 1 LLM engine" in _derived(encoder, "device.threads")
    alone = resolve("encoder", env={}, ctx=PassContext(probe=StaticProbe(cores=8), encoders_on_host=2))
    assert alone.device.threads == 4 and "2 encoder process(es) share 8 cores" in _derived(alone, "device.threads")
    user = resolve("encoder", ["--threads", "2"], env={}, ctx=ctx)
    assert user.device.threads == 2 and user.provenance["device.threads"].source == "cli"


def test_a_kvstore_takes_one_thread_beside_the_engines() -> None:
    probe = StaticProbe(cores=2, modules=frozenset({"nixl_cu12._api"}))
    ctx = PassContext(probe=probe, engines_on_host=1, encoders_on_host=1)
    kvstore = resolve("kvstore", env={}, ctx=ctx)
    assert kvstore.device.threads == 1 and "page copies" in _derived(kvstore, "device.threads")
    assert resolve("worker", env={}, ctx=ctx).device.threads == 2  # not counted among the engines
    user = resolve("kvstore", ["--threads", "2"], env={}, ctx=ctx)
    assert user.device.threads == 2 and user.provenance["device.threads"].source == "cli"


def test_attention_backend(make_ctx, ctx: PassContext) -> None:
    # on cpu auto stays for the runner: native where a C compiler builds it, torch otherwise
    assert resolve("worker", env={}, ctx=ctx).kernels.attention_backend == "auto"
    assert resolve("worker", env={}, ctx=make_ctx(cuda=True, gpus=1)).kernels.attention_backend == "triton"
    with pytest.raises(ConfigError, match=r"^--attention-backend native runs on cpu, not cuda"):
        resolve("worker", ["--attention-backend", "native"], env={}, ctx=make_ctx(cuda=True, gpus=1))
    assert resolve("worker", ["--attention-backend", "triton"], env={}, ctx=ctx).kernels.attention_backend == "triton"


def test_linear_backend(make_ctx, ctx: PassContext) -> None:
    # fp32 on cpu stays auto: the runner picks native (C kernel) over oneDNN, or oneDNN where no compiler builds it
    assert resolve("worker", env={}, ctx=ctx).kernels.linear_backend == "auto"
    # bf16 on cpu stays auto too: the runner picks the native bf16 GEMM where the CPU runs it, F.linear elsewhere
    assert resolve("worker", ["--dtype", "bfloat16"], env={}, ctx=ctx).kernels.linear_backend == "auto"
    assert resolve("worker", ["--dtype", "float16"], env={}, ctx=ctx).kernels.linear_backend == "torch"
    assert resolve("worker", env={}, ctx=make_ctx(cuda=True, gpus=1)).kernels.linear_backend == "torch"
    assert resolve("worker", ["--linear-backend", "torch"], env={}, ctx=ctx).kernels.linear_backend == "torch"
    with pytest.raises(
        ConfigError, match=r"^--linear-backend onednn runs on cpu, not cuda; use --linear-backend torch"
    ):
        resolve("worker", ["--linear-backend", "onednn"], env={}, ctx=make_ctx(cuda=True, gpus=1))
    with pytest.raises(
        ConfigError, match=r"^--linear-backend native runs on cpu, not cuda; use --linear-backend torch"
    ):
        resolve("worker", ["--linear-backend", "native"], env={}, ctx=make_ctx(cuda=True, gpus=1))
    assert resolve("worker", ["--linear-backend", "native"], env={}, ctx=ctx).kernels.linear_backend == "native"


def test_served_model_name(ctx: PassContext) -> None:
    cfg = resolve("gateway", env={}, ctx=ctx)
    assert cfg.model.served_model_name == "smollm2-135m-instruct"
    _derived(cfg, "model.served_model_name")
    assert (
        resolve("decode", ["--model", "/models/Llama-3-8B/"], env={}, ctx=ctx).model.served_model_name == "Llama-3-8B"
    )
    assert resolve("decode", ["--served-model-name", "x"], env={}, ctx=ctx).model.served_model_name == "x"
    assert resolve("decode", env={}, ctx=ctx).discovery.instance_id is None  # per process: the service fills it
    with pytest.raises(ConfigError, match=r"^--model '' is empty"):
        resolve("decode", ["--model", ""], env={}, ctx=ctx)


# -- CUDA graphs ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("role", "decode_off", "prefill_off"), [("prefill", True, False), ("decode", False, True), ("worker", False, True)]
)
def test_cuda_graph_defaults_per_role(role: str, decode_off: bool, prefill_off: bool, make_ctx) -> None:
    cfg = resolve(role, env={}, ctx=make_ctx(cuda=True, gpus=1))
    cg = cfg.cuda_graph
    assert (cg.disable_cuda_graph, cg.disable_decode_cuda_graph, cg.disable_prefill_cuda_graph) == (
        False,
        decode_off,
        prefill_off,
    )
    assert cfg.provenance["cuda_graph.disable_cuda_graph"] == Provenance("default")
    _derived(cfg, "cuda_graph.disable_decode_cuda_graph"), _derived(cfg, "cuda_graph.disable_prefill_cuda_graph")


def test_cuda_graph_user_lock_wins_over_role_default(make_ctx) -> None:
    cfg = resolve("prefill", ["--no-disable-decode-cuda-graph"], env={}, ctx=make_ctx(cuda=True, gpus=1))
    assert cfg.cuda_graph.disable_decode_cuda_graph is False
    assert cfg.provenance["cuda_graph.disable_decode_cuda_graph"] == Provenance("cli", "--no-disable-decode-cuda-graph")


def test_cuda_graphs_off_on_cpu(ctx: PassContext) -> None:
    cfg = resolve("decode", env={}, ctx=ctx)
    cg = cfg.cuda_graph
    assert cg.disable_cuda_graph and cg.disable_decode_cuda_graph and cg.disable_prefill_cuda_graph
    assert _derived(cfg, "cuda_graph.disable_cuda_graph") == "cpu device has no CUDA graphs"
    assert cg.cuda_graph_bs == ()  # nothing is captured


def test_disable_all_conflicts_with_explicit_enable(make_ctx) -> None:
    gpu = make_ctx(cuda=True, gpus=1)
    with pytest.raises(
        ConfigError,
        match=r"--disable-decode-cuda-graph false conflicts with "
        r"--disable-cuda-graph true; drop one",
    ):
        resolve("decode", ["--disable-cuda-graph", "--disable-decode-cuda-graph", "false"], env={}, ctx=gpu)
    cfg = resolve("decode", ["--disable-cuda-graph"], env={}, ctx=gpu)
    assert cfg.cuda_graph.disable_decode_cuda_graph is True
    assert "turns off all" in _derived(cfg, "cuda_graph.disable_decode_cuda_graph")


def test_cuda_graph_batch_sizes_derived(make_ctx) -> None:
    gpu = make_ctx(cuda=True, gpus=1)
    cfg = resolve("decode", ["--cuda-graph-max-bs", "40"], env={}, ctx=gpu)
    assert cfg.cuda_graph.cuda_graph_bs == (1, 2, 4, 8, 16, 24, 32, 40)
    _derived(cfg, "cuda_graph.cuda_graph_bs")
    # a max that is not a multiple of 8 is captured itself, so padding always finds a graph
    assert resolve("decode", ["--cuda-graph-max-bs", "20"], env={}, ctx=gpu).cuda_graph.cuda_graph_bs == (
        1,
        2,
        4,
        8,
        16,
        20,
    )
    assert resolve("decode", ["--cuda-graph-max-bs", "3"], env={}, ctx=gpu).cuda_graph.cuda_graph_bs == (1, 2, 3)
    assert resolve("prefill", env={}, ctx=gpu).cuda_graph.cuda_graph_bs == ()  # no decode graphs on prefill


def test_cuda_graph_max_bs_capped_by_running_requests(make_ctx) -> None:
    gpu = make_ctx(cuda=True, gpus=1)
    cfg = resolve("decode", ["--max-running-requests", "12"], env={}, ctx=gpu)
    assert cfg.cuda_graph.cuda_graph_max_bs == 12 and "--max-running-requests 12" in _derived(
        cfg, "cuda_graph.cuda_graph_max_bs"
    )
    assert cfg.cuda_graph.cuda_graph_bs == (1, 2, 4, 8, 12)
    mine = resolve("decode", ["--max-running-requests", "12", "--cuda-graph-max-bs", "32"], env={}, ctx=gpu)
    assert mine.cuda_graph.cuda_graph_max_bs == 32  # the user's own value is kept


def test_cuda_graph_batch_sizes_user_list(make_ctx) -> None:
    gpu = make_ctx(cuda=True, gpus=1)
    cfg = resolve("decode", ["--cuda-graph-bs", "8,1,8,4"], env={}, ctx=gpu)
    assert cfg.cuda_graph.cuda_graph_bs == (1, 4, 8)
    assert "--cuda-graph-bs 8,1,8,4" in _derived(cfg, "cuda_graph.cuda_graph_bs")
    ordered = resolve("decode", ["--cuda-graph-bs", "1,2"], env={}, ctx=gpu)
    assert ordered.provenance["cuda_graph.cuda_graph_bs"] == Provenance("cli", "--cuda-graph-bs")
    with pytest.raises(ConfigError, match=r"^--cuda-graph-bs 1,65,0 has sizes outside 1\.\.64 \(0,65\)"):
        resolve("decode", ["--cuda-graph-bs", "1,65,0"], env={}, ctx=gpu)


# -- memory and scheduling --------------------------------------------------------------------------------------------
def test_page_size_power_of_two(ctx: PassContext) -> None:
    with pytest.raises(ConfigError) as info:
        resolve("prefill", ["--page-size", "12"], env={}, ctx=ctx)
    assert str(info.value) == "--page-size 12 must be a power of two (got 12); try 16"
    with pytest.raises(ConfigError, match=r"try 128$"):
        resolve("decode", ["--page-size", "100"], env={}, ctx=ctx)
    for ok in (1, 2, 64, 1024):
        assert resolve("decode", ["--page-size", str(ok)], env={}, ctx=ctx).cache.page_size == ok


def test_context_length_holds_a_page(ctx: PassContext) -> None:
    with pytest.raises(ConfigError, match=r"^--context-length 16 is shorter than one KV page \(--page-size 32\)"):
        resolve("decode", ["--context-length", "16", "--page-size", "32"], env={}, ctx=ctx)
    assert resolve("decode", ["--context-length", "32", "--page-size", "32"], env={}, ctx=ctx)


def test_kv_memory_budget(make_ctx) -> None:
    small = resolve("decode", env={}, ctx=make_ctx(memory_bytes=1 << 30))
    assert small.cache.kv_cache_memory_bytes == int(0.9 * (1 << 30))
    assert "MemAvailable" in _derived(small, "cache.kv_cache_memory_bytes")
    big = resolve("decode", env={}, ctx=make_ctx(memory_bytes=64 << 30))
    assert big.cache.kv_cache_memory_bytes == 1 << 30
    assert "capped at 1.0 GiB" in _derived(big, "cache.kv_cache_memory_bytes")
    gpu = resolve(
        "decode", ["--mem-fraction-static", "0.5"], env={}, ctx=make_ctx(cuda=True, gpus=1, memory_bytes=80 << 30)
    )
    # on a GPU the memory plan sizes the pool from the weights (test_memory_plan.py); without them on disk, the
    # engine plans at start
    assert gpu.cache.kv_cache_memory_bytes == 0
    assert "memory plan at engine start" in _derived(gpu, "cache.kv_cache_memory_bytes")
    mine = resolve("decode", ["--kv-cache-memory-bytes", "1GiB"], env={}, ctx=make_ctx(memory_bytes=64 << 30))
    assert mine.cache.kv_cache_memory_bytes == 1 << 30
    assert mine.provenance["cache.kv_cache_memory_bytes"].source == "cli"
    pages = resolve("decode", ["--num-pages", "100"], env={}, ctx=make_ctx())
    assert pages.cache.kv_cache_memory_bytes == 0  # the page count sizes the pool
    with pytest.raises(ConfigError, match=r"--num-pages 100 and --kv-cache-memory-bytes 1073741824 both size"):
        resolve("decode", ["--num-pages", "100", "--kv-cache-memory-bytes", "1GiB"], env={}, ctx=make_ctx())


@pytest.mark.parametrize(
    ("cuda", "memory", "want"), [(False, 16 << 30, 512), (True, 24 << 30, 2048), (True, 80 << 30, 4096)]
)
def test_chunked_prefill_size_by_device(cuda: bool, memory: int, want: int, make_ctx) -> None:
    cfg = resolve("prefill", env={}, ctx=make_ctx(cuda=cuda, gpus=int(cuda), memory_bytes=memory))
    assert cfg.scheduler.chunked_prefill_size == want  # 8192 on a large GPU, capped by max-prefill-tokens 4096
    _derived(cfg, "scheduler.chunked_prefill_size")


def test_the_cpu_worker_takes_larger_chunks_than_the_split_roles(make_ctx) -> None:
    """The colocated worker's chunks share the engine with its decode steps (1024 balances TTFT and TPOT there);
    the prefill and decode roles keep 512; a chunk the user sets wins."""
    assert resolve("worker", env={}, ctx=make_ctx()).scheduler.chunked_prefill_size == 1024
    assert "TTFT and TPOT" in _derived(resolve("worker", env={}, ctx=make_ctx()), "scheduler.chunked_prefill_size")
    assert resolve("decode", env={}, ctx=make_ctx()).scheduler.chunked_prefill_size == 512
    mine = resolve("worker", ["--chunked-prefill-size", "256"], env={}, ctx=make_ctx())
    assert mine.scheduler.chunked_prefill_size == 256
    gpu = make_ctx(cuda=True, gpus=1, memory_bytes=24 << 30)
    assert resolve("worker", env={}, ctx=gpu).scheduler.chunked_prefill_size == 2048


def test_prefill_budget_reconciled(make_ctx, ctx: PassContext) -> None:
    big = make_ctx(cuda=True, gpus=1, memory_bytes=80 << 30)
    cfg = resolve("prefill", ["--max-prefill-tokens", "16384"], env={}, ctx=big)
    assert cfg.scheduler.chunked_prefill_size == 8192
    cfg = resolve("prefill", ["--chunked-prefill-size", "8000"], env={}, ctx=ctx)
    assert cfg.scheduler.max_prefill_tokens == 8000
    assert "must fit in one step" in _derived(cfg, "scheduler.max_prefill_tokens")
    with pytest.raises(
        ConfigError,
        match=r"^--chunked-prefill-size 8000 is larger than --max-prefill-tokens 1000; "
        r"a chunk must fit in one step",
    ):
        resolve("prefill", ["--chunked-prefill-size", "8000", "--max-prefill-tokens", "1000"], env={}, ctx=ctx)


# -- roles and services -------------------------------------------------------------------------------------------
def test_local_prefill_threshold_is_decode_only(ctx: PassContext) -> None:
    assert resolve("decode", ["--local-prefill-threshold", "64"], env={}, ctx=ctx).disagg.local_prefill_threshold == 64
    for role in ("prefill", "worker"):
        with pytest.raises(
            ConfigError,
            match=rf"^--local-prefill-threshold 64 applies to the decode role only, "
            rf"not '{role}'",
        ):
            resolve(role, ["--local-prefill-threshold", "64"], env={}, ctx=ctx)


def test_kvstore_disk_tier_needs_room(ctx: PassContext, tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"^--kvstore-disk-bytes 0 leaves no room in the disk tier"):
        resolve("kvstore", ["--kvstore-disk-dir", str(tmp_path), "--kvstore-disk-bytes", "0"], env={}, ctx=ctx)
    assert resolve("kvstore", ["--kvstore-disk-dir", str(tmp_path)], env={}, ctx=ctx).kvstore.kvstore_disk_dir


@pytest.mark.parametrize("role", ["prefill", "decode", "kvstore"])
def test_transfer_backend_must_be_installed(role: str, make_ctx) -> None:
    with pytest.raises(
        ConfigError,
        match=r"^--transfer-backend nixl is not available \(module nixl_cu12\._api is "
        r"not installed\); pip install nixl-cu12 .*--transfer-backend mooncake$",
    ):
        resolve(role, env={}, ctx=make_ctx(modules=frozenset()))
    with pytest.raises(
        ConfigError,
        match=r"libibverbs is not installed\); pip install "
        r"mooncake-transfer-engine-non-cuda and apt-get install libibverbs1",
    ):
        resolve(role, ["--transfer-backend", "mooncake"], env={}, ctx=make_ctx(libraries=frozenset()))
    skip = PassContext(probe=StaticProbe(), check_transfer_backends=False)
    assert resolve(role, env={}, ctx=skip).transfer.transfer_backend == "nixl"


def test_roles_without_transfer_skip_the_check(make_ctx) -> None:
    for role in ("gateway", "encoder", "worker"):
        assert resolve(role, env={}, ctx=make_ctx(modules=frozenset())).role == role


def test_real_probe_finds_modules_without_importing_them() -> None:
    import sys

    from shared.config.probe import HostProbe

    probe = HostProbe()
    assert probe.module_available("shared.config.values")
    assert not probe.module_available("shared.config.no_such_module")
    assert not probe.module_available("no_such_package_pdrelay.x")
    had = "nixl_cu12" in sys.modules
    probe.module_available("nixl_cu12._api")
    assert ("nixl_cu12" in sys.modules) == had
    memory, what = probe.device_memory("cpu")
    assert memory > 0 and what == "MemAvailable host RAM"


def test_install_hints_cover_exactly_the_declared_backends() -> None:
    from shared.config.catalog import specs_by_name

    assert set(P.TRANSFER_BACKENDS) == set(specs_by_name()["transfer_backend"].arg.choices or ())


@pytest.mark.gpu
def test_real_probe_on_a_gpu_host() -> None:
    import torch

    cfg = resolve("decode", env={}, ctx=PassContext(check_transfer_backends=False))
    assert cfg.device.device == "cuda" and cfg.model.dtype == "bfloat16"
    assert torch.cuda.mem_get_info()[1] > 0
    assert "memory plan" in cfg.provenance["cache.kv_cache_memory_bytes"].detail  # sized at engine start
    assert cfg.cuda_graph.disable_cuda_graph is False and cfg.cuda_graph.cuda_graph_bs[0] == 1
    assert cfg.kernels.attention_backend == "triton"
