"""`pdrelay bench serve`'s command line: its flags, one argument group per concern (the --compare-policies,
--compare-peer and --compare-kvstore runs add their own), and the checks `run` makes before anything starts."""

from __future__ import annotations

import argparse
import json
import math

from bench.serve.client import ENDPOINTS
from bench.serve.compare import add_compare_arguments
from bench.serve.datasets import DATASETS
from bench.serve.http_client import HTTP_CLIENTS
from bench.serve.kvstore import add_kvstore_arguments
from bench.serve.metrics import Slo, parse_percentiles, parse_slo
from bench.serve.policies import add_policy_arguments
from bench.urls import openai_base_url

DEFAULT_MODEL = "bundled:smollm2-135m-instruct"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _target_arguments(p)
    _workload_arguments(p)
    _load_arguments(p)
    _output_arguments(p)
    _comparison_arguments(p)
    add_policy_arguments(p)
    add_compare_arguments(p)
    add_kvstore_arguments(p)


def _rate(text: str) -> float:
    v = float(text)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 requests/s or inf (got {text})")
    return v


def _target_arguments(p: argparse.ArgumentParser) -> None:
    """The endpoint measured and how the client talks to it."""
    t = p.add_argument_group("target")
    t.add_argument("--base-url", default=None, help="the endpoint to measure (default http://127.0.0.1:8000)")
    t.add_argument("--endpoint", default="/v1/completions", choices=ENDPOINTS, help="API to call")
    t.add_argument("--model", default=None, help="model name to send (default: the first GET /v1/models lists)")
    t.add_argument(
        "--tokenizer",
        default=None,
        metavar="DIR",
        help=f"the served model's directory, for building prompts (default: {DEFAULT_MODEL})",
    )
    t.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    t.add_argument(
        "--http-client",
        default="raw",
        choices=HTTP_CLIENTS,
        help="raw: lean asyncio HTTP/1.1 client (default); httpx: the reference client",
    )
    t.add_argument(
        "--tcp-quickack",
        action="store_true",
        help="raw client: ACK every read at once (servers that leave Nagle on, like Dynamo's frontend, "
        "otherwise stall ~40 ms on the client's delayed ACK)",
    )
    t.add_argument(
        "--target-pid", type=int, default=None, help="pid of the target's front process, to report its CPU per request"
    )


def _workload_arguments(p: argparse.ArgumentParser) -> None:
    """The requests: dataset, lengths, images, seed."""
    d = p.add_argument_group("workload")
    d.add_argument("--dataset", "--dataset-name", dest="dataset", default="random", choices=DATASETS)
    d.add_argument("--num-prompts", type=int, default=200, help="requests in the measured run")
    d.add_argument(
        "--random-input-len",
        type=int,
        default=256,
        help="prompt tokens (random), question tokens (shared-prefix), user tokens per turn (multi-turn)",
    )
    d.add_argument("--random-output-len", type=int, default=64, help="output tokens per request (ignore_eos)")
    d.add_argument(
        "--random-range-ratio",
        type=float,
        default=0.0,
        help="random: lengths uniform in [len*(1-r), len*(1+r)] (0: fixed)",
    )
    d.add_argument(
        "--random-prompt-format",
        default="text",
        choices=("text", "ids"),
        help="random: text of exactly N tokens, or N token ids (completions only)",
    )
    d.add_argument("--shared-prefix-groups", type=int, default=8, help="shared-prefix: system prompts")
    d.add_argument(
        "--shared-prefix-prompts-per-group",
        type=int,
        default=None,
        help="shared-prefix: questions per system prompt (default: num-prompts / groups)",
    )
    d.add_argument("--shared-prefix-system-len", type=int, default=512, help="shared-prefix: system prompt tokens")
    d.add_argument("--multi-turn-turns", type=int, default=4, help="multi-turn: user turns per conversation")
    d.add_argument("--mm-images-per-request", type=int, default=1, help="random-mm: images per request")
    d.add_argument(
        "--mm-repeat-ratio",
        type=float,
        default=0.0,
        help="random-mm: share of images drawn from a small reused pool (the rest are unique)",
    )
    d.add_argument("--mm-pool-size", type=int, default=4, help="random-mm: distinct images in the reused pool")
    d.add_argument("--mm-image-size", type=int, default=64, help="random-mm: image width and height (pixels)")
    d.add_argument("--seed", type=int, default=0, help="seeds prompts, lengths and arrival times")


def _load_arguments(p: argparse.ArgumentParser) -> None:
    """How the requests are sent: arrivals, concurrency, warm-up, limits, sampling."""
    r = p.add_argument_group("load")
    r.add_argument(
        "--request-rate", type=_rate, default=math.inf, help="requests/s, Poisson arrivals (default inf: all at once)"
    )
    r.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the arrival gaps (1: Poisson)")
    r.add_argument("--max-concurrency", type=int, default=None, help="cap on requests in flight")
    r.add_argument("--num-warmups", type=int, default=2, help="requests sent and discarded before measuring")
    r.add_argument("--timeout-s", type=float, default=120.0, help="per-request limit (a late request fails)")
    r.add_argument(
        "--total-timeout-s",
        type=float,
        default=1800.0,
        help="limit for the whole benchmark; results so far are printed, marked partial",
    )
    r.add_argument(
        "--no-ignore-eos",
        dest="ignore_eos",
        action="store_false",
        help="let the model stop at EOS (output lengths then vary)",
    )
    r.add_argument("--temperature", type=float, default=0.0)
    r.add_argument("--extra-body", default=None, metavar="JSON", help="fields merged into every request body")


