"""Weight loading: time and peak host RSS of shared.engine.weights.load_weights with 1 thread (sequential) and with a
thread pool, each run in a fresh process (so its peak RSS is its own), plus a check that both load the same bytes.

    python -m bench.load_weights [--model DIR] [--threads 1,2] [--dtype float32] [--reps 3] [--shards 1]

The model is built on the CPU here (the host is the device); on a GPU the parameters live in VRAM and the host
holds only the tensors being copied (memory-mapped pages of the file and one converted tensor per thread), which
the `beyond weights` column measures: anonymous memory the load added beyond the weights themselves (the empty
parameters are untouched pages until loaded; file pages are mapped, not anonymous). A full host copy of the model
would show there as the weights' size again.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _status_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def child(model: str, threads: int, dtype: str) -> dict[str, Any]:
    """One load in this process: seconds, peak RSS, anonymous memory before and after, a digest of the weights."""
    import torch

    from shared.engine.kv_pool import torch_dtype
    from shared.engine.models import build_model, load_model_config
    from shared.engine.weights import load_weights

    torch.set_num_threads(1)
    cfg = load_model_config(model)
    m = build_model(cfg, torch_dtype(dtype))
    anon_built = _status_kib("RssAnon")
    t0 = time.perf_counter()
    load_weights(m, m.hf_weight_map(), model, tied_lm_head=cfg.tie_word_embeddings, threads=threads)
    seconds = time.perf_counter() - t0
    digest = float(sum(p.double().sum().item() for p in m.parameters()))
    weights = sum(p.numel() * p.element_size() for p in m.parameters())
    return {
        "threads": threads,
        "seconds": seconds,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "anon_above_model_mib": (_status_kib("RssAnon") - anon_built) / 1024,
        "weights_mib": weights / 2**20,
        "digest": digest,
    }


def shard(model: Path, out: Path, shards: int) -> Path:
    """A copy of `model` split into `shards` safetensors files with an index (the layout of large checkpoints)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(model, out, ignore=shutil.ignore_patterns("*.safetensors", "*.index.json"))
    sd = load_file(str(model / "model.safetensors"))
    names = sorted(sd)
    weight_map: dict[str, str] = {}
    for i in range(shards):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = names[i::shards]
        save_file({k: sd[k] for k in part}, str(out / fname))
        weight_map |= dict.fromkeys(part, fname)
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out


def _run_child(model: str, threads: int, dtype: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.load_weights", "--child", "--model", model, "--threads", str(threads)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([*cmd, "--dtype", dtype], capture_output=True, text=True, check=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.load_weights", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model directory (default: the prepared bundled model)")
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts; 1 is the sequential load")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--reps", type=int, default=3, help="runs per thread count (median time, max RSS)")
    p.add_argument("--shards", type=int, default=1, help="split the checkpoint into this many files first")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    if ns.child:
        print(json.dumps(child(ns.model, int(ns.threads), ns.dtype)))
        return 0
    model = ns.model
    if model is None:
        from shared.modelspec.bundled import resolve_model_path

        model = str(resolve_model_path("bundled:smollm2-135m-instruct"))
    with tempfile.TemporaryDirectory() as tmp:
        if ns.shards > 1:
            model = str(shard(Path(model), Path(tmp) / "sharded", ns.shards))
        rows = []
        for threads in (int(t) for t in ns.threads.split(",")):
            runs = [_run_child(model, threads, ns.dtype) for _ in range(ns.reps)]
            rows.append({**runs[0], "seconds": statistics.median(r["seconds"] for r in runs), "runs": len(runs)})
            rows[-1]["peak_rss_mib"] = max(r["peak_rss_mib"] for r in runs)
            rows[-1]["anon_above_model_mib"] = max(r["anon_above_model_mib"] for r in runs)
    same = len({r["digest"] for r in rows}) == 1
    print(f"model {model} ({rows[0]['weights_mib']:.0f} MiB as {ns.dtype}), {ns.shards} file(s), {ns.reps} runs each")
    print(f"{'threads':>7} {'load s':>8} {'peak RSS MiB':>13} {'anon above model MiB':>21} {'beyond weights':>15}")
    for r in rows:
        extra = r["anon_above_model_mib"] - r["weights_mib"]
        print(
            f"{r['threads']:7} {r['seconds']:8.3f} {r['peak_rss_mib']:13.0f} {r['anon_above_model_mib']:21.1f} "
            f"{extra:15.1f}"
        )
    print(f"same weights in every run: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
