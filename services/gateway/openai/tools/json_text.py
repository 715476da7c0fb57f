"""Reading tool calls out of text as it streams: JSON values one after another, and a tag's start at the end."""

from __future__ import annotations

import json
import re
from typing import Any

_DECODER = json.JSONDecoder()
_WS = re.compile(r"[\s;,]*")  # between calls: whitespace, llama3's ";", an array's ","


def tag_prefix(text: str, tag: str) -> int:
    """Length of the longest end of text that is a proper start of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def json_items(text: str, pos: int, partial: bool, *, until: str = "") -> tuple[list[Any], int] | None:
    """JSON values from pos on, separated by whitespace, ',' or ';', up to `until` (e.g. an array's "]") or the
    end. -> (values, position after them); None when something else is there (partial: the values before it)."""
    items: list[Any] = []
    while True:
        sep = _WS.match(text, pos)
        assert sep is not None  # the pattern matches the empty string
        pos = sep.end()
        if pos == len(text):
            return items, pos
        if until and text.startswith(until, pos):
            return items, pos + len(until)
        try:
            value, pos = _DECODER.raw_decode(text, pos)
        except ValueError:
            return (items, pos) if partial else None
        items.append(value)


class Tagged:
    """A format whose calls start at TAG: where they begin, and how much of the text's end could still become it."""

    TAG = ""

    def start(self, text: str) -> int:
        return text.find(self.TAG)

    def held(self, text: str) -> int:
        return tag_prefix(text, self.TAG)


class TaggedBlocks(Tagged):
    """Calls as TAG ... END blocks, each read by parse(); the last block may lack its END (a model may stop there)."""

    END = ""

    def parse(self, body: str) -> Any | None:
        raise NotImplementedError

    def items(self, text: str, partial: bool) -> list[Any] | None:
        out: list[Any] = []
        for block in text.split(self.TAG)[1:]:
            body, closed, _ = block.partition(self.END)
            call = self.parse(body)
            if call is None:
                if partial and not closed:
                    break  # the block max_tokens cut
                return None
            out.append(call)
        return out
