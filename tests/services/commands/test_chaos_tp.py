"""`pdrelay chaos --scenarios kill-decode-rank` on a live cluster whose decodes run at --tp-size 2 (two processes
each, gloo): a follower rank of one decode is SIGKILLed mid-stream, that decode ends itself (its streams replayed on
the other), the supervisor starts it again, and every stream completes correctly; no KV page is left in use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.cluster.localcluster.servers import free_port
from tests.services.commands.test_chaos import pdrelay


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_killing_one_rank_of_a_tp2_decode(tmp_path: Path) -> None:
    from tests.helpers.tiny_models import make_tiny_model

    model = make_tiny_model(tmp_path / "models", "llama")
    run_dir = str(tmp_path / "run")
    up = pdrelay(
        "up",
        "--detach",
        "--run-dir",
        run_dir,
        "--port",
        str(free_port()),
        "--etcd-port",
        str(free_port()),
        "--nats-port",
        str(free_port()),
        "--model",
        str(model),
        "--prefill",
        "1",
        "--decode",
        "2",
        "--role-flags",
        "decode=--tp-size 2",
        "--threads",
        "1",
        "--num-pages",
        "512",
        "--lease-ttl-s",
        "3",
        "--quiet",
        timeout=300,
    )
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        out = tmp_path / "chaos.json"
        r = pdrelay(
            "chaos",
            "--run-dir",
            run_dir,
            "--scenarios",
            "kill-decode-rank",
            "--duration",
            "10",
            "--fault-after-s",
            "2",
            "--concurrency",
            "3",
            "--max-tokens",
            "16",
            "--leak-timeout-s",
            "60",
            "--json",
            str(out),
            timeout=400,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        res = json.loads(out.read_text())
        (s,) = res["scenarios"]
        assert res["ok"] and s["scenario"] == "kill-decode-rank" and s["target"] == "decode-1", s
        assert s["sent"] > 0 and s["correct"] == s["sent"], s
        assert s["wrong"] == s["hung"] == s["leaked_pages"] == 0 and s["recovery_s"] is not None, s
    finally:
        down = pdrelay("down", "--run-dir", run_dir)
        assert down.returncode == 0, down.stdout + down.stderr
