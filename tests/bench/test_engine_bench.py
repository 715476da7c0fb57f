"""Smoke test of the engine benchmark: `--quick` on a tiny model, every number present and consistent."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from bench.engine import add_arguments, fresh_prompts, make_workloads, run
from tests.helpers.tiny_models import tiny_llama_dir  # noqa: F401


def test_workloads_follow_the_spec():
    ws = make_workloads(49152, quick=False, seed=0, concurrency=None)
    uniform = [w for w in ws if w.name.startswith("uniform")]
    assert [w.concurrency for w in uniform] == [1, 8, 16, 32]
    assert all(len(p) == 128 and n == 64 for w in uniform for p, n in w.requests)
    varied = ws[-1]
    assert varied.concurrency == 16 and len(varied.requests) == 64
    assert all(32 <= len(p) <= 512 and 16 <= n <= 256 for p, n in varied.requests)
    assert make_workloads(49152, quick=False, seed=0, concurrency=None)[-1] == varied  # seeded


def test_repeats_draw_prompts_the_prefix_cache_has_not_seen():
    """--repeat k runs the workload again: every prompt's first token differs from every earlier run's, so no page
    of it matches the radix cache (a repeat had been served from the cache and looked 1.7x faster)."""
    w = make_workloads(49152, quick=True, seed=0, concurrency=None)[0]
    runs = [fresh_prompts(w, k, 49152) for k in range(4)]
    assert runs[0] == w
    for i, (p, n) in enumerate(w.requests):
        firsts = {r.requests[i][0][0] for r in runs}
        assert len(firsts) == 4 and all(100 <= t < 49152 for t in firsts)
        assert all(r.requests[i][0][1:] == p[1:] and r.requests[i][1] == n for r in runs)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_quick_run_reports_ratios_and_roofline(dtype: str, tiny_llama_dir: Path, tmp_path: Path, capsys):
    p = argparse.ArgumentParser()
    add_arguments(p)
    out = tmp_path / "r.json"
    ns = p.parse_args(
        [
            "--quick",
            "--threads",
            "1",
            "--model",
            str(tiny_llama_dir),
            "--json-out",
            str(out),
            "--kv-budget-mb",
            "16",
            "--dtype",
            dtype,
        ]
    )
    assert run(ns) == 0
    res = json.loads(out.read_text())
    assert res["dtype"] == dtype
    assert res["machine"]["matmul_gflops"] > 0 and res["machine"]["copy_gbps"] > 0
    names = [r["workload"] for r in res["results"]]
    assert names == ["uniform-32/8", "uniform-32/8", "varied"]
    for r in res["results"]:
        e, hf = r["engine"], r["hf"]
        assert e["output_tok_s"] > 0 and hf["output_tok_s"] > 0
        assert abs(r["ratio_vs_hf"] - e["output_tok_s"] / hf["output_tok_s"]) < 1e-9
        assert 0 < e["overhead_share"] < 1 and 0 < e["roofline_fraction"] <= 1.0
        assert e["step_ms_p50"] <= e["step_ms_p99"]
    printed = capsys.readouterr().out
    assert "tok/s" in printed and "roofline" in printed and f"  {dtype}  " in printed


def test_url_mode_drives_an_openai_compatible_server():
    import threading
    import time

    import uvicorn
    from fastapi import FastAPI

    from bench.engine import Workload, _first_model, run_server

    app = FastAPI()
    seen: list[dict] = []

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": "peer-model", "object": "model"}]}

    @app.post("/v1/completions")
    def completions(body: dict) -> dict:
        seen.append(body)
        return {"choices": [{"text": "x"}], "usage": {"completion_tokens": body["max_tokens"]}}

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 20
        while not (server.started and server.servers):
            assert time.monotonic() < deadline, "test server did not start"
            time.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        assert _first_model(url) == "peer-model"
        w = Workload("w", 2, (((5, 6, 7), 4), ((8, 9), 3), ((1,), 2)))
        res = run_server(url, "peer-model", w, None)
        assert res["output_tokens"] == 9 and res["output_tok_s"] > 0
        assert sorted(b["prompt"] for b in seen) == [[1], [5, 6, 7], [8, 9]]
        assert all(b["temperature"] == 0.0 and b["ignore_eos"] is True for b in seen)
    finally:
        server.should_exit = True
        t.join(10)
