"""OpenAI `image_url` content parts -> the placeholder text of the templated prompt, with the URL set aside."""

from __future__ import annotations

from typing import Any

from services.gateway.openai.errors import ApiError, bad_request


def image_part(part: Any, param: str, placeholder: str | None, urls: list[tuple[str, str]]) -> str:
    """The text an image part stands for in its message (the model's image token); records (param, url)."""
    if placeholder is None:
        raise bad_request(
            f"{param}: this model is text-only and does not take images; send text parts only", param, "unsupported"
        )
    value = part.image_url
    url = value.get("url") if isinstance(value, dict) else value if isinstance(value, str) else None
    if not isinstance(url, str) or not url:
        raise bad_request(
            f"{param}.image_url must be an object with a non-empty 'url' (a data: URI)", f"{param}.image_url"
        )
    detail = value.get("detail", "auto") if isinstance(value, dict) else "auto"
    if detail not in ("auto", "low", "high"):
        raise bad_request(
            f"{param}.image_url.detail must be 'auto', 'low' or 'high' (got {detail!r})", f"{param}.image_url.detail"
        )
    urls.append((f"{param}.image_url.url", url))
    return placeholder


def too_many(n: int, limit: int) -> ApiError:
    return bad_request(
        f"the request has {n} images, more than this server's limit of {limit} per prompt (--limit-mm-per-prompt)",
        "messages",
        "too_many_images",
    )
