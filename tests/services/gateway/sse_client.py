"""Reading server-sent events the way an OpenAI client does (shared by the gateway tests)."""

from __future__ import annotations

import json
from typing import Any


def parse_sse(body: str) -> tuple[list[dict[str, Any]], bool]:
    """(decoded `data:` events before [DONE], whether [DONE] ended the stream). Every event must be framed
    as `data: ...` followed by a blank line."""
    events: list[dict[str, Any]] = []
    done = False
    assert body.endswith("\n\n"), f"stream does not end with a blank line: {body[-80:]!r}"
    for block in body.split("\n\n")[:-1]:
        assert block.startswith("data: "), f"not an SSE data line: {block[:80]!r}"
        assert not done, "event after [DONE]"
        payload = block[len("data: ") :]
        if payload == "[DONE]":
            done = True
        else:
            events.append(json.loads(payload))
    return events, done


def byte_token_ids(tokenizer: Any, data: bytes) -> list[int]:
    """One token per byte, through the byte-level BPE alphabet (every byte-level vocabulary has these 256)."""
    from services.gateway.text.tokenizer import _byte_level_table

    char_of = {b: c for c, b in _byte_level_table().items()}
    return [tokenizer.fast.token_to_id(char_of[b]) for b in data]
