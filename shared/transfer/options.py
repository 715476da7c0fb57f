"""How a transfer engine reaches its peers, from the transfer settings (--transfer-protocol, --ib-device,
--ucx-transports): Mooncake's protocol and RDMA devices, NIXL's UCX transports and devices. The defaults are a host
pool over TCP / UCX's own choice, what every engine did before these settings existed."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TransferOptions:
    """protocol: Mooncake's ("tcp" | "rdma"); ib_devices: RDMA devices (e.g. ("mlx5_0",)); ucx_transports: UCX_TLS
    for NIXL (empty: UCX picks among what it has, cuda_copy / cuda_ipc included in its CUDA build)."""

    protocol: str = "tcp"
    ib_devices: tuple[str, ...] = ()
    ucx_transports: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, protocol: str, ib_device: str | None, ucx_transports: tuple[str, ...]) -> TransferOptions:
        """From the resolved transfer group (protocol already concrete: tcp or rdma)."""
        devices = tuple(d.strip() for d in (ib_device or "").split(",") if d.strip())
        return cls(protocol=protocol, ib_devices=devices, ucx_transports=tuple(ucx_transports))

    def ucx_env(self) -> dict[str, str]:
        """UCX variables these options ask for (the operator's own UCX_* variables still win)."""
        env = {}
        if self.ucx_transports:
            env["UCX_TLS"] = ",".join(self.ucx_transports)
        if self.ib_devices:
            env["UCX_NET_DEVICES"] = ",".join(f"{d}:1" for d in self.ib_devices)  # port 1 of each HCA
        return env
