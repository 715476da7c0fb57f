"""`pdrelay config show`: the table, --json with provenance, and clean failures (exit 2, no traceback)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from services.commands import config_show
from shared.config import ROLES, parse_role_args, role_help
from shared.config.catalog import role_specs

# The same answer on CPU and GPU hosts. (The transfer-engine check runs for real: nixl-cu12 is a declared dependency.)
_ENV_NO_CHECK = {"PDRELAY_DEVICE": "cpu"}


def _run(argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    for key in list(os.environ):
        if key.startswith("PDRELAY_"):
            monkeypatch.delenv(key)
    for key, value in _ENV_NO_CHECK.items():
        monkeypatch.setenv(key, value)
    parser = argparse.ArgumentParser(prog="pdrelay")
    sub = parser.add_subparsers(dest="command")
    config_show.add_parser(sub)
    ns, extra = parser.parse_known_args(argv)
    rc = ns._run(ns, extra)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_table(capsys, monkeypatch) -> None:
    rc, out, err = _run(["config", "show", "--role", "decode", "--page-size", "32"], capsys, monkeypatch)
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "role: decode" and len(lines) == 2 + len(role_specs("decode"))
    assert any(line.split()[1:5] == ["--page-size", "32", "cli:", "--page-size"] for line in lines[2:])


def test_json_has_provenance_for_every_field(capsys, monkeypatch) -> None:
    rc, out, _ = _run(["config", "show", "--role", "decode", "--json"], capsys, monkeypatch)
    assert rc == 0
    data = json.loads(out)
    assert data["role"] == "decode"
    assert set(data["provenance"]) == {s.key for s in role_specs("decode")}
    assert data["provenance"]["device.device"] == {"source": "env", "detail": "PDRELAY_DEVICE"}


def test_json_redacts_secrets(capsys, monkeypatch) -> None:
    rc, out, _ = _run(["config", "show", "--role", "gateway", "--json", "--api-key", "s3cret"], capsys, monkeypatch)
    assert rc == 0 and "s3cret" not in out and json.loads(out)["config"]["http"]["api_key"] == "<redacted>"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--role", "prefill", "--page-size", "12"], "--page-size 12 must be a power of two (got 12); try 16"),
        (
            ["--role", "decode", "--api-key", "x"],
            "--api-key is not accepted by role 'decode'; roles that accept it: gateway",
        ),
        (["--role", "decode", "--jsn"], "unknown flag --jsn for role 'decode'"),  # no prefix match onto --json
    ],
)
def test_bad_config_exits_2_with_the_message(argv: list[str], message: str, capsys, monkeypatch) -> None:
    rc, out, err = _run(["config", "show", *argv], capsys, monkeypatch)
    assert rc == 2 and out == ""
    assert err.startswith("pdrelay config show: error: ") and message in err
    assert "Traceback" not in err


def test_role_help_lists_every_accepted_flag() -> None:
    for role in ROLES:
        text = role_help(role)
        for spec in role_specs(role):
            assert spec.flag in text and spec.env in text
    assert "--api-key" not in role_help("decode")


def test_parse_role_args_exits_cleanly(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        parse_role_args("decode", ["--page-size", "12"], env={})
    assert info.value.code == 2
    assert (
        capsys.readouterr().err == "pdrelay serve decode: error: --page-size 12 must be a power of two "
        "(got 12); try 16\n"
    )
    with pytest.raises(SystemExit) as info:
        parse_role_args("decode", ["--help"], env={})
    assert info.value.code == 0 and "--page-size" in capsys.readouterr().out


def test_pdrelay_cli_end_to_end() -> None:
    """Through the real `pdrelay` entry point, as a user runs it (one subprocess; ~1-2 s)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PDRELAY_")}
    bad = subprocess.run(
        [sys.executable, "-m", "services.cli", "config", "show", "--role", "prefill", "--page-size", "12"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert bad.returncode == 2, bad.stderr
    assert "--page-size 12 must be a power of two (got 12); try 16" in bad.stderr
    assert "Traceback" not in bad.stderr
    good = subprocess.run(
        [sys.executable, "-m", "services.cli", "config", "show", "--role", "gateway", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert good.returncode == 0, good.stderr
    assert set(json.loads(good.stdout)["provenance"]) == {s.key for s in role_specs("gateway")}
