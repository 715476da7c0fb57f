"""gpt-oss's answers (the "harmony" format) split into reasoning and content (--reasoning-parser gpt-oss).

    <|channel|>analysis<|message|>Let me see...<|end|><|start|>assistant<|channel|>final<|message|>It is 4.<|return|>
 -> reasoning_content "Let me see...", content "It is 4."

Each message is a header (role, `<|channel|>` name, a recipient `to=functions.f` for a tool call, `<|constrain|>`)
then `<|message|>` and the body, which ends at `<|end|>`, `<|return|>`, `<|call|>` or the next `<|start|>`. The
analysis channel is reasoning; final and commentary (a preamble the user may see) are content. A tool call (a
recipient) stays in the content as `<|channel|>commentary to=functions.f<|message|>{...}<|call|>` for the gpt-oss
tool-call format (formats_tagged.py) to read; a call cut by max_tokens lacks its `<|call|>`. The markers are special tokens, so the gateway decodes with them kept when this parser is on
(OutputParsers.keeps_special_tokens); an answer with no markers at all is plain content.

Same contract as reasoning.ReasoningSplitter: text pieces in, (reasoning, content) out as soon as it is safe, a
possible marker split across pieces ("<|chan" + "nel|>") held back; a whole answer is one feed, so streamed pieces
add up to the non-streamed split.
"""

from __future__ import annotations

import re

_MARKER = re.compile(r"<\|(start|channel|message|end|return|call|constrain)\|>")
_ENDS = ("end", "return", "call")
_RECIPIENT = re.compile(r"to=([^\s<]+)")
CALL_OPEN = "<|channel|>commentary to="  # how a call starts in the content this splitter leaves


class HarmonySplitter:
    def __init__(self) -> None:
        self._held = ""
        self._header: str | None = ""  # the header being read; None: inside a body
        self._dest = "content"  # where the current body goes: reasoning | content | call
        self._plain = False  # no marker opened the answer: all of it is content
        self._seen = False  # a marker was read

    def feed(self, text: str) -> tuple[str, str]:
        self._held += text
        head = self._held.lstrip()
        if self._header == "" and not self._seen and not head.startswith("<|"[: len(head)]):
            self._plain = True
        if self._plain:
            out, self._held = self._held, ""
            return "", out
        return self._drain(final=False)

    def finish(self) -> tuple[str, str]:
        if self._plain:
            out, self._held = self._held, ""
            return "", out
        return self._drain(final=True)

    def _drain(self, *, final: bool) -> tuple[str, str]:
        reasoning, content = [], []
        while True:
            m = _MARKER.search(self._held)
            upto = m.start() if m else len(self._held) if final else self._safe_end()
            piece = self._held[:upto]
            if self._header is None:  # a body: its text goes out
                if self._dest == "reasoning":
                    reasoning.append(piece)
                else:
                    content.append(piece)
            else:
                self._header += piece
            if m is None:
                self._held = self._held[upto:]
                return "".join(reasoning), "".join(content)
            self._held = self._held[m.end() :]
            self._seen = True
            self._marker(m.group(0), m.group(1), reasoning, content)

    def _marker(self, marker: str, name: str, reasoning: list[str], content: list[str]) -> None:
        """One marker: it ends a body, or builds a header, or (out of place in a body) stays text of that body."""
        out = reasoning if self._dest == "reasoning" else content
        if self._header is None:
            if name in _ENDS or name == "start":
                if self._dest == "call":
                    out.append("<|call|>")
                self._header = ""
            else:
                out.append(marker)
            return
        if name != "message":
            self._header += marker if name in ("channel", "constrain") else ""
            return
        header, self._header = self._header, None
        to = _RECIPIENT.search(header)
        if to is not None:  # a tool call: kept for the tool-call format, in one spelling wherever the header put it
            self._dest = "call"
            content.append(f"{CALL_OPEN}{to.group(1)}<|message|>")
        else:
            self._dest = "reasoning" if _channel(header) == "analysis" else "content"

    def _safe_end(self) -> int:
        """Where the text that cannot still become a marker ends: before a trailing "<|..." not yet closed."""
        at = self._held.rfind("<")
        if at >= 0 and "|>" not in self._held[at:] and len(self._held) - at < 16:
            return at
        return len(self._held)


def _channel(header: str) -> str:
    """The channel a header names: `<|channel|>analysis` -> "analysis" (the role before it may be there too)."""
    _, _, after = header.rpartition("<|channel|>")
    return after.split()[0] if after.split() else ""
