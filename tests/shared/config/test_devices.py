"""--device cuda:N, --base-gpu-id / --gpu-id-step, CUDA_VISIBLE_DEVICES numbering, --ib-device and the transfer
wire."""

from __future__ import annotations

import pytest

from shared.config import ConfigError, resolve
from shared.config.devices import local_gpu_index, parse_simulated, process_gpus


def test_cuda_n_is_cuda_with_a_base_gpu(make_ctx) -> None:
    cfg = resolve("worker", ["--device", "cuda:3"], env={}, ctx=make_ctx(cuda=True, gpus=4))
    assert (cfg.device.device, cfg.device.base_gpu_id) == ("cuda", 3)
    assert "--device cuda:3" in cfg.provenance["device.base_gpu_id"].detail
    with pytest.raises(ConfigError, match=r"^--device cuda:3 and --base-gpu-id 2 name different GPUs"):
        resolve("worker", ["--device", "cuda:3", "--base-gpu-id", "2"], env={}, ctx=make_ctx(cuda=True, gpus=4))
    with pytest.raises(ConfigError, match=r"^--device gpu0 is not a device; use auto, cpu, cuda or cuda:N"):
        resolve("worker", ["--device", "gpu0"], env={}, ctx=make_ctx(cuda=True, gpus=4))
    with pytest.raises(ConfigError, match=r"^--device cuda:0 but torch sees no CUDA device"):
        resolve("worker", ["--device", "cuda:0"], env={}, ctx=make_ctx())


def test_the_process_gpus_must_exist(make_ctx) -> None:
    ctx = make_ctx(cuda=True, gpus=8)
    cfg = resolve("decode", ["--base-gpu-id", "4", "--gpu-id-step", "2", "--tp-size", "2"], env={}, ctx=ctx)
    assert process_gpus(cfg.device.base_gpu_id, cfg.device.gpu_id_step, 2) == (4, 6)
    with pytest.raises(
        ConfigError,
        match=r"^--tp-size 2 x --dp-size 1 from --base-gpu-id 6 with --gpu-id-step 2 needs cuda:6, cuda:8 but 8 "
        r"GPUs are visible \(cuda:0..cuda:7\)",
    ):
        resolve("decode", ["--base-gpu-id", "6", "--gpu-id-step", "2", "--tp-size", "2"], env={}, ctx=ctx)
    with pytest.raises(ConfigError, match=r"names cuda:9 but 8 GPUs are visible; use a GPU below 8"):
        resolve("encoder", ["--device", "cuda:9"], env={}, ctx=ctx)


def test_local_index_under_cuda_visible_devices() -> None:
    assert local_gpu_index(5, {}) == 5
    assert local_gpu_index(5, {"CUDA_VISIBLE_DEVICES": "5"}) == 0
    assert local_gpu_index(6, {"CUDA_VISIBLE_DEVICES": "4,6"}) == 1
    assert local_gpu_index(0, {"CUDA_VISIBLE_DEVICES": "GPU-1234"}) == 0  # own numbering
    with pytest.raises(ConfigError, match=r"--base-gpu-id 3 is not among this process's GPUs"):
        local_gpu_index(3, {"CUDA_VISIBLE_DEVICES": "4,6"})


def test_simulated_sizes() -> None:
    assert parse_simulated("8x80GiB").memory_bytes == 80 << 30
    assert parse_simulated("1x16GiB").count == 1 and parse_simulated("4X141GB").memory_bytes == 141 * 10**9
    for bad in ("8x80", "0x80GiB", "x80GiB", "8x80parsecs"):
        with pytest.raises(ConfigError, match="is not COUNTxMEMORY"):
            parse_simulated(bad)


def test_ib_device_is_checked_against_sysfs(make_ctx) -> None:
    rdma = make_ctx(cuda=True, gpus=1, rdma=("mlx5_0", "mlx5_1"))
    cfg = resolve("prefill", ["--ib-device", "mlx5_0,mlx5_1"], env={}, ctx=rdma)
    assert cfg.transfer.transfer_protocol == "rdma" and cfg.transfer.ucx_transports == ("rc", "cuda_copy", "cuda_ipc")
    with pytest.raises(ConfigError, match=r"^--ib-device mlx5_9 is not an RDMA device of this host \(mlx5_9; "):
        resolve("prefill", ["--ib-device", "mlx5_9"], env={}, ctx=rdma)
    with pytest.raises(ConfigError, match=r"this host has none \(/sys/class/infiniband is empty or missing\); drop"):
        resolve("decode", ["--disaggregation-ib-device", "mlx5_0"], env={}, ctx=make_ctx())


def test_transfer_protocol(make_ctx, ctx) -> None:
    cfg = resolve("decode", env={}, ctx=ctx)
    assert cfg.transfer.transfer_protocol == "tcp" and cfg.transfer.ucx_transports == ()  # cpu: unchanged
    with pytest.raises(ConfigError, match=r"^--transfer-protocol rdma needs the RDMA device to use; add --ib-device"):
        resolve("decode", ["--transfer-protocol", "rdma"], env={}, ctx=ctx)
    mine = resolve("decode", ["--ucx-transports", "tcp,cuda_copy"], env={}, ctx=make_ctx(cuda=True, gpus=1))
    assert mine.transfer.ucx_transports == ("tcp", "cuda_copy")
