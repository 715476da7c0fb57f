"""Images in chat requests at the gateway: data: URIs (PNG, JPEG, WebP) decoded once and hashed, placeholders
expanded to the model's image positions, fitted pixels handed to the backend; file:// only under the allowed
directory, http(s) only from allowed hosts (with size limits); every bad image is a 400 with an OpenAI error body
and leaves the gateway serving."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import httpx
import pytest
from PIL import Image

from services.gateway.http.app import GatewayApp
from services.gateway.http.media.images import decode_image
from services.gateway.http.media.processor import MediaProcessor
from services.gateway.http.media.sources import MediaError, load_bytes
from services.gateway.mock.backend import MockBackend
from services.gateway.text.tokenizer import GatewayTokenizer
from shared.config.groups import HttpConfig
from tests.helpers.tiny_vlm import make_image, make_tiny_llava
from tests.services.gateway.conftest import client_for

MODEL = "tiny-vlm"


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llava(tmp_path_factory.mktemp("vlm"), "clip-llama")


@pytest.fixture(scope="module")
def vlm_tokenizer(vlm_dir: Path) -> GatewayTokenizer:
    return GatewayTokenizer.from_dir(vlm_dir)


def make_vlm_app(vlm_dir: Path, tok: GatewayTokenizer, backend: MockBackend, **media: object) -> GatewayApp:
    return GatewayApp(
        backend=backend,
        tokenizer=tok,
        served_model_names=[MODEL],
        media=MediaProcessor.for_model(vlm_dir, tok.hf),
        media_cfg=HttpConfig(**media),
    )


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def chat(*urls: str, text: str = "What is in the picture?") -> dict:
    parts: list[dict] = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return {
        "model": MODEL,
        "max_tokens": 3,
        "messages": [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}],
    }


async def post(app: GatewayApp, body: dict) -> httpx.Response:
    async with client_for(app) as c:
        return await c.post("/v1/chat/completions", json=body)


def assert_400(r: httpx.Response, code: str | None = None, fragment: str = "") -> None:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    if code is not None:
        assert err["code"] == code, err
    assert fragment in err["message"], err["message"]


async def test_images_are_decoded_hashed_and_expanded(vlm_dir: Path, vlm_tokenizer: GatewayTokenizer) -> None:
    backend = MockBackend([MODEL], vocab_size=vlm_tokenizer.vocab_size)
    app = make_vlm_app(vlm_dir, vlm_tokenizer, backend)
    proc = app.media.processor
    assert proc is not None and proc.placeholder == "<image>" and proc.num_image_tokens == 16
    png, jpg, webp = make_image(1), make_image(2, (50, 20), "JPEG"), make_image(3, (33, 33), "WEBP")
    r = await post(app, chat(data_uri(png), data_uri(jpg, "image/jpeg"), data_uri(webp, "image/webp")))
    assert r.status_code == 200, r.text
    req = backend.requests[-1]
    ids = req.prompt_token_ids
    assert [m.num_tokens for m in req.media] == [16, 16, 16]
    for m, raw in zip(req.media, (png, jpg, webp)):
        assert ids[m.offset : m.offset + 16] == (proc.image_token_id,) * 16
        img = Image.open(io.BytesIO(raw)).convert("RGB")
        assert m.data == proc.spec.fit(img).tobytes() and len(m.data) == 32 * 32 * 3
    assert ids.count(proc.image_token_id) == 48 and len({m.media_hash for m in req.media}) == 3
    # the prompt tokens outside the images are the templated text's
    assert r.json()["usage"]["prompt_tokens"] == len(ids)

    # the hash is of the decoded pixels: the same picture re-encoded hashes the same, another picture differently
    same = io.BytesIO()
    Image.open(io.BytesIO(png)).save(same, format="PNG", compress_level=1)
    r2 = await post(app, chat(data_uri(same.getvalue())))
    assert r2.status_code == 200 and backend.requests[-1].media[0].media_hash == req.media[0].media_hash
    assert decode_image(make_image(9), max_pixels=10**6).media_hash != req.media[0].media_hash


@pytest.mark.parametrize(
    "url,fragment",
    [
        ("data:image/png;base64,@@@notbase64", "not valid base64"),
        (data_uri(b"definitely not an image"), "not a PNG, JPEG or WebP"),
        (data_uri(make_image(1)[:60]), "could not be decoded"),
        (data_uri(make_image(1), "image/gif"), "accepted image types"),
        ("data:text/plain,hello", "accepted image types"),
        ("file:///etc/passwd", "--allowed-local-media-path"),
        ("https://example.com/cat.png", "--allowed-media-domains"),
        ("ftp://example.com/cat.png", "not supported"),
    ],
)
async def test_bad_images_are_400(vlm_dir: Path, vlm_tokenizer: GatewayTokenizer, url: str, fragment: str) -> None:
    backend = MockBackend([MODEL], vocab_size=vlm_tokenizer.vocab_size)
    app = make_vlm_app(vlm_dir, vlm_tokenizer, backend)
    r = await post(app, chat(url))
    assert_400(r, fragment=fragment)
    assert r.json()["error"]["param"] == "messages[0].content[0].image_url.url"
    assert not backend.requests
    assert (await post(app, chat(data_uri(make_image(4))))).status_code == 200  # nothing else disturbed


async def test_limits(vlm_dir: Path, vlm_tokenizer: GatewayTokenizer) -> None:
    backend = MockBackend([MODEL], vocab_size=vlm_tokenizer.vocab_size)
    img = data_uri(make_image(5))
    app = make_vlm_app(vlm_dir, vlm_tokenizer, backend, limit_mm_per_prompt=2)
    assert_400(await post(app, chat(img, img, img)), "too_many_images", "--limit-mm-per-prompt")
    assert (await post(app, chat(img, img))).status_code == 200
    small = make_vlm_app(vlm_dir, vlm_tokenizer, backend, max_image_bytes=1024)
    assert_400(await post(small, chat(data_uri(make_image(6, (200, 200))))), "invalid_image", "--max-image-bytes")
    few = make_vlm_app(vlm_dir, vlm_tokenizer, backend, max_image_pixels=100)
    assert_400(await post(few, chat(img)), "invalid_image", "--max-image-pixels")
    # a placeholder typed into the text does not pair with an image
    assert_400(await post(app, chat(img, text="look: <image>")), "invalid_image", "placeholder")


async def test_text_only_model_refuses_images(app: GatewayApp) -> None:
    assert_400(await post(app, chat(data_uri(make_image(1)))), "unsupported", "text-only")


async def test_local_files_only_under_the_allowed_directory(
    vlm_dir: Path, vlm_tokenizer: GatewayTokenizer, tmp_path: Path
) -> None:
    allowed = tmp_path / "media"
    allowed.mkdir()
    (allowed / "cat.png").write_bytes(make_image(7))
    (tmp_path / "secret.png").write_bytes(make_image(8))
    backend = MockBackend([MODEL], vocab_size=vlm_tokenizer.vocab_size)
    app = make_vlm_app(vlm_dir, vlm_tokenizer, backend, allowed_local_media_path=str(allowed))
    assert (await post(app, chat(f"file://{allowed}/cat.png"))).status_code == 200
    assert_400(await post(app, chat(f"file://{allowed}/../secret.png")), "invalid_image", "outside")
    assert_400(await post(app, chat(f"file://{allowed}/missing.png")), "invalid_image", "cannot read")


async def test_remote_images_only_from_allowed_hosts_with_limits() -> None:
    big = make_image(1, (300, 300), "PNG")

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/big.png":
            return httpx.Response(200, content=big)
        if request.url.path == "/missing.png":
            return httpx.Response(404)
        return httpx.Response(200, content=make_image(2))

    cfg = HttpConfig(allowed_media_domains=("images.example",), max_image_bytes=64 * 1024)
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        data = await load_bytes("https://images.example/cat.png", cfg, client)
        assert Image.open(io.BytesIO(data)).size == (45, 37)
        for url, fragment in [
            ("https://other.example/cat.png", "not in the allowed"),
            ("https://images.example/missing.png", "HTTP 404"),
        ]:
            with pytest.raises(MediaError, match=fragment):
                await load_bytes(url, cfg, client)
        assert len(big) > cfg.max_image_bytes
        with pytest.raises(MediaError, match="larger than"):
            await load_bytes("https://images.example/big.png", cfg, client)