def _output_arguments(p: argparse.ArgumentParser) -> None:
    """What is reported and where."""
    m = p.add_argument_group("metrics and output")
    m.add_argument(
        "--slo",
        default=None,
        metavar="ttft_ms=..,tpot_ms=..",
        help="objectives for goodput (request_goodput): ttft_ms, tpot_ms, e2el_ms",
    )
    m.add_argument("--metric-percentiles", default="99", help="percentiles to report, e.g. 50,90,99")
    m.add_argument(
        "--output-json",
        "--result-file",
        dest="output_json",
        default=None,
        metavar="PATH",
        help="write the results as JSON (vLLM's keys)",
    )
    m.add_argument("--save-detailed", action="store_true", help="add per-request lists (ttfts, itls, texts, ...)")


def _comparison_arguments(p: argparse.ArgumentParser) -> None:
    """Pdrelay's gateway over mock workers, and a second endpoint side by side."""
    c = p.add_argument_group("mock workers and comparison")
    c.add_argument(
        "--mock-workers",
        action="store_true",
        help="start pdrelay's gateway over mock workers on a free port and measure it",
    )
    c.add_argument("--mock-token-delay-ms", type=float, default=0.0, help="mock: delay between tokens")
    c.add_argument("--mock-first-token-delay-ms", type=float, default=0.0, help="mock: delay before the first")
    c.add_argument("--compare-url", default=None, help="run the same workload against this endpoint too")
    c.add_argument("--compare-model", default=None, help="model name at --compare-url (default: its first)")
    c.add_argument("--compare-pid", type=int, default=None, help="pid of the compare endpoint's front process")
    c.add_argument(
        "--peer-cmd",
        default=None,
        metavar="CMD",
        help="start the compare endpoint with this shell command ({port}: its HTTP port; {pid_file}: "
        "where it may write 'front PID' / 'worker PID' lines), e.g. "
        "'bench/dynamo_peer.sh {port} {pid_file}'",
    )
    c.add_argument("--peer-label", default="peer", help="name of the compare endpoint in the table")
    c.add_argument(
        "--peer-start-timeout-s", type=float, default=180.0, help="how long --peer-cmd may take to list a model"
    )
    c.add_argument(
        "--throughput-concurrency",
        type=int,
        default=None,
        metavar="N",
        help="after the main run, run the same workload at concurrency N against every endpoint",
    )


def validate(ns: argparse.Namespace) -> tuple[Slo | None, tuple[float, ...]]:
    for flag, name in (("--base-url", "base_url"), ("--compare-url", "compare_url")):
        if getattr(ns, name):  # http://host:port, with or without /v1: the client appends /v1/...
            setattr(ns, name, openai_base_url(flag, getattr(ns, name)))
    if ns.mock_workers and ns.base_url:
        raise ValueError("--mock-workers starts its own gateway; drop --base-url (or drop --mock-workers)")
    if ns.peer_cmd is not None and ns.compare_url is not None:
        raise ValueError("--peer-cmd starts the compare endpoint itself; drop --compare-url (or --peer-cmd)")
    if ns.peer_cmd is not None and "{port}" not in ns.peer_cmd:
        raise ValueError(f"--peer-cmd {ns.peer_cmd!r} must contain {{port}} (the port the peer serves HTTP on)")
    if ns.throughput_concurrency is not None and ns.throughput_concurrency < 1:
        raise ValueError(f"--throughput-concurrency must be >= 1 (got {ns.throughput_concurrency})")
    if not ns.peer_start_timeout_s > 0:
        raise ValueError(f"--peer-start-timeout-s must be > 0 (got {ns.peer_start_timeout_s})")
    if ns.tcp_quickack and ns.http_client != "raw":
        raise ValueError("--tcp-quickack needs --http-client raw")
    if ns.num_warmups < 0:
        raise ValueError(f"--num-warmups must be >= 0 (got {ns.num_warmups})")
    if not ns.total_timeout_s > 0:
        raise ValueError(f"--total-timeout-s must be > 0 (got {ns.total_timeout_s})")
    if ns.extra_body is not None:
        try:
            if not isinstance(json.loads(ns.extra_body), dict):
                raise ValueError
        except ValueError:
            raise ValueError(f"--extra-body {ns.extra_body!r} must be a JSON object, e.g. '{{\"top_k\": 1}}'") from None
    for name in ("mock_token_delay_ms", "mock_first_token_delay_ms"):
        if getattr(ns, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0 (got {getattr(ns, name)})")
    slo = parse_slo(ns.slo) if ns.slo else None
    return slo, parse_percentiles(ns.metric_percentiles)
