"""The largest product files and functions: lines per Python file, and per function or method (read with `ast`).

Product code is the Python under shared/, services/, bench/ and proto/; tests, scripts and the generated protobuf
modules (*_pb2.py, *_pb2_grpc.py) are not. Excepted:
  - Triton JIT kernels (functions decorated with @triton_kernel, @triton.jit, @triton.autotune or
    @triton.heuristics): a kernel is one device function whose body the compiler needs in one piece;
  - the C kernels (shared/kernels/native/*.c): not Python, so never read here; `make lint` checks them with
    scripts/check_native.py.
A file counts every physical line; a function counts from its `def` to its last line (docstring and nested
functions included), so a nested function is listed on its own and also inside its parent.

Usage:
  python scripts/size_report.py [--top N]              the N largest files and functions (default 10)
  python scripts/size_report.py --max-function-lines 80 --max-file-lines 500
                                                       also lists what exceeds the limits; exits 1 if anything does
  ... --report-only                                    lists the same, but exits 0

`make lint` runs it with the limits, enforcing: lint fails on any product file over 500 lines or function over 80.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("shared", "services", "bench", "proto")
GENERATED = ("_pb2.py", "_pb2_grpc.py")
TRITON = frozenset({"triton_kernel", "triton.jit", "triton.autotune", "triton.heuristics"})


@dataclass(frozen=True)
class Item:
    """A file (`name` empty) or a function, and its lines."""

    lines: int
    path: str
    line: int = 1
    name: str = ""

    def __str__(self) -> str:
        return f"{self.lines:6d}  {self.path}" + (f":{self.line}  {self.name}" if self.name else "")


def product_files(root: Path) -> list[Path]:
    files = (p for top in PRODUCT for p in (root / top).rglob("*.py"))
    return sorted(p for p in files if not p.name.endswith(GENERATED) and "__pycache__" not in p.parts)


def _dotted(node: ast.expr) -> str:
    """`triton.jit` for the decorator @triton.jit or @triton.jit(...), `name` for @name."""
    if isinstance(node, ast.Call):
        return _dotted(node.func)
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def functions(tree: ast.AST, path: str, prefix: str = "") -> Iterator[Item]:
    """Every function and method under `tree`, qualified by its classes and enclosing functions."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.ClassDef):
            yield from functions(node, path, f"{prefix}{node.name}.")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if TRITON.isdisjoint(_dotted(d) for d in node.decorator_list):
                assert node.end_lineno is not None
                yield Item(node.end_lineno - node.lineno + 1, path, node.lineno, f"{prefix}{node.name}")
            yield from functions(node, path, f"{prefix}{node.name}.")
        else:
            yield from functions(node, path, prefix)


def measure(root: Path) -> tuple[list[Item], list[Item]]:
    """(files, functions) of the product code under `root`, each largest first."""
    files: list[Item] = []
    funcs: list[Item] = []
    for p in product_files(root):
        text = p.read_text(encoding="utf-8")
        rel = p.relative_to(root).as_posix()
        files.append(Item(len(text.splitlines()), rel))
        funcs.extend(functions(ast.parse(text, filename=rel), rel))
    order = lambda i: (-i.lines, i.path, i.line)
    return sorted(files, key=order), sorted(funcs, key=order)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--top", type=int, default=10, help="how many of the largest files and functions to list (0: none)"
    )
    parser.add_argument("--max-function-lines", type=int, help="a function over this many lines is a finding")
    parser.add_argument("--max-file-lines", type=int, help="a file over this many lines is a finding")
    parser.add_argument("--report-only", action="store_true", help="list the findings but exit 0")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository to measure (default: this one)")
    args = parser.parse_args(argv)
    files, funcs = measure(args.root)
    if args.top > 0:
        print(f"largest files ({len(files)} product files):")
        print("\n".join(str(i) for i in files[: args.top]))
        print(f"largest functions ({len(funcs)} product functions, Triton kernels excepted):")
        print("\n".join(str(i) for i in funcs[: args.top]))
    over: list[str] = []
    for what, items, limit in (("file", files, args.max_file_lines), ("function", funcs, args.max_function_lines)):
        if limit is not None:
            big = [i for i in items if i.lines > limit]
            if big:
                listed = "".join(f"\n  {i}" for i in big)
                over.append(f"over {limit} lines: {len(big)} product {what}s{listed}")
    if not over:
        return 0
    print("\n".join(over), file=sys.stderr)
    if args.report_only:
        print("(report only: scripts/size_report.py's docstring says how to make it enforcing)", file=sys.stderr)
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
