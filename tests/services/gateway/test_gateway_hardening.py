"""Bad bodies the fault probe found: deeply nested JSON (was a RecursionError 500) and non-JSON content types (was
accepted); both are now OpenAI-style 4xx. Whole-number floats for integer fields are integers, as in JSON."""

from __future__ import annotations

import httpx
import pytest

from services.gateway.http.app import GatewayApp
from tests.services.gateway.conftest import client_for

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]


def _error(r: httpx.Response, status: int) -> dict[str, object]:
    assert r.status_code == status, r.text
    return r.json()["error"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("where", ["ignored_field", "messages", "top_level"])
async def test_deeply_nested_json_is_a_400(app: GatewayApp, where: str) -> None:
    deep = "[" * 5000 + "]" * 5000
    body = {
        "ignored_field": '{"messages": [{"role": "user", "content": "hi"}], "metadata": ' + deep + "}",
        "messages": '{"messages": ' + deep + "}",
        "top_level": deep,
    }[where]
    async with client_for(app) as c:
        r = await c.post(CHAT, content=body.encode(), headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"])
async def test_non_json_content_type_is_a_415(app: GatewayApp, content_type: str) -> None:
    async with client_for(app) as c:
        r = await c.post(
            CHAT, content=b'{"messages": [{"role": "user", "content": "hi"}]}', headers={"content-type": content_type}
        )
    err = _error(r, 415)
    assert err["code"] == "unsupported_media_type" and "application/json" in str(err["message"])


@pytest.mark.parametrize(
    "content_type", [None, "application/json", "application/json; charset=utf-8", "application/vnd.api+json"]
)
async def test_json_content_types_are_accepted(app: GatewayApp, content_type: str | None) -> None:
    headers = {"content-type": content_type} if content_type else {}
    async with client_for(app) as c:
        r = await c.post(
            CHAT, content=b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}', headers=headers
        )
    assert r.status_code == 200, r.text


async def test_whole_floats_are_integers_but_strings_are_not(app: GatewayApp) -> None:
    async with client_for(app) as c:
        r = await c.post(CHAT, json={"messages": MSG, "max_tokens": 3.0, "seed": 7.0})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 3
        r = await c.post("/v1/completions", json={"prompt": [5.0, 6, 7.0], "max_tokens": 2})
        assert r.status_code == 200, r.text
        assert _error(await c.post(CHAT, json={"messages": MSG, "max_tokens": 2.5}), 400)["param"] == "max_tokens"
        assert _error(await c.post(CHAT, json={"messages": MSG, "max_tokens": "3"}), 400)["param"] == "max_tokens"
