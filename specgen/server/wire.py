"""The HTTP/1.1 parser's refusals in OpenAI's error shape, and a limit on a request's head.

uvicorn answers a request its parser cannot read (an unknown method, a malformed chunked
body, a broken request line) itself, before any ASGI app runs, with the plain-text body
``Invalid HTTP request received.``. `protocol` is uvicorn's own protocol class (httptools'
where installed, else h11's) with that answer replaced by a JSON error body as every other
refusal of the server, naming what was wrong where the parser says it.

It also bounds the request line plus headers at `max_head_bytes` (a 200 KB header line
was accepted: llhttp, httptools' parser, has no limit of its own, and h11's is its 16 KiB
buffer): over it the answer is 400, as llama-server's (cpp-httplib refuses a header line
over 8 KiB). A refused request closes its connection, as uvicorn's own refusal does.
"""

from __future__ import annotations

import json
from typing import Any

DEFAULT_MAX_HEAD_BYTES = 64 * 1024
"""Request line plus headers, bytes (Node.js allows 16 KiB, nginx 4 x 8 KiB lines)."""
LINGER_S = 2.0
"""How long a refused connection's further bytes are read and dropped before closing."""
DEFAULT_HEAD_TIMEOUT_S = 30.0
"""Seconds a connection may take to send a request's line and headers (from when it
opened, or from its request's first byte), else it is closed: uvicorn starts no timer
before a connection's first request, so connections that never send one were kept for
ever, and 20,000 of them (no API key needed: the key is read from the head) took every
file descriptor the server had. nginx's ``client_header_timeout`` is 60 s, cpp-httplib's
(llama-server's) read timeout 5 s."""


def error_body(message: str, code: str) -> bytes:
    """OpenAI's error JSON for a request the parser refused (status 400)."""
    body = {
        "error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    }
    return json.dumps(body, separators=(",", ":")).encode()


def _parser_message(error: BaseException | None) -> str:
    # httptools' errors read "Invalid method encountered", "Invalid character in chunk
    # size"...: llhttp's reason, which says what was wrong; keep it
    reason = str(error or "").strip()
    return f"invalid HTTP request: {reason}" if reason else "invalid HTTP request"


def protocol(
    max_head_bytes: int = DEFAULT_MAX_HEAD_BYTES, head_timeout_s: float = DEFAULT_HEAD_TIMEOUT_S
) -> type[Any]:
    """uvicorn's HTTP protocol class (pass it as ``uvicorn.Config(http=...)``) that
    answers a request the parser refuses, or one whose head is over `max_head_bytes`,
    with a 400 and OpenAI's error JSON, and closes a connection whose request head has
    not come whole within `head_timeout_s` (`DEFAULT_HEAD_TIMEOUT_S`).

    Returns:
        a subclass of uvicorn's ``HttpToolsProtocol`` when httptools imports (uvicorn's
        own choice), else of its ``H11Protocol``.
    """
    try:
        import httptools
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return _h11_protocol()

    class Protocol(HttpToolsProtocol):
        _head = 0
        _refusal: tuple[str, str] | None = None
        _head_timer: Any = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._time_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._untime_head()
            super().connection_lost(exc)

        def _time_head(self) -> None:
            self._untime_head()
            self._head_timer = self.loop.call_later(head_timeout_s, self._head_timed_out)

        def _untime_head(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing():
                self.transport.close()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head = 0
            self._time_head()  # a keep-alive connection's next request: its own time

        def on_headers_complete(self) -> None:
            self._untime_head()
            super().on_headers_complete()

        def _count(self, n: int) -> None:
            self._head += n
            if self._head > max_head_bytes:
                self._refusal = (
                    f"the request line and headers are over the limit of {max_head_bytes} bytes",
                    "request_header_too_large",
                )
                raise ValueError(self._refusal[0])  # stops the parser: answered below

        def on_url(self, url: bytes) -> None:
            super().on_url(url)
            self._count(len(url))

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value) + 4)
            super().on_header(name, value)

        _discarding = False

        def data_received(self, data: bytes) -> None:
            if self._discarding:
                return
            self._unset_keepalive_if_required()
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade:  # as uvicorn's own
                if self._should_upgrade():
                    self.handle_websocket_upgrade()
                else:
                    self._unsupported_upgrade_warning()
            except httptools.HttpParserError as e:
                message, code = self._refusal or (_parser_message(e), "invalid_http_request")
                self.logger.warning(message)
                self.send_400_response(message, code)

        def send_400_response(self, msg: str, code: str = "invalid_http_request") -> None:
            body = error_body(msg, code)
            head = [b"HTTP/1.1 400 Bad Request\r\n"]
            for name, value in self.server_state.default_headers:
                head.extend([name, b": ", value, b"\r\n"])
            head.append(b"content-type: application/json\r\n")
            head.append(b"content-length: %d\r\n" % len(body))
            head.append(b"connection: close\r\n\r\n")
            self.transport.write(b"".join(head) + body)
            # a lingering close, as nginx's: closing with the rest of the request unread
            # would send a reset that can destroy the answer before the client reads it;
            # so end our side, drop what still comes, and close when the client has
            # closed or after LINGER_S
            self._discarding = True
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)

    return Protocol


def _h11_protocol() -> type[Any]:
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Protocol(H11Protocol):
        # h11 bounds a request's head by its receive buffer (h11_max_incomplete_event_size)
        def send_400_response(self, msg: str) -> None:
            body = error_body(
                "invalid HTTP request, or its head is over the limit", "invalid_http_request"
            )
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ]
            self.transport.write(self.conn.send(h11.Response(status_code=400, headers=headers)))
            self.transport.write(self.conn.send(h11.Data(data=body)))
            self.transport.write(self.conn.send(h11.EndOfMessage()))
            self.transport.close()

    return Protocol


def uvicorn_options(
    max_head_bytes: int = DEFAULT_MAX_HEAD_BYTES, head_timeout_s: float = DEFAULT_HEAD_TIMEOUT_S
) -> dict[str, Any]:
    """The keyword arguments of ``uvicorn.Config`` for the parser: `protocol` and h11's
    head limit (used when httptools is missing)."""
    return {
        "http": protocol(max_head_bytes, head_timeout_s),
        "h11_max_incomplete_event_size": max_head_bytes,
    }
