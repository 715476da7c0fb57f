"""Resolution passes of the KV transfer engine: is it installed, which wire it speaks (Mooncake's protocol, NIXL's
UCX transports) and the RDMA devices it may use (--ib-device, SGLang's --disaggregation-ib-device)."""

from __future__ import annotations

from shared.config.choices import TransferProtocol
from shared.config.context import PassContext
from shared.config.devices import DeviceKind
from shared.config.resolved import ResolvedConfig

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
        "pip install mooncake-transfer-engine-non-cuda and apt-get install libibverbs1 (on GPU hosts: "
        "pip install 'pdrelay[cuda]', Mooncake's CUDA wheel)",
    ),
}
# UCX transports a GPU pool uses with RDMA (--ib-device): the NIC reads and writes device memory (GPUDirect RDMA);
# cuda_copy stages what it cannot, cuda_ipc moves between GPUs of one host.
GPU_RDMA_TRANSPORTS = ("rc", "cuda_copy", "cuda_ipc")


def check_ib_device(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """ib_device, when set, names RDMA devices of this host (/sys/class/infiniband), comma-separated."""
    if not cfg.has("transfer") or cfg.transfer.ib_device is None:
        return cfg
    text = cfg.transfer.ib_device
    wanted = [d.strip() for d in text.split(",") if d.strip()]
    have = ctx.probe.ib_devices()
    missing = [d for d in wanted if d not in have]
    if wanted and not missing:
        return cfg
    if not have:
        raise cfg.origin("transfer.ib_device").fail(
            text,
            "names an RDMA device, but this host has none (/sys/class/infiniband is empty or missing)",
            "drop it to move KV over TCP, or install the NIC's driver (rdma-core)",
        )
    raise cfg.origin("transfer.ib_device").fail(
        text,
        f"is not an RDMA device of this host ({', '.join(missing) or 'empty'}; /sys/class/infiniband has "
        f"{', '.join(have)})",
        f"use one of {', '.join(have)}",
    )


def resolve_transfer_protocol(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """transfer_protocol is tcp or rdma: auto -> rdma with --ib-device, else tcp; rdma needs --ib-device."""
    if not cfg.has("transfer"):
        return cfg
    proto, ib = cfg.transfer.transfer_protocol, cfg.transfer.ib_device
    if proto is TransferProtocol.RDMA and ib is None:
        raise cfg.origin("transfer.transfer_protocol").fail(
            "rdma", "needs the RDMA device to use", "add --ib-device (e.g. --ib-device mlx5_0) or use tcp"
        )
    if proto is not TransferProtocol.AUTO:
        return cfg
    if ib is not None:
        return cfg.derive("transfer.transfer_protocol", TransferProtocol.RDMA, f"auto: rdma over --ib-device {ib}")
    return cfg.derive("transfer.transfer_protocol", TransferProtocol.TCP, "auto: tcp (no --ib-device)")


def resolve_ucx_transports(cfg: ResolvedConfig, ctx: PassContext) -> ResolvedConfig:
    """ucx_transports: empty lets UCX choose among what it has (host pools, or GPUs without --ib-device: UCX's
    CUDA-aware build loads cuda_copy and cuda_ipc itself); a GPU pool with --ib-device gets rc, cuda_copy and
    cuda_ipc, so KV goes NIC <-> device memory instead of over TCP."""
    if not cfg.has("transfer") or cfg.transfer.ucx_transports or cfg.transfer.ib_device is None:
        return cfg
    if cfg.device.device != DeviceKind.CUDA:
        return cfg
    return cfg.derive(
        "transfer.ucx_transports", GPU_RDMA_TRANSPORTS, "GPU pool with --ib-device: RDMA to and from device memory"
    )


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
