"""ResolvedConfig: frozen, role-scoped attributes, per-process copies, lossless JSON, the table."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.config import ROLES, CacheConfig, ConfigError, PassContext, Provenance, ResolvedConfig, StaticProbe, resolve
from shared.config.catalog import role_specs

_CTX = PassContext(probe=StaticProbe(modules=frozenset({"nixl_cu12._api"})))


@pytest.mark.parametrize("role", ROLES)
def test_json_round_trip_every_role(role: str, ctx: PassContext) -> None:
    cfg = resolve(role, env={}, ctx=ctx)
    back = ResolvedConfig.from_json(cfg.to_json())
    assert back == cfg
    assert dict(back.provenance) == dict(cfg.provenance)
    for spec in role_specs(role):  # types survive, not just equal-comparing values (1 == 1.0 == True)
        assert type(back.get(spec.key)) is type(cfg.get(spec.key)), spec.key


def test_json_has_provenance_for_every_field(ctx: PassContext) -> None:
    data = json.loads(resolve("decode", env={}, ctx=ctx).to_json())
    keys = {s.key for s in role_specs("decode")}
    assert set(data["provenance"]) == keys
    assert {f"{g}.{f}" for g, fields in data["config"].items() for f in fields} == keys
    assert data["provenance"]["device.device"]["source"] == "derived"


@settings(max_examples=40, deadline=None)
@given(
    page_size=st.sampled_from([1, 2, 8, 16, 64, 256]),
    frac=st.floats(min_value=0.01, max_value=0.99, allow_nan=False),
    endpoints=st.lists(st.from_regex(r"http://[a-z]{1,8}:[1-9][0-9]{0,3}", fullmatch=True), max_size=3),
    cluster=st.text(
        alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=12
    ),
    context=st.one_of(st.none(), st.integers(min_value=256, max_value=1 << 20)),
    log_json=st.booleans(),
)
def test_json_round_trip_property(
    page_size: int, frac: float, endpoints: list[str], cluster: str, context: int | None, log_json: bool
) -> None:
    env = {"PDRELAY_CLUSTER": cluster, "PDRELAY_LOG_JSON": str(log_json).lower()}
    argv = [
        "--page-size",
        str(page_size),
        "--mem-fraction-static",
        repr(frac),
        "--etcd-endpoints",
        ",".join(endpoints),
        "--context-length",
        "none" if context is None else str(context),
    ]
    cfg = resolve("decode", argv, env=env, ctx=_CTX)
    assert cfg.cache.mem_fraction_static == frac and cfg.discovery.etcd_endpoints == tuple(endpoints)
    assert cfg.discovery.cluster == cluster and cfg.model.context_length == context
    back = ResolvedConfig.from_json(cfg.to_json(indent=None))
    assert back == cfg and hash(back) == hash(cfg)
    assert back.discovery.etcd_endpoints == tuple(endpoints) and isinstance(back.discovery.etcd_endpoints, tuple)


def test_from_json_rejects_damaged_input(ctx: PassContext) -> None:
    good = json.loads(resolve("decode", env={}, ctx=ctx).to_json())
    with pytest.raises(ConfigError, match="not valid JSON"):
        ResolvedConfig.from_json("{")
    with pytest.raises(ConfigError, match="version"):
        ResolvedConfig.from_json(json.dumps({**good, "version": 99}))
    bad = json.loads(json.dumps(good))
    del bad["config"]["cache"]["page_size"]
    with pytest.raises(ConfigError, match="wrong fields in group 'cache'"):
        ResolvedConfig.from_json(json.dumps(bad))
    bad = json.loads(json.dumps(good))
    bad["config"]["cache"]["page_size"] = "sixteen"
    with pytest.raises(ConfigError, match="cache.page_size: sixteen in the JSON config is not an integer"):
        ResolvedConfig.from_json(json.dumps(bad))
    bad = json.loads(json.dumps(good))
    bad["provenance"]["cache.page_size"] = {"source": "guess"}
    with pytest.raises(ConfigError, match="provenance for 'cache.page_size'"):
        ResolvedConfig.from_json(json.dumps(bad))
    bad = json.loads(json.dumps(good))
    bad["config"]["http"] = {}
    with pytest.raises(ConfigError, match="groups \\['http'\\] that role 'decode' does not use"):
        ResolvedConfig.from_json(json.dumps(bad))


def test_secrets_are_redacted_on_request(ctx: PassContext) -> None:
    cfg = resolve("gateway", ["--api-key", "s3cret"], env={}, ctx=ctx)
    assert "s3cret" in cfg.to_json()  # lossless for child processes
    assert "s3cret" not in cfg.to_json(redact=True)
    assert "s3cret" not in cfg.to_table() and "<redacted>" in cfg.to_table()
    assert "<redacted>" not in resolve("gateway", env={}, ctx=ctx).to_table()  # nothing to hide when unset


def test_groups_the_role_does_not_use_raise_attribute_error(ctx: PassContext) -> None:
    cfg = resolve("decode", env={}, ctx=ctx)
    with pytest.raises(AttributeError, match=r"role 'decode' has no 'http' settings; roles that have them: gateway"):
        cfg.http
    with pytest.raises(AttributeError, match=r"roles that have them: prefill, decode, kvstore"):
        resolve("worker", env={}, ctx=ctx).transfer
    with pytest.raises(AttributeError):
        cfg.no_such_group  # type: ignore[attr-defined]
    assert not hasattr(cfg, "kvstore") and hasattr(cfg, "cache")
    assert isinstance(cfg.cache, CacheConfig)
    assert list(cfg.groups()) == [g for g in cfg.groups()]  # display order, a plain copy
    assert set(resolve("gateway", env={}, ctx=ctx).groups()) == {
        "model",
        "tokenizer",
        "http",
        "device",
        "discovery",
        "bus",
        "grpc",
        "tls",
        "telemetry",
    }


def test_frozen_everywhere(ctx: PassContext) -> None:
    cfg = resolve("decode", env={}, ctx=ctx)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.role = "prefill"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.cache.page_size = 32  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.provenance["cache.page_size"] = Provenance("cli")  # type: ignore[index]
    with pytest.raises(TypeError):
        cfg.by_group["cache"] = None  # type: ignore[index]
    groups = cfg.groups()
    groups.clear()
    assert cfg.has("cache")


def test_with_value_makes_a_checked_copy(ctx: PassContext) -> None:
    cfg = resolve("decode", env={}, ctx=ctx)
    child = cfg.with_value("discovery.instance_id", "decode-0", Provenance("cli", "set by pdrelay up"))
    assert child.discovery.instance_id == "decode-0" and cfg.discovery.instance_id is None
    assert child.provenance["discovery.instance_id"] == Provenance("cli", "set by pdrelay up")
    assert child != cfg and child.cache is cfg.cache  # untouched groups are shared, not copied
    with pytest.raises(ConfigError, match="above the maximum"):
        cfg.with_value("cache.page_size", 4096, Provenance("cli"))


def test_pickle_and_deepcopy_keep_everything(ctx: PassContext) -> None:
    import copy
    import pickle

    cfg = resolve("prefill", ["--page-size", "32"], env={}, ctx=ctx)
    for clone in (pickle.loads(pickle.dumps(cfg)), copy.deepcopy(cfg)):
        assert clone == cfg and dict(clone.provenance) == dict(cfg.provenance)


def test_table_is_aligned_with_provenance(ctx: PassContext) -> None:
    cfg = resolve("decode", ["--page-size", "32"], env={"PDRELAY_CLUSTER": "blue"}, ctx=ctx)
    lines = cfg.to_table().splitlines()
    assert lines[0] == "role: decode"
    assert lines[1].split() == ["GROUP", "FLAG", "VALUE", "SOURCE"]
    rows = {line.split()[1]: line for line in lines[2:]}
    assert len(rows) == len(role_specs("decode"))
    assert rows["--page-size"].split()[2:] == ["32", "cli:", "--page-size"]
    assert rows["--cluster"].split()[2:] == ["blue", "env:", "PDRELAY_CLUSTER"]
    assert rows["--device"].split()[2:4] == ["cpu", "derived:"]
    assert rows["--cluster"].index("env:") == rows["--page-size"].index("cli:")  # one column for sources


def test_provenance_sources_are_closed() -> None:
    with pytest.raises(AssertionError):
        Provenance("guess")
    assert str(Provenance("default")) == "default"
    assert str(Provenance("derived", "cpu device has no CUDA graphs")) == "derived: cpu device has no CUDA graphs"
