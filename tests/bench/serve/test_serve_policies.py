"""`pdrelay bench serve --compare-policies`: flag checks, the cluster it asks for, the hit-rate arithmetic from
real Prometheus text, and the report lines. (Starting clusters is what `pdrelay up`'s own tests cover.)"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bench.serve.main import add_arguments
from bench.serve.policies import (
    PREFIX_COUNTERS,
    Topology,
    _up_options,
    parse_policies,
    policy_lines,
    prefix_stats,
    scrape_counters,
    validate,
)
from services.cli import main as cli_main


def _ns(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def test_policies_are_named_and_checked() -> None:
    assert parse_policies("kv_aware, round_robin") == ("kv_aware", "round_robin")
    assert parse_policies("round_robin,least_load,kv_aware") == ("round_robin", "least_load", "kv_aware")
    with pytest.raises(ValueError, match="random is not a routing policy"):
        parse_policies("kv_aware,random")
    for one in ("kv_aware", "kv_aware,kv_aware", ","):
        with pytest.raises(ValueError, match="at least two different"):
            parse_policies(one)


def test_flags_that_point_elsewhere_are_refused() -> None:
    assert validate(_ns("--compare-policies", "kv_aware,round_robin")) == ("kv_aware", "round_robin")
    with pytest.raises(ValueError, match="drop --base-url, --mock-workers"):
        validate(_ns("--compare-policies", "kv_aware,round_robin", "--base-url", "http://x", "--mock-workers"))
    with pytest.raises(ValueError, match="--prefill-instances"):
        validate(_ns("--compare-policies", "kv_aware,round_robin", "--prefill-instances", "0"))
    with pytest.raises(ValueError, match="--prefill-num-pages"):
        validate(_ns("--compare-policies", "kv_aware,round_robin", "--prefill-num-pages", "-1"))


def test_cli_names_a_bad_policy_before_starting_anything(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        cli_main(
            [
                "bench",
                "serve",
                "--compare-policies",
                "kv_aware,fastest",
                "--num-prompts",
                "2",
                "--random-input-len",
                "4",
            ]
        )
        == 2
    )
    assert "fastest is not a routing policy" in capsys.readouterr().err


def test_each_policy_gets_its_own_cluster_with_small_prefill_pools_only_on_prefill(tmp_path: Path) -> None:
    topo = Topology(prefill=2, decode=3, prefill_num_pages=160, model="/m/smollm2", extra=("--page-size", "32"))
    opts = _up_options("round_robin", topo, tmp_path / "rr")
    assert opts.counts == {"gateway": 1, "prefill": 2, "decode": 3}
    assert opts.role_extra == {"prefill": ("--num-pages", "160")}
    extra = list(opts.extra)
    assert extra[extra.index("--routing-policy") + 1] == "round_robin"
    assert extra[-2:] == ["--page-size", "32"] and "--port" in extra
    assert opts.cluster == "bench-round_robin" and opts.etcd_port > 0 and opts.nats_port > 0
    assert "2 prefill (160 KV pages each), 3 decode" in topo.describe()
    derived = Topology(prefill=1, decode=1, prefill_num_pages=0, model="m", extra=())
    assert _up_options("kv_aware", derived, tmp_path / "kv").role_extra == {}


class _Metrics(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def metrics_server() -> Iterator[tuple[str, type[_Metrics]]]:
    handler = type("Handler", (_Metrics,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def _text(queries: float, hits: float) -> bytes:
    return (
        f"# HELP pdrelay:prefix_cache_queries_total Prompt tokens looked up in the prefix cache\n"
        f"# TYPE pdrelay:prefix_cache_queries_total counter\npdrelay:prefix_cache_queries_total {queries}\n"
        f"# HELP pdrelay:prefix_cache_hits_total Prompt tokens found in the prefix cache\n"
        f"# TYPE pdrelay:prefix_cache_hits_total counter\npdrelay:prefix_cache_hits_total {hits}\n"
        f"# HELP pdrelay:prefix_cache_hit_rate Prefix-cache hits / queries since start (tokens)\n"
        f"# TYPE pdrelay:prefix_cache_hit_rate gauge\npdrelay:prefix_cache_hit_rate 0.5\n"
    ).encode()


def test_hit_rate_is_the_increase_of_the_prefill_counters_over_the_run(metrics_server) -> None:
    address, handler = metrics_server
    handler.body = _text(1000, 100)
    before = {"prefill-1": scrape_counters(address, PREFIX_COUNTERS)}
    assert before["prefill-1"] == {"pdrelay:prefix_cache_queries": 1000.0, "pdrelay:prefix_cache_hits": 100.0}
    handler.body = _text(3000, 1300)
    after = {
        "prefill-1": scrape_counters(address, PREFIX_COUNTERS),
        "prefill-2": {"pdrelay:prefix_cache_queries": 1000.0, "pdrelay:prefix_cache_hits": 0.0},
    }
    stats = prefix_stats({**before, "prefill-2": dict.fromkeys(PREFIX_COUNTERS, 0.0)}, after)
    # prefill-1: 2000 looked up, 1200 found; prefill-2: 1000 looked up, none found
    assert stats["prefill_prompt_tokens"] == 3000 and stats["prefill_cached_tokens"] == 1200
    assert stats["prefill_prefix_hit_rate"] == pytest.approx(0.4)
    assert stats["per_prefill"]["prefill-2"] == {"prompt_tokens": 1000.0, "cached_tokens": 0.0}


def test_report_lines_give_each_policy_and_the_ratio_to_the_first() -> None:
    def summary(label: str, mean: float, median: float, rate: float) -> dict:
        return {
            "label": label,
            "mean_ttft_ms": mean,
            "median_ttft_ms": median,
            "prefill_prefix_hit_rate": rate,
            "per_prefill": {"prefill-1": {"prompt_tokens": 10.0}, "prefill-2": {"prompt_tokens": 20.0}},
        }

    lines = policy_lines([summary("kv_aware", 800.0, 400.0, 0.75), summary("round_robin", 1600.0, 2000.0, 0.4)])
    assert "75.0%" in lines[1] and "prefill-1 10 / prefill-2 20" in lines[1]
    assert lines[-1] == "TTFT round_robin / kv_aware: mean 2.00x, median 5.00x"
