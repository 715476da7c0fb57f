"""OpenAI server URLs as users write them: `http://host:port`, with or without a trailing `/v1` or `/`."""

from __future__ import annotations

from urllib.parse import urlsplit


def openai_base_url(flag: str, text: str) -> str:
    """`http://127.0.0.1:8100/v1/` -> `http://127.0.0.1:8100` (the benchmarks append `/v1/...` themselves).
    ValueError naming `flag` for anything that is not an http(s) URL with a host."""
    url = text.strip()
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError for a port that is not a number)
    except ValueError as e:
        raise ValueError(f"{flag} {text!r} is not a URL ({e}); write it as http://HOST:PORT") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{flag} {text!r} must be an http(s) URL with a host, e.g. http://127.0.0.1:8000")
    if parts.query or parts.fragment:
        raise ValueError(f"{flag} {text!r}: drop the query / fragment; write it as http://HOST:PORT")
    path = parts.path.rstrip("/").removesuffix("/v1")
    return f"{parts.scheme}://{parts.netloc}{path}"
