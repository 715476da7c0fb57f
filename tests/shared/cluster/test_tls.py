"""Mutual TLS on the hops pdrelay owns, with certificates from `pdrelay certs` (shared.cluster.certs): gRPC between
services, etcd over https:// and NATS over tls:// (real servers), and the config checks of the TLS flags."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from shared.cluster.bus.client import Bus
from shared.cluster.certs import cert_paths, make_certs
from shared.cluster.errors import ControlPlaneUnavailable
from shared.cluster.etcd import connect_etcd
from shared.cluster.localcluster.servers import EtcdServer, NatsServer, free_port
from shared.cluster.tls import TlsFiles, listen, open_channel
from shared.config import ConfigError, resolve

pytestmark = pytest.mark.timeout(90)


def identity(certs: Path, name: str) -> TlsFiles:
    p = cert_paths(certs, name)
    return TlsFiles.load(str(certs / "ca.pem"), str(p.cert), str(p.key))


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("certs")
    make_certs(d, ("decode", "gateway", "etcd", "nats", "client"))
    return d


@pytest.fixture(scope="module")
def rogue(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Certificates of another CA: well-formed, but not the cluster's."""
    d = tmp_path_factory.mktemp("rogue")
    make_certs(d, ("gateway",))
    return d


async def _health(channel: grpc.aio.Channel) -> int:
    resp = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return int(resp.status)


async def test_grpc_mutual_tls(certs: Path, rogue: Path) -> None:
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(), server)
    port = listen(server, "127.0.0.1:0", identity(certs, "decode"))
    await server.start()
    address = f"127.0.0.1:{port}"
    try:
        async with open_channel(address, identity(certs, "gateway")) as ch:
            assert await _health(ch) == health_pb2.HealthCheckResponse.SERVING
        refused = {
            "plaintext": open_channel(address, None),
            "no client certificate": grpc.aio.secure_channel(
                address, grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes())
            ),
            "another CA's client certificate": grpc.aio.secure_channel(
                address,
                grpc.ssl_channel_credentials(
                    (certs / "ca.pem").read_bytes(),
                    (rogue / "gateway-key.pem").read_bytes(),
                    (rogue / "gateway.pem").read_bytes(),
                ),
            ),
            "server not trusted": open_channel(address, identity(rogue, "gateway")),
        }
        for what, ch in refused.items():
            async with ch:
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await _health(ch)
                assert e.value.code() == grpc.StatusCode.UNAVAILABLE, what
    finally:
        await server.stop(None)


@pytest.fixture
def tls_servers(tmp_path: Path, certs: Path) -> Iterator[tuple[EtcdServer, NatsServer]]:
    etcd = EtcdServer(data_dir=tmp_path / "etcd", port=free_port(), tls_dir=certs)
    nats = NatsServer(data_dir=tmp_path / "nats", port=free_port(), tls_dir=certs)
    etcd.start()
    try:
        nats.start()
        try:
            yield etcd, nats
        finally:
            nats.stop()
    finally:
        etcd.stop()


async def test_etcd_and_nats_over_tls(tls_servers: tuple[EtcdServer, NatsServer], certs: Path, rogue: Path) -> None:
    etcd, nats = tls_servers
    assert etcd.url.startswith("https://") and nats.url.startswith("tls://")
    client = await connect_etcd([etcd.url], tls=identity(certs, "client"), timeout_s=5)
    try:
        assert client.kv is not None
        await client.kv.put("/pdrelay/t/x", "1")
        assert (await client.kv.get("/pdrelay/t/x")).kvs[0].value == b"1"
    finally:
        await client.close()
    with pytest.raises(ControlPlaneUnavailable):
        await connect_etcd([etcd.url], tls=identity(rogue, "gateway"), timeout_s=2)
    with pytest.raises(ValueError, match="--tls-ca-file"):
        await connect_etcd([etcd.url], timeout_s=2)

    got: list[str] = []
    async with (
        Bus(nats.url, name="a", tls=identity(certs, "client")) as a,
        Bus(nats.url, name="b", tls=identity(certs, "decode")) as b,
    ):
        from shared.cluster.bus.drain import DrainCommand

        await b.subscribe("t.x", DrainCommand, lambda m, meta: got.append(m.instance_id))
        await b.flush()
        await a.publish("t.x", DrainCommand(instance_id="i-1"))
        for _ in range(200):  # a shared box can be slow
            if got:
                break
            await asyncio.sleep(0.05)
    assert got == ["i-1"]
    for tls in (None, identity(rogue, "gateway")):
        with pytest.raises(ControlPlaneUnavailable):
            await Bus(nats.url, name="c", tls=tls).connect(timeout_s=2)


