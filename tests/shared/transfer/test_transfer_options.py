"""The transfer's wire from config: UCX transports and devices for NIXL, protocol and RDMA devices for Mooncake."""

from __future__ import annotations

from typing import Any

import pytest

from shared.config import PassContext, StaticProbe, resolve
from shared.serving.kv_transfer import transfer_options
from shared.transfer import mooncake_backend, nixl_backend
from shared.transfer.options import TransferOptions

ENGINES = frozenset({"nixl_cu12._api", "mooncake.engine"})


def test_defaults_change_nothing() -> None:
    ctx = PassContext(probe=StaticProbe(modules=ENGINES))
    opts = transfer_options(resolve("decode", env={}, ctx=ctx).transfer)
    assert opts == TransferOptions() and opts.ucx_env() == {}


def test_gpu_pool_over_rdma() -> None:
    probe = StaticProbe(cuda=True, gpus=1, modules=ENGINES, rdma=("mlx5_0", "mlx5_1"))
    cfg = resolve("prefill", ["--ib-device", "mlx5_0,mlx5_1"], env={}, ctx=PassContext(probe=probe))
    opts = transfer_options(cfg.transfer)
    assert opts == TransferOptions("rdma", ("mlx5_0", "mlx5_1"), ("rc", "cuda_copy", "cuda_ipc"))
    assert opts.ucx_env() == {"UCX_TLS": "rc,cuda_copy,cuda_ipc", "UCX_NET_DEVICES": "mlx5_0:1,mlx5_1:1"}


def test_nixl_sets_ucx_from_options_and_the_operator_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("UCX_TLS", "UCX_NET_DEVICES"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("UCX_NET_DEVICES", "mlx5_3:1")  # the operator's choice
    import os

    with nixl_backend.ucx_env_for_agent("10.0.0.5", TransferOptions("rdma", ("mlx5_0",), ("rc", "cuda_copy"))):
        assert os.environ["UCX_TLS"] == "rc,cuda_copy" and os.environ["UCX_NET_DEVICES"] == "mlx5_3:1"
    assert "UCX_TLS" not in os.environ  # what the agent needed is not left to the next agent or child process


def test_mooncake_starts_with_the_protocol_and_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []

    class FakeTE:
        def initialize(self, *args: Any) -> int:
            calls.append(args)
            return 0 if args[2] == "rdma" else -1

        def get_rpc_port(self) -> int:
            return 15123

    class Op:
        Write = 1

    monkeypatch.setattr(mooncake_backend, "import_mooncake", lambda: (FakeTE, object, Op))
    eng = mooncake_backend.MooncakeEngine("m", "10.0.0.5", "rdma", ("mlx5_0", "mlx5_1"))
    assert calls == [("10.0.0.5", "P2PHANDSHAKE", "rdma", "mlx5_0,mlx5_1")] and eng.address == "10.0.0.5:15123"
    with pytest.raises(Exception, match=r"protocol 'tcp' on mlx5_0 \(rc -1\).*pdrelay\[cuda\]"):
        mooncake_backend.MooncakeEngine("m2", "10.0.0.5", "tcp", ("mlx5_0",))


def test_a_loopback_agent_leaves_the_process_environment_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    """UCX's settings hold while the agent is made, then go: a process that made a loopback engine must not hand
    UCX_NET_DEVICES=lo to the services it starts on other hosts (they would advertise loopback only)."""
    import os

    from shared.transfer import create_engine

    for key in [k for k in os.environ if k.startswith("UCX_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("UCX_CMA_SEG_SIZE", "4m")  # the operator's own stays, and wins while the agent is made
    with nixl_backend.ucx_env_for_agent("127.0.0.1"):
        assert os.environ["UCX_NET_DEVICES"] == "lo" and os.environ["UCX_CMA_SEG_SIZE"] == "4m"
    assert {k: v for k, v in os.environ.items() if k.startswith("UCX_")} == {"UCX_CMA_SEG_SIZE": "4m"}
    with create_engine("nixl", name="env-check", host="127.0.0.1"):
        pass
    assert {k: v for k, v in os.environ.items() if k.startswith("UCX_")} == {"UCX_CMA_SEG_SIZE": "4m"}
