"""`python -m bench.<name>` for a benchmark that defines `add_arguments(parser)` and `run(namespace)`: the same
pair backs its `pdrelay bench ...` command (services/commands/bench_*.py), so both parse the same flags."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence


def bench_main(
    module: str,
    doc: str,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    run: Callable[[argparse.Namespace], int],
    argv: Sequence[str] | None,
    *,
    whole_doc: bool = False,
) -> int:
    """Parse `argv` (None: sys.argv) with prog `python -m module` and run. The help shows the module docstring's
    first paragraph, or all of it as written with `whole_doc`."""
    if whole_doc:
        p = argparse.ArgumentParser(
            prog=f"python -m {module}", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
        )
    else:
        p = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))