def test_tls_flags_are_checked(certs: Path) -> None:
    ca, cert, key = str(certs / "ca.pem"), str(certs / "decode.pem"), str(certs / "decode-key.pem")
    cfg = resolve("decode", ["--tls-ca-file", ca, "--tls-certfile", cert, "--tls-keyfile", key], env={})
    assert cfg.tls.tls_ca_file == ca and TlsFiles.from_config(cfg.tls) is not None
    with pytest.raises(ConfigError, match="also needs --tls-certfile and --tls-keyfile"):
        resolve("decode", ["--tls-ca-file", ca], env={})
    with pytest.raises(ConfigError, match="--tls-certfile /nope does not exist"):
        resolve("prefill", ["--tls-ca-file", ca, "--tls-certfile", "/nope", "--tls-keyfile", key], env={})
    with pytest.raises(ConfigError, match="is https://"):
        resolve("decode", ["--etcd-endpoints", "https://127.0.0.1:2379"], env={})
    gw = ["--ssl-certfile", str(certs / "gateway.pem"), "--ssl-keyfile", str(certs / "gateway-key.pem")]
    assert resolve("gateway", gw, env={}).http.ssl_certfile == gw[1]
    with pytest.raises(ConfigError, match="--ssl-keyfile .* needs --ssl-certfile"):
        resolve("gateway", gw[2:], env={})
    with pytest.raises(ConfigError, match="--ssl-ca-certs .* has no effect without --ssl-certfile"):
        resolve("gateway", ["--ssl-ca-certs", ca], env={})
    with pytest.raises(ConfigError, match="does not exist"):
        resolve("gateway", [*gw, "--ssl-ca-certs", "/nope.pem"], env={})


def test_pem_errors_name_the_flag(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    with pytest.raises(ValueError, match=r"--tls-ca-file .*bad.pem: not a PEM file"):
        TlsFiles.load(str(bad), str(bad), str(bad))


def test_certs_reuse_the_ca_and_the_command_reports_errors(tmp_path: Path) -> None:
    import subprocess
    import sys

    from cryptography import x509

    first = make_certs(tmp_path, ("decode",))
    ca_before = (tmp_path / "ca.pem").read_bytes()
    make_certs(tmp_path, ("prefill",), sans=("10.0.0.7", "node-7.example"))
    assert (tmp_path / "ca.pem").read_bytes() == ca_before, "an existing CA must be reused"
    cert = x509.load_pem_x509_certificate((tmp_path / "prefill.pem").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "node-7.example" in sans.get_values_for_type(x509.DNSName)
    assert first["decode"].key.stat().st_mode & 0o777 == 0o600
    ok = subprocess.run(
        [sys.executable, "-m", "services.cli", "certs", "--out", str(tmp_path / "c"), "--name", "gateway"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ok.returncode == 0 and "gateway.pem" in ok.stdout, ok.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "services.cli", "certs", "--out", str(tmp_path / "c"), "--name", "../x"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2 and "certificate name" in bad.stderr and "Traceback" not in bad.stderr


def test_up_hands_each_role_its_certificate_and_the_admin_secret(tmp_path: Path, certs: Path) -> None:
    from shared.cluster.localcluster.plan import UpOptions, build_spec
    from shared.config import ResolvedConfig

    (tmp_path / "admin.secret").write_text("x" * 64)
    for name in ("prefill",):
        make_certs(certs, (name,))
    opts = UpOptions(
        run_dir=str(tmp_path), tls=True, tls_dir=str(certs), admin_secret_file=str(tmp_path / "admin.secret")
    )
    for role in ("gateway", "decode", "prefill"):
        spec = build_spec(role, 0, opts, "https://127.0.0.1:1", "tls://127.0.0.1:2", env={})
        cfg = ResolvedConfig.from_json(Path(spec.config_path).read_text())
        assert cfg.tls.tls_certfile == str(certs / f"{role}.pem") and cfg.tls.tls_ca_file == str(certs / "ca.pem")
        assert cfg.bus.admin_secret_file == str(tmp_path / "admin.secret")
        if role == "gateway":
            assert cfg.http.ssl_certfile == str(certs / "gateway.pem")
    own = str(certs / "client.pem"), str(certs / "client-key.pem")  # a user's own public certificate wins
    spec = build_spec(
        "gateway",
        0,
        UpOptions(run_dir=str(tmp_path), tls_dir=str(certs), extra=("--ssl-certfile", own[0], "--ssl-keyfile", own[1])),
        "https://127.0.0.1:1",
        "tls://127.0.0.1:2",
        env={},
    )
    assert ResolvedConfig.from_json(Path(spec.config_path).read_text()).http.ssl_certfile == own[0]
