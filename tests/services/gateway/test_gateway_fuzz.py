"""Property: no request body, however odd, makes the gateway answer 5xx; every non-2xx is an error body.

Bodies are random JSON documents, valid requests with fields replaced by random JSON values, and random bytes.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.gateway.http.api_responses import ErrorResponse
from services.gateway.http.app import GatewayApp
from tests.services.gateway.conftest import client_for

FIELDS = [
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "ignore_eos",
    "min_tokens",
    "stop_token_ids",
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "echo",
    "best_of",
    "tools",
    "response_format",
    "chat_template_kwargs",
    "skip_special_tokens",
]

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(FIELDS + ["role", "content", "type", "text"]) | st.text(max_size=5), inner, max_size=4
        )
    ),
    max_leaves=12,
)
message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "system", "assistant", "tool", "bot"]) | json_values,
        "content": st.text(max_size=30) | json_values,
    }
)
valid_chat = st.fixed_dictionaries(
    {"messages": st.lists(message, min_size=1, max_size=3), "max_tokens": st.integers(min_value=1, max_value=4)}
)
valid_completion = st.fixed_dictionaries(
    {
        "prompt": st.text(min_size=1, max_size=20) | st.lists(st.integers(0, 600), min_size=1, max_size=6),
        "max_tokens": st.integers(min_value=1, max_value=4),
    }
)


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    body = dict(draw(base))
    for key in draw(st.lists(st.sampled_from(FIELDS), max_size=4)):
        body[key] = draw(json_values)
    return body


bodies = (
    (mutated(valid_chat) | mutated(valid_completion)).map(lambda b: json.dumps(b).encode())
    | json_values.map(lambda v: json.dumps(v).encode())
    | st.binary(max_size=64)
)


def check(r: httpx.Response) -> None:
    assert r.status_code < 500, (r.status_code, r.text)
    if r.status_code >= 400:
        msgspec.json.decode(r.content, type=ErrorResponse, strict=True)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies, endpoint=st.sampled_from(["/v1/chat/completions", "/v1/completions"]))
def test_no_body_causes_a_server_error(app: GatewayApp, body: bytes, endpoint: str) -> None:
    async def go() -> None:
        async with client_for(app) as c:
            check(await c.post(endpoint, content=body, headers={"content-type": "application/json"}))

    asyncio.run(go())
