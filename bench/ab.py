"""A/B of two pdrelay trees, or of two flag sets, served colocated (`python -m bench.ab`).

Both clusters (`pdrelay up --worker 1 --prefill 0 --decode 0`, plus each side's flags) are up at once, each started
from its own tree: `pdrelay up` runs its services with `python -m` from its working directory, so the tree it is
started in is the code that serves, whatever PYTHONPATH says. Then interleaved rounds of `pdrelay bench serve`
(the client of this tree) go to each, with a fresh seed per round, the same seed on both sides, and the side that
goes first alternating, so a box that drifts during a round favours neither. Prints every round, then per workload
both means, B / A and the rounds B won. On a 2-core box the spread of two identical clusters' 3-round means is
~2-5%: read a difference under that as none.

    python -m bench.ab --a ../base-tree --b . --rounds 4
    python -m bench.ab --b-flags "--stream-interval 4" --rounds 3
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench.entry import bench_main
from bench.serve.main import DEFAULT_MODEL

SIDES = ("A", "B")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--a", default=".", metavar="DIR", help="the tree side A runs from (default: this one)")
    p.add_argument("--b", default=".", metavar="DIR", help="the tree side B runs from (default: this one)")
    p.add_argument("--a-flags", default="", metavar="FLAGS", help="extra `pdrelay up` flags for side A")
    p.add_argument("--b-flags", default="", metavar="FLAGS", help="extra `pdrelay up` flags for side B")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument(
        "--range-ratios", default="0,0.5", help="workloads, as bench serve's --random-range-ratio (default 0,0.5)"
    )
    p.add_argument("--random-input-len", type=int, default=128)
    p.add_argument("--random-output-len", type=int, default=64)
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--max-concurrency", type=int, default=16)
    p.add_argument("--seed", type=int, default=1000, help="round r uses seed + r on both sides")
    p.add_argument("--model", default=None, help=f"model directory or bundled:NAME (default {DEFAULT_MODEL})")


def _fail(msg: str) -> int:
    print(f"bench ab: {msg}", file=sys.stderr)
    return 2


def _up(tree: Path, run_dir: Path, side: str, model: str, flags: Sequence[str]) -> None:
    """`pdrelay up --detach` of one side, started from its tree, on free ports."""
    from shared.cluster.localcluster.servers import free_port

    cmd = [
        sys.executable, "-m", "services.cli", "up", "--run-dir", str(run_dir), "--cluster", f"ab-{side.lower()}",
        "--worker", "1", "--prefill", "0", "--decode", "0", "--etcd-port", str(free_port()),
        "--nats-port", str(free_port()), "--port", str(free_port()), "--model", model,
        "--detach", "--quiet", *flags,
    ]  # fmt: skip
    print(f"[bench ab] side {side}: starting a colocated cluster from {tree}", file=sys.stderr, flush=True)
    done = subprocess.run(cmd, cwd=tree, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"side {side}: `pdrelay up` exited {done.returncode}:\n{done.stdout}{done.stderr}")


def _gateway_url(run_dir: Path) -> str:
    from shared.cluster.handshake import read_ready_file

    for f in sorted((run_dir / "ready").glob("gateway-*.json")):
        info = read_ready_file(f)
        if info is not None and info.http:
            return f"http://{info.http}"
    raise RuntimeError(f"no ready gateway in {run_dir}")


def _down(tree: Path, run_dir: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "services.cli", "down", "--run-dir", str(run_dir)], cwd=tree, capture_output=True
    )


def _serve(ns: argparse.Namespace, url: str, model: str, ratio: str, seed: int, out: Path) -> tuple[float, float]:
    """One bench serve run: (output tok/s, mean TPOT ms)."""
    cmd = [
        sys.executable, "-m", "services.cli", "bench", "serve", "--base-url", url, "--tokenizer", model,
        "--random-input-len", str(ns.random_input_len), "--random-output-len", str(ns.random_output_len),
        "--num-prompts", str(ns.num_prompts), "--max-concurrency", str(ns.max_concurrency),
        "--random-range-ratio", ratio, "--seed", str(seed), "--output-json", str(out),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"bench serve against {url} exited {done.returncode}:\n{done.stderr[-2000:]}")
    doc = json.loads(out.read_text())
    return float(doc["output_throughput"]), float(doc["mean_tpot_ms"])


def run(ns: argparse.Namespace) -> int:
    from shared.modelspec.bundled import resolve_model_path

    trees = {"A": Path(ns.a).resolve(), "B": Path(ns.b).resolve()}
    for side, tree in trees.items():
        if not (tree / "services" / "cli.py").is_file():
            return _fail(f"--{side.lower()} {tree}: not a pdrelay tree (no services/cli.py)")
    if ns.rounds < 1:
        return _fail(f"--rounds must be >= 1 (got {ns.rounds})")
    ratios = [r.strip() for r in ns.range_ratios.split(",") if r.strip()]
    model = str(resolve_model_path(ns.model or DEFAULT_MODEL))
    flags = {"A": shlex.split(ns.a_flags), "B": shlex.split(ns.b_flags)}
    results: dict[str, dict[str, list[tuple[float, float]]]] = {r: {"A": [], "B": []} for r in ratios}
    with tempfile.TemporaryDirectory(prefix="pdrelay-ab-") as tmp:
        run_dirs = {side: Path(tmp) / side for side in SIDES}
        try:
            urls = {}
            for side in SIDES:
                _up(trees[side], run_dirs[side], side, model, flags[side])
                urls[side] = _gateway_url(run_dirs[side])
            for r in range(ns.rounds):
                order = SIDES if r % 2 == 0 else SIDES[::-1]
                for ratio in ratios:
                    for side in order:
                        out = Path(tmp) / f"{side}-{r}-{ratio}.json"
                        tps, tpot = _serve(ns, urls[side], model, ratio, ns.seed + r, out)
                        results[ratio][side].append((tps, tpot))
                        print(f"round {r + 1} range {ratio} side {side}: {tps:.1f} tok/s, mean TPOT {tpot:.1f} ms")
        except (RuntimeError, OSError) as e:
            return _fail(str(e))
        finally:
            for side in SIDES:
                _down(trees[side], run_dirs[side])
    for ratio in ratios:
        a = [t for t, _ in results[ratio]["A"]]
        b = [t for t, _ in results[ratio]["B"]]
        wins = sum(y > x for x, y in zip(a, b, strict=True))
        print(
            f"range {ratio}: A {statistics.mean(a):.1f} tok/s, B {statistics.mean(b):.1f} tok/s, "
            f"B / A {statistics.mean(b) / statistics.mean(a):.3f}x, B ahead in {wins} of {len(a)} rounds"
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main("bench.ab", __doc__ or "", add_arguments, run, argv, whole_doc=True)


if __name__ == "__main__":
    raise SystemExit(main())
