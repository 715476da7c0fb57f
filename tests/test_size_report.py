"""scripts/size_report.py: what it measures, what it leaves out, and when it fails."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location("size_report", Path(__file__).parents[1] / "scripts" / "size_report.py")
assert _SPEC is not None and _SPEC.loader is not None
size_report = importlib.util.module_from_spec(_SPEC)
sys.modules["size_report"] = size_report  # dataclasses look their module up while the class is made
_SPEC.loader.exec_module(size_report)


def _body(n: int) -> str:
    return "".join(f"    x{i} = {i}\n" for i in range(n))


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "shared" / "kernels").mkdir(parents=True)
    (tmp_path / "services").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "proto").mkdir()
    # a 6-line method inside a class, a 4-line nested function inside an 8-line function
    (tmp_path / "services" / "app.py").write_text(
        "class App:\n    def handle(self):\n" + _body(5).replace("    ", "        ") + "\n"
        "def outer():\n    def inner():\n" + _body(3).replace("    ", "        ") + "    return inner\n"
    )
    # a Triton kernel of 30 lines is excepted; its 3-line launcher is not
    (tmp_path / "shared" / "kernels" / "k.py").write_text(
        "@triton_kernel\ndef _k(x):\n"
        + _body(29)
        + "@triton.jit(do_not_specialize=['n'])\ndef _j(x):\n"
        + _body(40)
        + "def launch(x):\n"
        + _body(2)
    )
    (tmp_path / "tests" / "test_big.py").write_text("def test_x():\n" + _body(200))
    (tmp_path / "proto" / "x_pb2.py").write_text("def big():\n" + _body(200))
    return tmp_path


def test_measures_product_files_and_functions(repo: Path) -> None:
    files, funcs = size_report.measure(repo)
    assert [(i.path, i.lines) for i in files] == [("shared/kernels/k.py", 76), ("services/app.py", 14)]
    assert [(i.name, i.lines, i.line) for i in funcs] == [
        ("App.handle", 6, 2),
        ("outer", 6, 9),
        ("outer.inner", 4, 10),
        ("launch", 3, 74),
    ]


def test_limits_fail_unless_report_only(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = ["--root", str(repo)]
    assert size_report.main([*root, "--max-function-lines", "6", "--max-file-lines", "76"]) == 0
    assert size_report.main([*root, "--max-function-lines", "5"]) == 1
    assert "over 5 lines: 2 product functions" in capsys.readouterr().err
    assert size_report.main([*root, "--max-file-lines", "20", "--report-only"]) == 0
    err = capsys.readouterr().err
    assert "over 20 lines: 1 product files" in err and "shared/kernels/k.py" in err and "report only" in err


def test_lists_the_top_n(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert size_report.main(["--root", str(repo), "--top", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "largest files (2 product files):",
        "    76  shared/kernels/k.py",
        "largest functions (4 product functions, Triton kernels excepted):",
        "     6  services/app.py:2  App.handle",
    ]
