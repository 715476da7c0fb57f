"""A NATS connection that carries typed messages and never lets an outage raise into the service.

Payloads are msgpack-encoded frozen msgspec Structs; a subscriber names the type it expects and gets only
well-formed values of it (anything else is counted, logged at most once a second per subject, and dropped).

During an outage the client reconnects on its own (forever, every `reconnect_wait_s`), and subscriptions come back
with it. A publish then follows `outage_policy`: "buffer" queues it (bounded by `pending_bytes`; once full, further
publishes are dropped) and it goes out after the reconnect; "drop" drops it at once. Either way publish() returns
False instead of raising, and `stats` counts what was dropped.

Headers: `headers_hook()` (e.g. the current W3C trace context) is merged into every published message's headers,
and subscribers see them in `Meta.headers`.

TLS: with `tls` (shared.cluster.tls.TlsFiles) the connection verifies the server against the cluster CA and
presents this service's certificate, when the server asks for TLS (a tls:// URL or a server with TLS on).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

import msgspec
import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError

from shared.cluster.errors import nats_unavailable
from shared.cluster.tls import TlsFiles
from shared.config.choices import BusOutagePolicy
from shared.config.groups import BusConfig

log = logging.getLogger(__name__)

T = TypeVar("T", bound=msgspec.Struct)
R = TypeVar("R", bound=msgspec.Struct)

OUTAGE_POLICIES = ("buffer", "drop")
_NO_HEADERS: Mapping[str, str] = MappingProxyType({})


class Meta(msgspec.Struct, frozen=True):
    """Envelope of a received message (a Struct: built once per message, so it must be cheap)."""

    subject: str
    headers: Mapping[str, str]
    reply: str = ""
    data: bytes = b""  # the payload as received (what a signature covers: shared.cluster.bus.admin_auth)


Handler = Callable[[T, Meta], Awaitable[None] | None]
Responder = Callable[[T, Meta], Awaitable[R] | R]


@dataclass
class BusStats:
    published: int = 0
    dropped: int = 0  # publishes lost to an outage (or a full buffer)
    received: int = 0
    malformed: int = 0  # payloads that did not decode as the declared type
    handler_errors: int = 0
    disconnects: int = 0
    reconnects: int = 0
    buffered_during_outage: int = 0


@dataclass
class _RateLimit:
    """At most one log line per key per interval."""

    interval_s: float = 1.0
    last: dict[str, float] = field(default_factory=dict)

    def ok(self, key: str) -> bool:
        now = time.monotonic()
        if now - self.last.get(key, -1e9) < self.interval_s:
            return False
        self.last[key] = now
        return True


class Bus:
    def __init__(
        self,
        url: str,
        *,
        name: str = "pdrelay",
        outage_policy: str = "buffer",
        pending_bytes: int = 4 << 20,
        reconnect_wait_s: float = 0.5,
        headers_hook: Callable[[], Mapping[str, str]] | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        if outage_policy not in OUTAGE_POLICIES:
            raise ValueError(
                f"bus outage policy {outage_policy!r} must be one of {OUTAGE_POLICIES}; use --bus-outage-policy buffer"
            )
        self.url = url
        self.name = name
        self.outage_policy = outage_policy
        self._pending_bytes = pending_bytes
        self._reconnect_wait_s = reconnect_wait_s
        self._headers_hook = headers_hook
        self._tls = tls
        self._nc: NatsClient | None = None
        self._encoder = msgspec.msgpack.Encoder()
        self._decoders: dict[type, msgspec.msgpack.Decoder[Any]] = {}
        self._limit = _RateLimit()
        self._outage_since: float | None = None
        self._closing = False
        self.stats = BusStats()

    @classmethod
    def from_config(cls, bus_cfg: BusConfig, name: str, **kw: Any) -> Bus:
        """From a BusConfig group (nats_url, bus_outage_policy)."""
        return cls(bus_cfg.nats_url, name=name, outage_policy=bus_cfg.bus_outage_policy, **kw)

    # ------------------------------------------------------------------ connection

    @property
    def connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    async def connect(self, timeout_s: float = 5.0) -> Bus:
        """Connect once; ControlPlaneUnavailable naming the URL if NATS does not answer within `timeout_s`."""
        nc = NatsClient()
        tls = self._tls.client_ssl_context() if self._tls is not None else None
        try:
            await asyncio.wait_for(
                nc.connect(
                    servers=[self.url],
                    name=self.name,
                    connect_timeout=max(1, int(timeout_s)),
                    reconnect_time_wait=self._reconnect_wait_s,  # type: ignore[arg-type]  # annotated int, used as seconds
                    max_reconnect_attempts=-1,
                    pending_size=self._pending_bytes,
                    flush_timeout=2.0,
                    error_cb=self._on_error,
                    disconnected_cb=self._on_disconnected,
                    reconnected_cb=self._on_reconnected,
                    tls=tls,
                ),
                timeout_s,
            )
        except (TimeoutError, OSError, NatsError) as e:
            try:
                await nc.close()
            except Exception:  # noqa: BLE001 - closing a never-connected client fails variously; nothing to keep
                pass
            raise nats_unavailable(self.url, f"no answer within {timeout_s:g} s ({type(e).__name__})") from None
        self._nc = nc
        return self

    async def flush(self, timeout_s: float = 2.0) -> None:
        """One round trip to the server: subscriptions made before it are in place there (other connections'
        messages reach them)."""
        assert self._nc is not None, "connect() first"
        await self._nc.flush(timeout=max(1, int(timeout_s)))

    async def close(self) -> None:
        self._closing = True
        if self._nc is not None:
            nc, self._nc = self._nc, None
            try:
                await asyncio.wait_for(nc.drain() if nc.is_connected else nc.close(), 3.0)
            except (TimeoutError, NatsError, OSError):
                await nc.close()

    async def __aenter__(self) -> Bus:
        if self._nc is None:
            await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _on_error(self, e: Exception) -> None:
        if self._limit.ok(f"error:{type(e).__name__}"):
            log.debug("nats %s: %s: %s", self.url, type(e).__name__, e)

    async def _on_disconnected(self) -> None:
        if self._closing:
            return
        if self._outage_since is None:
            self._outage_since = time.monotonic()
        self.stats.disconnects += 1
        log.warning(
            "NATS %s disconnected; reconnecting every %.1f s (publishes: %s)",
            self.url,
            self._reconnect_wait_s,
            self.outage_policy,
        )

    async def _on_reconnected(self) -> None:
        self.stats.reconnects += 1
        took = time.monotonic() - self._outage_since if self._outage_since is not None else 0.0
        self._outage_since = None
        log.warning("NATS %s reconnected after %.1f s", self.url, took)

    # ------------------------------------------------------------------ publish

    def _headers(self, extra: Mapping[str, str] | None) -> dict[str, str] | None:
        h: dict[str, str] = {}
        if self._headers_hook is not None:
            try:
                h.update(self._headers_hook())
            except Exception:  # tracing must never break publishing
                log.exception("bus headers hook failed")
        if extra:
            h.update(extra)
        return h or None

    async def publish(self, subject: str, msg: msgspec.Struct, *, headers: Mapping[str, str] | None = None) -> bool:
        """Send `msg`; True if it was handed to the connection (sent or buffered), False if dropped. Never raises
        for outages; a bad subject or an unencodable message is a programming error and does raise."""
        payload = self._encoder.encode(msg)
        return await self.publish_raw(subject, payload, headers=headers)

    async def publish_raw(self, subject: str, payload: bytes, *, headers: Mapping[str, str] | None = None) -> bool:
        nc = self._nc
        if nc is None or nc.is_closed:
            self.stats.dropped += 1
            return False
        outage = not nc.is_connected
        if outage and self.outage_policy == BusOutagePolicy.DROP:
            self.stats.dropped += 1
            return False
        try:
            await nc.publish(subject, payload, headers=self._headers(headers))
        except (nats.errors.BadSubjectError, nats.errors.BadHeaderError):
            raise  # a programming error, not an outage
        except nats.errors.OutboundBufferLimitError:
            self.stats.dropped += 1
            if self._limit.ok("buffer-full"):
                log.warning(
                    "NATS outage buffer (%d bytes) is full; dropping publishes until %s is back",
                    self._pending_bytes,
                    self.url,
                )
            return False
        except (NatsError, OSError) as e:
            self.stats.dropped += 1
            if self._limit.ok(f"publish:{type(e).__name__}"):
                log.warning("publish to %s dropped: %s: %s", subject, type(e).__name__, e)
            return False
        self.stats.published += 1
        if outage:
            self.stats.buffered_during_outage += 1
        return True

    # ------------------------------------------------------------------ subscribe

    def _decoder(self, typ: type[T]) -> msgspec.msgpack.Decoder[T]:
        dec = self._decoders.get(typ)
        if dec is None:
            dec = self._decoders[typ] = msgspec.msgpack.Decoder(typ)
        return dec

    def _malformed(self, subject: str, typ: type, e: Exception) -> None:
        self.stats.malformed += 1
        if self._limit.ok(f"malformed:{subject}"):
            log.warning("dropping a malformed message on %s (expected %s): %s", subject, typ.__name__, e)

    def _decode(self, typ: type[T], msg: Msg) -> T | None:
        try:
            return self._decoder(typ).decode(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as e:
            self._malformed(msg.subject, typ, e)
            return None

    async def subscribe(self, subject: str, msg_type: type[T], handler: Handler[T], *, queue: str = "") -> Subscription:
        """Call `handler(msg, meta)` (sync or async) for every well-formed `msg_type` on `subject` (wildcards ok).

        Messages are handled one at a time per subscription, in order. A handler exception is logged and counted.
        """
        assert self._nc is not None, "connect() first"
        decode = self._decoder(msg_type).decode
        stats = self.stats

        async def on_msg(raw: Msg) -> None:
            stats.received += 1
            try:
                value = decode(raw.data)
            except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as e:
                self._malformed(raw.subject, msg_type, e)
                return
            meta = Meta(raw.subject, raw.headers or _NO_HEADERS, raw.reply or "", raw.data)
            try:
                res = handler(value, meta)
                if res is not None and inspect.isawaitable(res):
                    await res
            except Exception:
                self.stats.handler_errors += 1
                log.exception("handler for %s failed", raw.subject)

        return await self._nc.subscribe(subject, queue=queue, cb=on_msg)

    # ------------------------------------------------------------------ request / reply

    def encode(self, msg: msgspec.Struct) -> bytes:
        """The payload `publish(subject, msg)` sends (for signing it first: publish_raw / request_raw)."""
        return self._encoder.encode(msg)

    async def request(self, subject: str, msg: msgspec.Struct, reply_type: type[R], *, timeout_s: float = 2.0) -> R:
        """One request, one typed reply. Raises TimeoutError when nobody answers (or NATS is down)."""
        return await self.request_raw(subject, self._encoder.encode(msg), reply_type, timeout_s=timeout_s)

    async def request_raw(
        self,
        subject: str,
        payload: bytes,
        reply_type: type[R],
        *,
        timeout_s: float = 2.0,
        headers: Mapping[str, str] | None = None,
    ) -> R:
        """`request` with an encoded payload and extra headers."""
        assert self._nc is not None, "connect() first"
        try:
            raw = await self._nc.request(subject, payload, timeout=timeout_s, headers=self._headers(headers))
        except (TimeoutError, nats.errors.TimeoutError, nats.errors.NoRespondersError) as e:
            raise TimeoutError(f"no reply on {subject} within {timeout_s:g} s ({type(e).__name__})") from None
        value = self._decode(reply_type, raw)
        if value is None:
            raise ValueError(f"the reply on {subject} is not a {reply_type.__name__}")
        return value

    async def serve(self, subject: str, req_type: type[T], responder: Responder[T, R]) -> Subscription:
        """Answer requests on `subject` with what `responder(req, meta)` returns."""

        async def handle(req: T, meta: Meta) -> None:
            res = responder(req, meta)
            reply = await res if inspect.isawaitable(res) else res
            if meta.reply:
                await self.publish(meta.reply, reply)

        return await self.subscribe(subject, req_type, handle)
