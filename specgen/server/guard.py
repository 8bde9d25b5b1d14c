"""ASGI middleware in front of the routes: the API key and the body size limit.

Both answer in the OpenAI error shape themselves, before any route runs or any JSON is
parsed, so nothing behind them sees an unauthenticated request or an oversized body.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import socket
from collections.abc import Callable, Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

Refused = Callable[[Scope, int, str], None]
"""Told of each request a guard refuses: (its scope, the HTTP status, why), for the
server's refusal metric and log (`specgen.server.app`), as the routes' refusals are."""

DEFAULT_MAX_BODY_BYTES = 1 << 20
DRAIN_FACTOR = 8
"""Bodies up to this many times the limit are read to their end before the 413."""
DEFAULT_BODY_TIMEOUT_S = 60.0
"""Seconds a request's body may take to arrive whole, else a 408: a client trickling a
body a byte at a time held its connection for as long as it liked (nginx's
``client_body_timeout`` is 60 s between reads)."""
DEFAULT_SEND_TIMEOUT_S = 60.0
"""Seconds a streamed response's client may take no data before its stream is ended and
its slots freed (`specgen.server.responses.Streamed`; nginx's ``send_timeout``)."""


def error_json(message: str, type_: str, code: str | int | None = None) -> bytes:
    body = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()  # as JSONResponse


async def send_error(
    send: Send,
    status: int,
    body: bytes,
    headers: Iterable[tuple[bytes, bytes]] = (),
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class ApiKey:
    """Every route but those in `open_paths` needs ``Authorization: Bearer KEY``.

    The scheme is case-insensitive (``bearer KEY`` is the same credential: RFC 7235
    §2.1) and may be followed by more than one space; the key is compared in constant
    time (`hmac.compare_digest` on bytes); a wrong or missing key gets 401 with
    ``WWW-Authenticate: Bearer``. The key is never logged or echoed back.
    """

    def __init__(
        self,
        app: ASGIApp,
        key: str,
        open_paths: frozenset[str],
        refused: Refused | None = None,
    ) -> None:
        self.app = app
        self._expected = key.encode("utf-8")
        self._open = open_paths
        self._refused = refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self._open:
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                given = value
        if not hmac.compare_digest(bearer_token(given), self._expected):
            what = "missing" if not given else "invalid"
            message = (
                f"{what} API key: send the header 'Authorization: Bearer KEY'"
                " with the key the server was started with (--api-key)"
            )
            if self._refused is not None:
                self._refused(scope, 401, f"{what} API key")  # never the key itself
            await send_error(
                send,
                401,
                error_json(message, "invalid_request_error", "invalid_api_key"),
                [(b"www-authenticate", b"Bearer")],
            )
            return
        await self.app(scope, receive, send)


def bearer_token(authorization: bytes) -> bytes:
    """The token of an ``Authorization: Bearer TOKEN`` header value, the scheme in any
    case (RFC 7235 §2.1: ``auth-scheme 1*SP token68``); ``b""`` for another scheme or
    none, which no key equals."""
    scheme, _, token = authorization.partition(b" ")
    if scheme.lower() != b"bearer":
        return b""
    return token.lstrip(b" ")


def is_loopback(host: str) -> bool:
    """True for localhost (and names under ``.localhost``, which browsers resolve to the
    loopback interface themselves, RFC 6761 section 6.3) and loopback addresses
    (127.0.0.0/8, ::1)."""
    name = host.lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        pass
    try:  # the shorthands the resolver takes too: 127.1, 2130706433
        return ipaddress.ip_address(socket.inet_ntoa(socket.inet_aton(name))).is_loopback
    except OSError:
        return False


def _host_name(value: bytes) -> str:
    """The host of a Host header value, without its port (``[::1]:8080`` -> ``[::1]``)."""
    text = value.decode("latin-1").strip()
    if text.startswith("["):
        return text[: text.find("]") + 1] if "]" in text else text
    return text.rsplit(":", 1)[0] if text.count(":") == 1 else text


class _HeaderGuard:
    """Refuse with 403 a request whose `header` `_refusal` objects to, before the routes;
    a request without that header passes (clients outside a browser send no Origin, an
    HTTP/1.0 request no Host)."""

    header = b""

    def __init__(self, app: ASGIApp, refused: Refused | None = None) -> None:
        self.app = app
        self._refused = refused

    def _refusal(self, value: bytes) -> tuple[str, str, str] | None:
        """(why for the log, message, code), or None to serve the request."""
        raise NotImplementedError

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        value = None
        if scope["type"] == "http":
            value = next((v for k, v in scope["headers"] if k == self.header), None)
        refusal = self._refusal(value) if value is not None else None
        if refusal is None:
            await self.app(scope, receive, send)
            return
        why, message, code = refusal
        if self._refused is not None:
            self._refused(scope, 403, why)
        await send_error(send, 403, error_json(message, "invalid_request_error", code))


class LoopbackHosts(_HeaderGuard):
    """On a server bound to the loopback interface, refuse with 403 a request whose
    ``Host`` header names another host: a web page can rebind its own domain name to
    127.0.0.1 (DNS rebinding) and then read the server's answers as same-origin ones; its
    requests still name that domain in Host. Clients of the loopback server name
    localhost or a loopback address."""

    header = b"host"

    def _refusal(self, value: bytes) -> tuple[str, str, str] | None:
        if is_loopback(_host_name(value)):
            return None
        message = (
            f"the Host {value.decode('latin-1')[:200]!r} is not this loopback server's:"
            " connect to localhost or 127.0.0.1 (a server for other hosts is started with"
            " --host)"
        )
        return "a Host that is not a loopback name", message, "host_not_allowed"


class Origins(_HeaderGuard):
    """Refuse with 403 every request a browser page sends from an origin not given with
    ``--cors``: its ``Origin`` header names it (browsers send it with every cross-origin
    request, and with every POST), clients outside a browser (the SDKs, curl) send none.
    ``*`` among the allowed origins allows every page, as it does for the CORS headers.

    CORS headers only keep a page from *reading* an answer; a "simple" cross-site POST
    (``Content-Type: text/plain`` or a form, no preflight) is still served, so without this
    any page an operator opens could drive the server's generation (cross-site request
    forgery; OWASP's "Verifying Origin With Standard Headers").
    """

    header = b"origin"

    def __init__(
        self, app: ASGIApp, allowed: Iterable[str] = (), refused: Refused | None = None
    ) -> None:
        super().__init__(app, refused)
        self._allowed = frozenset(o.encode("latin-1") for o in allowed)
        self._any = b"*" in self._allowed

    def _refusal(self, value: bytes) -> tuple[str, str, str] | None:
        if self._any or value in self._allowed:
            return None
        message = (
            f"a request from the web page origin {value.decode('latin-1')[:200]!r} is"
            " refused: start the server with --cors ORIGIN to serve that page"
        )
        return "a web page's origin not given with --cors", message, "origin_not_allowed"


class _TooLarge(Exception):
    def __init__(self, more: bool) -> None:
        super().__init__()
        self.more = more  # the body goes on past the chunk that crossed the limit


class BodyLimit:
    """Refuse request bodies over `max_bytes` with 413, before the route parses them.

    A Content-Length over the limit is refused at once; otherwise the body is read here
    (counting the bytes as they come, for chunked bodies too) and replayed to the app,
    whose later `receive` calls (a disconnect) pass through. Before the 413, what is left of
    a body up to `DRAIN_FACTOR` times the limit is read and dropped, for at most the body's
    timeout: a client that sends its whole body before reading (Python's urllib,
    http.client) would otherwise meet a connection reset, not the answer; a larger body is
    cut off unread.
    """

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int = DEFAULT_MAX_BODY_BYTES,
        refused: Refused | None = None,
        timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self._refused = refused
        self.timeout_s = timeout_s

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, left: bool) -> None:
        if left:  # `left`: the body may still be arriving
            # within the body's timeout: a client that announced a body over the limit and
            # then went silent held its connection (and a file descriptor) for ever
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._drain(receive), self.timeout_s)
        message = f"the request body is over the limit of {self.max_bytes} bytes"
        if self._refused is not None:
            self._refused(scope, 413, message)
        body = error_json(message, "invalid_request_error", "request_too_large")
        await send_error(send, 413, body, [(b"connection", b"close")])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                # the HTTP server has already refused a Content-Length that is no number
                if value.isdigit() and int(value) > self.max_bytes:
                    # a client that sent `Expect: 100-continue` waits for this answer
                    # before its body: nothing to read, and asking for it would fetch it
                    waits = (b"expect", b"100-continue") in [
                        (k, v.lower()) for k, v in scope["headers"]
                    ]
                    drain = not waits and int(value) <= DRAIN_FACTOR * self.max_bytes
                    await self._refuse(scope, receive, send, drain)
                    return
        try:
            body = await asyncio.wait_for(self._read(receive), self.timeout_s)
        except _TooLarge as e:
            await self._refuse(scope, receive, send, e.more)
            return
        except asyncio.TimeoutError:  # (TimeoutError itself only from Python 3.11)
            message = f"the request body did not arrive within {self.timeout_s:g} s"
            if self._refused is not None:
                self._refused(scope, 408, message)
            body = error_json(message, "invalid_request_error", "request_timeout")
            await send_error(send, 408, body, [(b"connection", b"close")])
            return
        if body is None:  # the client left before sending its body
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _drain(self, receive: Receive) -> None:
        size = 0
        while size <= DRAIN_FACTOR * self.max_bytes:
            message = await receive()
            if message["type"] == "http.disconnect" or not message.get("more_body", False):
                return
            size += len(message.get("body", b""))

    async def _read(self, receive: Receive) -> bytes | None:
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise _TooLarge(bool(message.get("more_body", False)))
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)
