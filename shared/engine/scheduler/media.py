"""A request's images inside the schedule: their spans checked against the prompt, the part of their embeddings
each prompt chunk needs, and whether positions left to compute lack embeddings (a request whose prompt KV came
from another instance)."""

from __future__ import annotations

from collections.abc import Sequence

from shared.engine.errors import InvalidRequest
from shared.engine.request import MediaInput, Request
from shared.engine.types import EmbedSlice


def check_media(media: Sequence[MediaInput], num_prompt_tokens: int, need_embeds: bool) -> None:
    """Media spans lie inside the prompt, in order, without overlapping; embeddings (where needed) fit them."""
    end = 0
    for i, m in enumerate(media):
        if m.length < 1 or m.offset < end or m.offset + m.length > num_prompt_tokens:
            raise InvalidRequest(
                f"media[{i}] covers prompt positions [{m.offset}, {m.offset + m.length}), which "
                f"is empty, overlaps the previous item or passes the {num_prompt_tokens}-token "
                "prompt",
                field="media",
            )
        if need_embeds and (m.embeds is None or int(m.embeds.shape[0]) != m.length):
            got = None if m.embeds is None else tuple(m.embeds.shape)
            raise InvalidRequest(f"media[{i}] needs embeddings of {m.length} rows (got {got})", field="media")
        end = m.offset + m.length


def embed_slices(media: tuple[MediaInput, ...], start: int, end: int) -> tuple[EmbedSlice, ...]:
    """The parts of a request's image embeddings that fall into the chunk [start, end) of its tokens."""
    out = []
    for m in media:
        lo, hi = max(m.offset, start), min(m.offset + m.length, end)
        if lo < hi and m.embeds is not None:
            out.append(EmbedSlice(lo - start, m.embeds[lo - m.offset : hi - m.offset]))
    return tuple(out)


def lacks_embeds(req: Request) -> bool:
    """Some image position past the cached prefix has no embeddings to compute it with."""
    return any(m.embeds is None and m.offset + m.length > req.num_computed_tokens for m in req.media)
