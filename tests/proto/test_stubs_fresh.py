"""The checked-in stubs must be exactly what scripts/gen_proto.sh makes from the .proto files."""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def _generated(root: Path) -> list[str]:
    v1 = root / "pdrelay" / "v1"
    return sorted(p.name for p in v1.iterdir() if p.name.endswith(GENERATED_SUFFIXES))


def test_checked_in_stubs_match_a_fresh_generation(tmp_path: Path) -> None:
    out = tmp_path / "gen"
    r = subprocess.run(
        ["bash", str(REPO / "scripts" / "gen_proto.sh"), str(out)],
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    fresh, checked_in = _generated(out), _generated(REPO / "proto")
    assert fresh, "gen_proto.sh produced no stubs"
    assert fresh == checked_in, f"stub files differ: fresh {fresh} vs checked in {checked_in}; run scripts/gen_proto.sh"
    stale = [n for n in fresh if not filecmp.cmp(out / "pdrelay/v1" / n, REPO / "proto/pdrelay/v1" / n, shallow=False)]
    assert not stale, f"stale stubs {stale}: run scripts/gen_proto.sh and commit the result"


def test_every_proto_has_stubs() -> None:
    protos = sorted(p.stem for p in (REPO / "proto/pdrelay/v1").glob("*.proto"))
    assert protos, "no .proto files found"
    stubs = _generated(REPO / "proto")
    for stem in protos:
        for suffix in GENERATED_SUFFIXES:
            assert f"{stem}{suffix}" in stubs, f"missing stub {stem}{suffix}; run scripts/gen_proto.sh"
