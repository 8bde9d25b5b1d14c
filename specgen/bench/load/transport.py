"""The connection pool of `specgen bench --url`: httpcore (the HTTP/1.1 core of httpx, h11
underneath) over asyncio's own streams, through httpcore's `network_backend` extension point.

Why not httpx's default stack: at 8 streams of ~300 chunks/s its per-chunk cost (the anyio
stream and cancel scope around every socket read, then httpx's decoders) took 7-10% of a
core on the 2-vCPU VM, more than the load client may take from the server it measures;
reading the same stream through httpcore on asyncio streams costs about half
(scripts/load_overhead.py measures it). HTTP itself (framing, chunked bodies, keep-alive,
the pool) stays the library's. https goes through httpcore's default backend (TLS is
rare on the loopback this is for, and asyncio's TLS upgrade needs Python 3.11).

Keep-alive, and the one retry it needs: servers close idle kept-alive connections
(llama-server's cpp-httplib and uvicorn after 5 s), and a request sent into one as the server
closed it fails without a byte of response. `Attempt` tells such a request apart, so that
the client can resend it once on a fresh connection (`retryable`, `fresh_connection`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from contextvars import ContextVar
from typing import Any

import httpcore

#: (level, option, value) as httpcore passes socket options
SocketOption = Any


class Attempt:
    """What one try of a request saw of its connection: `connected` (httpcore connected for
    it; else the pool reused a kept-alive connection) and `received` (response bytes read).

    `trace` is httpcore's `trace` request extension (called at each phase's start and end:
    `connection.connect_tcp.started`, `http11.receive_response_headers.complete`, ...; the
    body is one phase, not one call per chunk). Bytes are counted by `_Stream.read` for the
    attempt in `current` (set in the request's task); httpcore's own streams (https) count
    none, so there a complete response head stands for the first byte."""

    __slots__ = ("connected", "received")

    def __init__(self) -> None:
        self.connected = False
        self.received = 0

    async def trace(self, event: str, info: dict[str, Any]) -> None:
        if event.startswith("connection.connect_"):  # connect_tcp, connect_unix_socket
            self.connected = True
        elif event == "http11.receive_response_headers.complete":
            self.received = max(self.received, 1)


#: the attempt whose response `_Stream.read` is reading (None outside a request)
current: ContextVar[Attempt | None] = ContextVar("specgen_load_attempt", default=None)


def retryable(attempt: Attempt, exc: BaseException) -> bool:
    """Whether a request that raised `exc` may be resent: it went on a reused connection
    and failed before any byte of a response (the server had closed the connection:
    httpcore's "Server disconnected without sending a response", or a reset). A fresh
    connection's failure, a timeout, or a failure after any response byte is the server's
    and is never retried: resending would hide it, or count its load twice."""
    return (
        not attempt.connected
        and attempt.received == 0
        and isinstance(exc, httpcore.ReadError | httpcore.WriteError | httpcore.RemoteProtocolError)
    )


class _Stream(httpcore.AsyncNetworkStream):
    """One TCP connection as asyncio's reader and writer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._held: list[bytes] = []

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if self._held:  # a request whose end did not come as b"" (see `write`)
            await self.send(b"".join(self._held), timeout)
            self._held.clear()
        try:
            if timeout is None:  # the load client bounds each whole request instead
                data = await self._reader.read(max_bytes)
            else:
                data = await asyncio.wait_for(self._reader.read(max_bytes), timeout)
        except asyncio.TimeoutError:
            raise httpcore.ReadTimeout("read timed out") from None
        except OSError as e:
            raise httpcore.ReadError(str(e)) from e
        if data and (attempt := current.get()) is not None:
            attempt.received += len(data)
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        # httpcore writes a request's head, then its body, then its end (b"" for a body of
        # known length): they go as one send, since each loopback send costs ~0.1 ms of
        # kernel time on the 2-vCPU VM; `read` sends anything still held
        if buffer:
            self._held.append(buffer)
        elif self._held:
            await self.send(b"".join(self._held), timeout)
            self._held.clear()

    async def send(self, buffer: bytes, timeout: float | None = None) -> None:
        """`buffer` onto the socket now."""
        try:
            self._writer.write(buffer)
            await asyncio.wait_for(self._writer.drain(), timeout)
        except asyncio.TimeoutError:
            raise httpcore.WriteTimeout("write timed out") from None
        except OSError as e:
            raise httpcore.WriteError(str(e)) from e

    async def aclose(self) -> None:
        self._writer.close()

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            # httpcore asks before reusing an idle keep-alive connection: one the server
            # closed meanwhile (llama-server's idle timeout) is readable at EOF and must be
            # dropped, not sent a request that then fails as a disconnect
            return self._reader.at_eof() or self._writer.is_closing()
        if info == "socket":
            return self._writer.get_extra_info("socket")
        if info in ("client_addr", "server_addr"):
            return self._writer.get_extra_info("sockname" if info == "client_addr" else "peername")
        return None


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    """Plain TCP on asyncio's streams (asyncio sets TCP_NODELAY on them)."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[SocketOption] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        local = None if local_address is None else (local_address, 0)
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, local_addr=local), timeout
            )
        except asyncio.TimeoutError:
            raise httpcore.ConnectTimeout(f"connecting to {host}:{port} timed out") from None
        except OSError as e:
            raise httpcore.ConnectError(str(e)) from e
        sock = writer.get_extra_info("socket")
        for option in socket_options or ():
            sock.setsockopt(*option)
        return _Stream(reader, writer)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def _backend(url: str) -> httpcore.AsyncNetworkBackend | None:
    return AsyncioBackend() if url.startswith("http://") else None


#: below the 5 s after which cpp-httplib (llama-server) and uvicorn close an idle connection,
#: so that the pool mostly drops one before the server does, rather than race it
KEEPALIVE_EXPIRY_S = 4.0


def connection_pool(url: str, connections: int) -> httpcore.AsyncConnectionPool:
    """A keep-alive pool of up to `connections` HTTP/1.1 connections for the server at `url`
    (asyncio streams for http://, httpcore's default backend for https://), keeping as many
    idle: a new loopback connection per request cost the client ~3 ms of sending time
    (scripts/load_overhead.py). An idle connection is dropped after `KEEPALIVE_EXPIRY_S`, or
    when the server has closed it (EOF seen: `_Stream.get_extra_info("is_readable")`); one
    the server closes as a request goes out is what `retryable` lets the client resend."""
    return httpcore.AsyncConnectionPool(
        max_connections=connections,
        max_keepalive_connections=connections,
        keepalive_expiry=KEEPALIVE_EXPIRY_S,
        http1=True,
        http2=False,
        network_backend=_backend(url),
    )


def fresh_connection(url: str) -> httpcore.AsyncHTTPConnection:
    """One new connection to the server of `url` (any path), outside the pool: the retry's,
    so that it cannot be handed another kept-alive connection the server has closed. Use as
    `async with`; it is closed after its one response."""
    return httpcore.AsyncHTTPConnection(httpcore.URL(url).origin, network_backend=_backend(url))
