"""Sources and their order: defaults < YAML file < env < CLI < derived, each recorded in provenance."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.config import PassContext, Provenance, resolve
from shared.config.groups import CacheConfig, DiscoveryConfig


def _yaml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return str(path)


def test_default_has_default_provenance(ctx: PassContext) -> None:
    cfg = resolve("decode", env={}, ctx=ctx)
    assert cfg.cache.page_size == CacheConfig().page_size
    assert cfg.provenance["cache.page_size"] == Provenance("default")


def test_each_layer_overrides_the_one_below(tmp_path: Path, ctx: PassContext) -> None:
    path = _yaml(tmp_path, "page_size: 32\nmax_running_requests: 7\nlease_ttl_s: 9\n")
    env = {"PDRELAY_PAGE_SIZE": "64", "PDRELAY_MAX_RUNNING_REQUESTS": "8"}
    cfg = resolve("decode", ["--config", path, "--page-size", "128"], env=env, ctx=ctx)
    assert cfg.cache.page_size == 128  # cli beats env and file
    assert cfg.provenance["cache.page_size"] == Provenance("cli", "--page-size")
    assert cfg.scheduler.max_running_requests == 8  # env beats file
    assert cfg.provenance["scheduler.max_running_requests"] == Provenance("env", "PDRELAY_MAX_RUNNING_REQUESTS")
    assert cfg.discovery.lease_ttl_s == 9  # file beats default
    assert cfg.provenance["discovery.lease_ttl_s"] == Provenance("file", path)


def test_derived_beats_cli_when_the_device_forbids_it(ctx: PassContext) -> None:
    cfg = resolve("decode", ["--no-disable-cuda-graph"], env={}, ctx=ctx)
    assert cfg.device.device == "cpu"
    assert cfg.cuda_graph.disable_cuda_graph is True
    prov = cfg.provenance["cuda_graph.disable_cuda_graph"]
    assert prov.source == "derived" and "cpu" in prov.detail and "--no-disable-cuda-graph" in prov.detail
    assert str(prov).startswith("derived: cpu device has no CUDA graphs")


def test_config_flag_inline_form_and_flag_name_keys(tmp_path: Path, ctx: PassContext) -> None:
    path = _yaml(tmp_path, "page-size: 32\n--max-running-requests: 5\nmodel-path: /models/tiny\n")
    cfg = resolve("worker", [f"--config={path}"], env={}, ctx=ctx)
    assert (cfg.cache.page_size, cfg.scheduler.max_running_requests) == (32, 5)
    assert cfg.model.model == "/models/tiny"


def test_file_group_sections(tmp_path: Path, ctx: PassContext) -> None:
    # `model` is both a group and a field: a mapping under it is the section, a string is the field.
    path = _yaml(tmp_path, "model: /models/tiny\ncache:\n  page_size: 8\n  disable_radix_cache: true\n")
    cfg = resolve("prefill", ["--config", path], env={}, ctx=ctx)
    assert (cfg.model.model, cfg.cache.page_size, cfg.cache.disable_radix_cache) == ("/models/tiny", 8, True)
    path2 = _yaml(tmp_path, "model:\n  dtype: bfloat16\n")
    assert resolve("prefill", ["--config", path2], env={}, ctx=ctx).model.dtype == "bfloat16"


def test_file_values_are_typed_from_yaml(tmp_path: Path, ctx: PassContext) -> None:
    path = _yaml(
        tmp_path,
        "etcd_endpoints: [http://a:1, http://b:2]\ncuda_graph_bs: 4\n"
        "handoff_timeout_s: 2\nkv_cache_memory_bytes: 1GiB\nserved_model_name: null\n",
    )
    cfg = resolve("decode", ["--config", path], env={}, ctx=ctx)
    assert cfg.discovery.etcd_endpoints == ("http://a:1", "http://b:2")
    assert cfg.cuda_graph.cuda_graph_bs == (4,)
    assert cfg.disagg.handoff_timeout_s == 2.0 and isinstance(cfg.disagg.handoff_timeout_s, float)
    assert cfg.cache.kv_cache_memory_bytes == 1 << 30


def test_empty_file_changes_nothing(tmp_path: Path, ctx: PassContext) -> None:
    assert resolve("decode", ["--config", _yaml(tmp_path, "")], env={}, ctx=ctx) == resolve("decode", env={}, ctx=ctx)


def test_env_reads_only_twins_of_accepted_flags(ctx: PassContext) -> None:
    env = {"PDRELAY_API_KEY": "secret", "PDRELAY_NOT_A_FLAG": "1", "PDRELAY_CLUSTER": "blue"}
    cfg = resolve("decode", env=env, ctx=ctx)  # API_KEY is a gateway flag: ignored, not an error
    assert cfg.discovery.cluster == "blue"
    assert resolve("gateway", env=env, ctx=ctx).http.api_key == "secret"


@pytest.mark.parametrize(("text", "want"), [("1", True), ("true", True), ("0", False), ("False", False)])
def test_env_booleans(text: str, want: bool, ctx: PassContext) -> None:
    assert resolve("decode", env={"PDRELAY_LOG_JSON": text}, ctx=ctx).telemetry.log_json is want


def test_env_none_and_empty_mean_none_for_optional_fields(ctx: PassContext) -> None:
    for text in ("none", ""):
        cfg = resolve("decode", ["--context-length", "64"], env={"PDRELAY_CONTEXT_LENGTH": text}, ctx=ctx)
        assert cfg.model.context_length == 64  # cli still wins
        assert resolve("decode", env={"PDRELAY_CONTEXT_LENGTH": text}, ctx=ctx).model.context_length is None
        assert (
            resolve("decode", env={"PDRELAY_CONTEXT_LENGTH": text}, ctx=ctx).provenance["model.context_length"].source
            == "env"
        )


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        (["--log-json"], True),
        (["--log-json", "false"], False),
        (["--log-json", "true"], True),
        (["--log-json=no"], False),
        (["--no-log-json"], False),
        (["--log-json", "--no-log-json"], False),  # last one wins
        (["--no-log-json", "--log-json"], True),
    ],
)
def test_cli_boolean_forms(argv: list[str], want: bool, ctx: PassContext) -> None:
    assert resolve("decode", argv, env={}, ctx=ctx).telemetry.log_json is want


def test_cli_optional_bool_takes_none(make_ctx) -> None:
    gpu = make_ctx(cuda=True, gpus=1)
    cfg = resolve("decode", ["--disable-decode-cuda-graph", "none"], env={}, ctx=gpu)
    assert cfg.cuda_graph.disable_decode_cuda_graph is False  # None was given, so the role default is derived
    assert cfg.provenance["cuda_graph.disable_decode_cuda_graph"].source == "derived"


def test_cli_tuples_comma_separated_and_repeated(ctx: PassContext) -> None:
    cfg = resolve("decode", ["--etcd", "http://a:1,http://b:2", "--etcd-endpoints", "http://c:3"], env={}, ctx=ctx)
    assert cfg.discovery.etcd_endpoints == ("http://a:1", "http://b:2", "http://c:3")
    assert resolve("decode", ["--etcd-endpoints", ""], env={}, ctx=ctx).discovery.etcd_endpoints == ()
    assert DiscoveryConfig().etcd_endpoints != ()


def test_cli_alias_is_recorded_as_typed(ctx: PassContext) -> None:
    cfg = resolve("gateway", ["--model-path", "/models/tiny", "--nats=nats://h:1"], env={}, ctx=ctx)
    assert cfg.model.model == "/models/tiny"
    assert cfg.provenance["model.model"] == Provenance("cli", "--model-path")
    assert cfg.bus.nats_url == "nats://h:1"


def test_cli_value_may_be_negative_looking(ctx: PassContext) -> None:
    # a value that starts with a single dash is a value, not a flag; here it fails the bound, named as such
    from shared.config import ConfigError

    with pytest.raises(ConfigError, match=r"--random-seed -1 is below the minimum 0"):
        resolve("decode", ["--random-seed", "-1"], env={}, ctx=ctx)


def test_byte_sizes_accept_units(ctx: PassContext) -> None:
    cfg = resolve("kvstore", ["--kvstore-dram-bytes", "512MiB", "--kvstore-disk-bytes", "2GB"], env={}, ctx=ctx)
    assert cfg.kvstore.kvstore_dram_bytes == 512 * 1024 * 1024
    assert cfg.kvstore.kvstore_disk_bytes == 2 * 1000**3


def test_os_environ_is_the_default_env(monkeypatch: pytest.MonkeyPatch, ctx: PassContext) -> None:
    monkeypatch.setenv("PDRELAY_CLUSTER", "from-environ")
    assert resolve("decode", ctx=ctx).discovery.cluster == "from-environ"
