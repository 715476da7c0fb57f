"""Serve the gateway over mock workers: `python -m services.gateway.mock --port N [--model DIR]`.

For serving benchmarks of the gateway alone (`--mock-workers`) and manual tests: real HTTP, real tokenizer and
detokenizer, and a backend that echoes the prompt's tokens with the configured delays. Every gateway flag is
accepted (`--api-key`, `--host`, `--max-request-bytes`, ...), plus the mock's own below.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from services.gateway.mock.backend import MockBackend


def _mock_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(
        prog="python -m services.gateway.mock",
        add_help=False,
        description="The gateway over mock workers. Other flags: pdrelay serve gateway -h",
    )
    p.add_argument("--token-delay-ms", type=float, default=0.0, help="delay between generated tokens")
    p.add_argument("--first-token-delay-ms", type=float, default=0.0, help="delay before the first token (prefill)")
    p.add_argument("--tokens-per-chunk", type=int, default=1, help="tokens per streamed backend chunk")
    p.add_argument("--access-log", action="store_true", help="log every request (slows the gateway down)")
    p.add_argument("--mock-help", action="help", help="show the mock's own flags and exit")
    return p.parse_known_args(list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    from services.gateway.server import build_app, load_tokenizer, served_names_of, uvicorn_config
    from shared.config.resolve import parse_role_args

    ns, rest = _mock_args(sys.argv[1:] if argv is None else argv)
    for name in ("token_delay_ms", "first_token_delay_ms"):
        if getattr(ns, name) < 0:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 0 (got {getattr(ns, name)})")
    prog = "python -m services.gateway.mock"
    cfg = parse_role_args("gateway", rest, prog=prog)
    try:
        tokenizer = load_tokenizer(cfg)
    except ValueError as e:  # a bad --model / --tokenizer / --chat-template: the message says what to do
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    primary, aliases = served_names_of(cfg)
    backend = MockBackend(
        [primary, *aliases],
        token_delay_s=ns.token_delay_ms / 1000,
        first_token_delay_s=ns.first_token_delay_ms / 1000,
        tokens_per_chunk=ns.tokens_per_chunk,
        vocab_size=tokenizer.vocab_size,
    )  # no EOS: exactly max_tokens tokens, as benchmarks want
    app = build_app(cfg, backend, tokenizer=tokenizer)

    import uvicorn

    uvicorn.Server(uvicorn_config(cfg, app, access_log=ns.access_log)).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
