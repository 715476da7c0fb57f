"""Assembling and serving the gateway app from a resolved gateway config.

`cfg` is what `shared.config.resolve("gateway", argv)` returns; only its model, tokenizer, http and grpc groups
are read. The listen address lives in the grpc group (`--host`, shared by every service) and the port in the
http group (`--port`).
"""

from __future__ import annotations

import os
from typing import Any

from services.gateway.backend import GenerateBackend
from services.gateway.http.app import GatewayApp
from services.gateway.http.media.processor import MediaProcessor
from services.gateway.openai.output_parsers import OutputParsers
from services.gateway.public_tls import uvicorn_ssl_args
from services.gateway.text.tokenizer import GatewayTokenizer
from shared.config.resolved import ResolvedConfig

BUNDLED_PREFIX = "bundled:"


def model_dir_of(cfg: ResolvedConfig) -> str:
    """The local directory of cfg.model.model (a bundled model is prepared once into the cache)."""
    from shared.modelspec.bundled import resolve_model_path

    return str(resolve_model_path(cfg.model.model, cfg.model.model_cache_dir))


def served_names_of(cfg: ResolvedConfig) -> tuple[str, list[str]]:
    """(name listed in /v1/models, other accepted spellings). The config derives served_model_name from --model
    (bundled name, or the directory's name); the --model value as typed is accepted too."""
    spec: str = cfg.model.model
    primary = cfg.model.served_model_name
    if primary is None:  # a hand-built config that skipped the resolution passes
        primary = (
            spec[len(BUNDLED_PREFIX) :] if spec.startswith(BUNDLED_PREFIX) else os.path.basename(os.path.normpath(spec))
        )
    aliases = [spec] if spec != primary else []
    return primary, aliases


def load_tokenizer(cfg: ResolvedConfig, model_dir: str | None = None) -> GatewayTokenizer:
    model_dir = model_dir or model_dir_of(cfg)
    return GatewayTokenizer.from_dir(
        model_dir,
        tokenizer_dir=cfg.tokenizer.tokenizer,
        chat_template_file=cfg.tokenizer.chat_template,
        context_length=cfg.model.context_length,
    )


def build_app(
    cfg: ResolvedConfig, backend: GenerateBackend, *, tokenizer: GatewayTokenizer | None = None
) -> GatewayApp:
    """The ASGI app for `cfg`, generating through `backend`. Pass `tokenizer` to reuse one already loaded."""
    model_dir = None if tokenizer is not None else model_dir_of(cfg)
    tok = tokenizer or load_tokenizer(cfg, model_dir)
    primary, aliases = served_names_of(cfg)
    media = MediaProcessor.for_model(model_dir or model_dir_of(cfg), tok.hf)  # None: a text-only model
    return GatewayApp(
        backend=backend,
        tokenizer=tok,
        served_model_names=[primary],
        model_aliases=aliases,
        api_key=cfg.http.api_key,
        max_request_bytes=cfg.http.max_request_bytes,
        model_root=cfg.model.model,
        media=media,
        media_cfg=cfg.http,
        parsers=OutputParsers.resolve(
            reasoning=cfg.http.reasoning_parser,
            tool_call=cfg.http.tool_call_parser,
            max_parallel_tool_calls=cfg.http.max_parallel_tool_calls,
            template=tok.chat_template or getattr(tok.hf, "chat_template", None),
        ),
    )


def uvicorn_config(cfg: ResolvedConfig, app: GatewayApp, *, access_log: bool = False) -> Any:
    import uvicorn

    level = cfg.telemetry.log_level
    return uvicorn.Config(
        app,
        host=cfg.grpc.host,
        port=cfg.http.port,
        access_log=access_log,
        log_level=level,
        lifespan="on",
        timeout_graceful_shutdown=5,
        server_header=False,
        **uvicorn_ssl_args(cfg.http),
    )


def serve(cfg: ResolvedConfig, backend: GenerateBackend, *, access_log: bool = False) -> None:
    """Serve until SIGINT/SIGTERM (uvicorn; 127.0.0.1 unless --host says otherwise). Access log off by default:
    at a thousand requests per second it costs more than the gateway itself."""
    import uvicorn

    app = build_app(cfg, backend)
    uvicorn.Server(uvicorn_config(cfg, app, access_log=access_log)).run()
