"""What the gateway's fuzz targets share (test_gateway_fuzz.py: HTTP bodies and headers; test_gateway_fuzz_grpc.py:
gRPC messages), and how they are run, replayed and kept.

The search is random, a new seed each run (new inputs are what a fuzz test in CI is for). What a run finds is kept:
- A failure's message starts with the failing input written as the target's `@example` takes it (hypothesis' own
  listing of the arguments prints blank here: schemathesis, imported by the suite, replaces hypothesis' printer),
  and hypothesis adds a `@reproduce_failure(...)` line (print_blob): pasted above the test, it replays exactly that
  input. The local example database (.hypothesis/) also replays it first on the next local run, and
  `pytest --hypothesis-seed=N` repeats a whole run.
- Every input a target has ever failed on is kept as an explicit `@example` on it, with the fix it led to, so every
  run tries it first. Add the printed input there together with the fix.
- PDRELAY_FUZZ_EXAMPLES=N runs N random examples per target instead of its default, e.g. a long run of one target:
      PDRELAY_FUZZ_EXAMPLES=10000 nice -n 10 .venv/bin/python -m pytest -q --hypothesis-show-statistics \\
          tests/services/gateway/test_gateway_fuzz.py -k body
  (the statistics list the answers, route or RPC -> status, as hypothesis events).
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def fuzz_settings(default_examples: int) -> settings:
    examples = int(os.environ.get("PDRELAY_FUZZ_EXAMPLES") or default_examples)
    return settings(
        max_examples=examples,
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


def mostly(plausible: st.SearchStrategy[Any], wild: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A plausible value nine times in ten, so that most requests get past validation; a wild one otherwise."""
    return st.integers(0, 9).flatmap(lambda i: wild if i == 0 else plausible)


# Names that mean something to a chat template or to the code that renders it: its arguments, transformers'
# apply_chat_template parameters, the special tokens it passes, the Jinja globals a template calls.
TEMPLATE_NAMES = [
    "messages",
    "tools",
    "documents",
    "add_generation_prompt",
    "tokenize",
    "chat_template",
    "conversation",
    "continue_final_message",
    "return_dict",
    "padding",
    "self",
    "enable_thinking",
    "bos_token",
    "eos_token",
    "raise_exception",
    "strftime_now",
    "range",
    "namespace",
    "loop",
]
