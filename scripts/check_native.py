"""The C checks `make lint` runs over the native CPU kernels (shared/kernels/native/*.c and *.h).

1. Layout: clang-format --dry-run --Werror against the checked-in shared/kernels/native/.clang-format (the exact
   clang-format release is pinned in pyproject's test extra). `--fix` rewrites the files instead.
2. Warnings: every source compiled with build.py's flags (-Wall -Wextra -Wmissing-prototypes) and -Werror for the
   vector paths the kernels have, -march=sapphirerapids (AVX-512 + avx512_bf16: the bf16 kernels), x86-64-v4
   (AVX-512), x86-64-v3 (AVX2 + FMA) and x86-64 (plain C), in place of -march=native: a warning on a path this host
   does not run still fails here.

Usage: python scripts/check_native.py [--fix]. Exits non-zero on a finding, printing it.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from shared.kernels.native import build

NATIVE = Path(build.__file__).parent
# sapphirerapids: x86-64-v4 plus avx512_bf16 (and AMX), the one target that compiles the bf16 kernels' vector code
TARGETS = ("sapphirerapids", "x86-64-v4", "x86-64-v3", "x86-64")


def _clang_format() -> str | None:
    beside = Path(sys.executable).with_name("clang-format")  # the venv's, from the pinned wheel
    return str(beside) if beside.exists() else shutil.which("clang-format")


def check_layout(fix: bool) -> list[str]:
    exe = _clang_format()
    if exe is None:
        return ["clang-format not found: run `make install` (it comes with the test extra)"]
    files = [str(p) for p in sorted((*NATIVE.glob("*.c"), *NATIVE.glob("*.h")))]
    args = ["-i"] if fix else ["--dry-run", "--Werror"]
    res = subprocess.run([exe, *args, *files], capture_output=True, text=True, timeout=120)
    if res.returncode == 0:
        return []
    return [res.stderr.strip() or res.stdout.strip(), "run `python scripts/check_native.py --fix` to lay them out"]


def _compile(cc: str, src: Path, march: str) -> str | None:
    flags = [f"-march={march}" if f == "-march=native" else f for f in build.CFLAGS] + ["-Werror"]
    res = subprocess.run([cc, *flags, "-o", "/dev/null", str(src)], capture_output=True, text=True, timeout=300)
    return None if res.returncode == 0 else f"{src.name} -march={march}:\n{res.stderr.strip()}"


def check_warnings() -> list[str]:
    cc = build._compiler()
    if cc is None:
        return ["no C compiler found (install gcc, or set CC)"]
    jobs = [(src, march) for src in sorted(NATIVE.glob("*.c")) for march in TARGETS]
    with ThreadPoolExecutor(max_workers=2) as pool:  # two compilers at a time: the project's machines have 2 cores
        results = list(pool.map(lambda job: _compile(cc, *job), jobs))
    return [r for r in results if r is not None]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fix", action="store_true", help="rewrite the files with clang-format instead of checking")
    args = parser.parse_args()
    findings = check_layout(args.fix) + check_warnings()
    for finding in findings:
        print(finding, file=sys.stderr)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
