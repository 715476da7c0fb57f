"""A reasoning model's output split into its thinking and its answer (--reasoning-parser).

    <think>\\nLet me see...\\n</think>\\n\\nThe answer is 4.      (qwen3: the output opens the tag)
    Let me see...\\n</think>\\n\\nThe answer is 4.                (deepseek-r1: the prompt opened it)
 -> reasoning_content "Let me see...", content "The answer is 4."

One `ReasoningSplitter` per choice, fed the text as it is decoded: it returns what is safe to send now and holds
back what could still be a tag split across chunks ("</thi" + "nk>") and whitespace that may turn out to be the
end of the reasoning. A whole answer is split by feeding it at once, so a streamed answer's pieces always add up
to the non-streamed one. The whitespace around the tags is dropped; the text inside is kept as the model wrote it.
An output that ends while still thinking (max_tokens) is all reasoning, as its pieces were already streamed so.
"""

from __future__ import annotations

import enum
from typing import Protocol

from shared.config.choices import ReasoningParser

OPEN, CLOSE = "<think>", "</think>"


class _State(enum.Enum):
    START = 0  # nothing decided yet: is there an opening tag?
    THINKING = 1
    ANSWER = 2


def _tag_prefix(text: str, tag: str) -> int:
    """Length of the longest end of text that is a proper start of tag (it may complete in the next piece)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ReasoningSplitter:
    """Text pieces in, (reasoning, content) pieces out; `finish()` once at the end for what was held back."""

    def __init__(self, style: ReasoningParser) -> None:
        self.style = style
        self._state = _State.START
        self._held = ""  # text received but not yet sent
        self._thought = False  # some reasoning was sent (leading whitespace is dropped until then)
        self._after_close = False  # the answer follows </think>: its leading whitespace is dropped

    def feed(self, text: str) -> tuple[str, str]:
        self._held += text
        reasoning, content = "", ""
        if self._state is _State.START:
            head = self._held.lstrip()
            if head.startswith(OPEN):
                self._state, self._held = _State.THINKING, head[len(OPEN) :]
            elif not head or OPEN.startswith(head):
                return "", ""  # could still be the opening tag
            elif self.style is ReasoningParser.DEEPSEEK_R1:
                self._state = _State.THINKING  # no opening tag: the template put it in the prompt
            else:
                self._state = _State.ANSWER  # qwen3 without <think>: a plain answer
        if self._state is _State.THINKING:
            reasoning = self._think()
        if self._state is _State.ANSWER:
            content = self._answer()
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        """What was held back, once the output ended."""
        held, self._held = self._held, ""
        if self._state is _State.START:  # only whitespace or a piece of "<think>" came
            return (held.strip(), "") if self.style is ReasoningParser.DEEPSEEK_R1 else ("", held)
        if self._state is _State.THINKING:
            return (held if self._thought else held.lstrip()).rstrip(), ""
        return "", held.lstrip() if self._after_close else held

    def _think(self) -> str:
        if not self._thought:
            self._held = self._held.lstrip()
        end = self._held.find(CLOSE)
        if end >= 0:
            out, rest = self._held[:end].rstrip(), self._held[end + len(CLOSE) :]
            self._state, self._held, self._after_close = _State.ANSWER, rest, True
            return out
        keep = len(self._held) - _tag_prefix(self._held, CLOSE)
        out = self._held[:keep].rstrip()  # trailing whitespace waits: it may precede </think>
        self._held = self._held[len(out) :]
        self._thought = self._thought or bool(out)
        return out

    def _answer(self) -> str:
        if self._after_close:
            self._held = self._held.lstrip()
            if not self._held:
                return ""
            self._after_close = False
        out, self._held = self._held, ""
        return out


class Splitter(Protocol):
    def feed(self, text: str) -> tuple[str, str]: ...
    def finish(self) -> tuple[str, str]: ...


def make_splitter(style: ReasoningParser) -> Splitter:
    """The <think> splitter above, or gpt-oss's channels (harmony.py)."""
    if style is ReasoningParser.GPT_OSS:
        from services.gateway.openai.harmony import HarmonySplitter

        return HarmonySplitter()
    return ReasoningSplitter(style)


def split_reasoning(text: str, style: ReasoningParser) -> tuple[str | None, str]:
    """A whole output -> (reasoning_content or None when there was none, content)."""
    s = make_splitter(style)
    r1, c1 = s.feed(text)
    r2, c2 = s.finish()
    return (r1 + r2) or None, c1 + c2
