"""Bad input: every message names the flag (or env var, or file key), the value, and the fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shared.config import ROLES, ConfigError, PassContext, resolve
from shared.config.roles import ROLE_GROUPS


def _err(role: str, argv: list[str], ctx: PassContext, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        resolve(role, argv, env=env or {}, ctx=ctx)
    return str(info.value)


def test_foreign_flag_names_the_roles_that_accept_it(ctx: PassContext) -> None:
    assert _err("decode", ["--api-key", "x"], ctx) == (
        "--api-key is not accepted by role 'decode'; roles that accept it: gateway"
    )


@pytest.mark.parametrize("role", ROLES)
def test_every_role_rejects_flags_of_groups_it_does_not_use(role: str, ctx: PassContext) -> None:
    from shared.config.catalog import all_specs

    foreign = [s for s in all_specs() if s.group not in ROLE_GROUPS[role]]
    assert foreign, f"role {role} uses every group?"
    for spec in foreign:
        accepting = [r for r in ROLES if spec.group in ROLE_GROUPS[r]]
        msg = _err(role, [spec.flag, "1"], ctx)
        assert msg == f"{spec.flag} is not accepted by role {role!r}; roles that accept it: {', '.join(accepting)}"


def test_foreign_key_in_file_is_rejected(tmp_path: Path, ctx: PassContext) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("port: 8001\nroutin_policy: x\n")
    assert "unknown key 'routin_policy'" in _err("gateway", ["--config", str(path)], ctx)
    path.write_text("routing_policy: least_load\n")
    msg = _err("decode", ["--config", str(path)], ctx)
    assert msg == f"'routing_policy' in {path} is not accepted by role 'decode'; roles that accept it: gateway"


def test_unknown_flag_suggests_the_closest(ctx: PassContext) -> None:
    assert _err("decode", ["--page-sise", "16"], ctx) == (
        "unknown flag --page-sise for role 'decode'; did you mean --page-size?"
    )
    assert _err("decode", ["--no-log-jsn"], ctx).endswith("did you mean --no-log-json?")
    assert "--help" in _err("decode", ["--zzzzzz"], ctx)


def test_no_form_only_for_booleans(ctx: PassContext) -> None:
    assert _err("decode", ["--no-page-size"], ctx).startswith("unknown flag --no-page-size")
    assert "takes no value" in _err("decode", ["--no-log-json=true"], ctx)


@pytest.mark.parametrize(
    ("argv", "pattern"),
    [
        (["--page-size", "abc"], r"^--page-size abc is not an integer; e\.g\. --page-size 16$"),
        (
            ["--mem-fraction-static", "lots"],
            r"^--mem-fraction-static lots is not a number; e\.g\. "
            r"--mem-fraction-static 0\.9$",
        ),
        (["--mem-fraction-static", "nan"], r"is not a finite number"),
        (["--log-json", "maybe"], r"^unexpected argument 'maybe' \(after --log-json\)"),
        (["--log-json=maybe"], r"^--log-json maybe is not true or false; use one of"),
        (["--kv-cache-memory-bytes", "4 parsecs"], r"is not an integer; .*units such as 4GiB"),
        (["--cuda-graph-bs", "1,,2"], r"^--cuda-graph-bs 1,,2 has an empty item"),
        (["--cuda-graph-bs", "1,x"], r"^--cuda-graph-bs 1,x is not an integer"),
    ],
)
def test_wrong_type(argv: list[str], pattern: str, ctx: PassContext) -> None:
    assert re.search(pattern, _err("decode", argv, ctx))


def test_unknown_choice_lists_choices_and_suggests(ctx: PassContext) -> None:
    msg = _err("decode", ["--dtype", "bfloat61"], ctx)
    assert msg == (
        "--dtype bfloat61 is not a valid choice; choose one of: auto, float32, bfloat16, float16 "
        "(did you mean bfloat16?)"
    )


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        (["--mem-fraction-static", "0.999"], "--mem-fraction-static 0.999 is above the maximum 0.99; use at most 0.99"),
        (["--page-size", "0"], "--page-size 0 is below the minimum 1; use at least 1"),
        (["--lease-ttl-s", "601"], "--lease-ttl-s 601 is above the maximum 600; use at most 600"),
        (["--stream-interval", "0"], "--stream-interval 0 is below the minimum 1; use at least 1"),
    ],
)
def test_out_of_range(argv: list[str], want: str, ctx: PassContext) -> None:
    assert _err("decode", argv, ctx) == want


def test_env_errors_name_the_variable(ctx: PassContext) -> None:
    assert _err("decode", [], ctx, env={"PDRELAY_PAGE_SIZE": "big"}) == (
        "PDRELAY_PAGE_SIZE=big is not an integer; e.g. PDRELAY_PAGE_SIZE=16"
    )
    assert _err("decode", [], ctx, env={"PDRELAY_LOG_LEVEL": "loud"}).startswith(
        "PDRELAY_LOG_LEVEL=loud is not a valid choice"
    )


def test_file_errors_name_the_key_and_file(tmp_path: Path, ctx: PassContext) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("page_size: [1, 2]\n")
    assert _err("decode", ["--config", str(path)], ctx).startswith(f"page_size: [1, 2] in {path} is not an integer")
    path.write_text("cluster: 7\n")
    assert _err("decode", ["--config", str(path)], ctx) == f"cluster: 7 in {path} is not text; quote it"
    path.write_text("log_json: 3\n")
    assert "is not true or false" in _err("decode", ["--config", str(path)], ctx)
    path.write_text("page_size: 12\n")
    assert _err("decode", ["--config", str(path)], ctx) == (
        f"page_size: 12 in {path} must be a power of two (got 12); try 16"
    )
    path.write_text("cache:\n  dtype: float32\n")
    assert "sits under 'cache' but belongs to 'model'" in _err("decode", ["--config", str(path)], ctx)


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("a: [1, 2\n", r"is not valid YAML"),
        ("- 1\n- 2\n", r"must hold a mapping of settings"),
    ],
)
def test_bad_files(tmp_path: Path, text: str, pattern: str, ctx: PassContext) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert re.search(pattern, _err("decode", ["--config", str(path)], ctx))


def test_config_flag_errors(tmp_path: Path, ctx: PassContext) -> None:
    assert _err("decode", ["--config", str(tmp_path / "missing.yaml")], ctx).endswith("no such file; check the path")
    assert _err("decode", ["--config"], ctx).startswith("--config needs a file")
    assert _err("decode", ["--config="], ctx).endswith("no such file; check the path")
    path = tmp_path / "c.yaml"
    path.write_text("")
    assert "given twice" in _err("decode", ["--config", str(path), "--config", str(path)], ctx)


def test_missing_value_and_stray_arguments(ctx: PassContext) -> None:
    assert _err("decode", ["--page-size"], ctx) == "--page-size needs a value; e.g. --page-size 16"
    assert _err("decode", ["--page-size", "--log-json"], ctx).startswith("--page-size needs a value")
    assert _err("decode", ["decode"], ctx).startswith("unexpected argument 'decode'")


def test_unknown_role_suggests() -> None:
    with pytest.raises(ConfigError, match=r"unknown role 'decoder'; choose one of: .*did you mean decode\?"):
        resolve("decoder", env={})


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)
