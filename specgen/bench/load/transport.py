"""The connection pool of `specgen bench --url`: httpcore (the HTTP/1.1 core of httpx, h11
underneath) over asyncio's own streams, through httpcore's `network_backend` extension point.

Why not httpx's default stack: at 8 streams of ~300 chunks/s its per-chunk cost (the anyio
stream and cancel scope around every socket read, then httpx's decoders) took 7-10% of a
core on the 2-vCPU VM, more than the load client may take from the server it measures;
reading the same stream through httpcore on asyncio streams costs about half
(scripts/load_overhead.py measures it). HTTP itself (framing, chunked bodies, keep-alive,
the pool) stays the library's. https goes through httpcore's default backend (TLS is
rare on the loopback this is for, and asyncio's TLS upgrade needs Python 3.11).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import httpcore

#: (level, option, value) as httpcore passes socket options
SocketOption = Any


class _Stream(httpcore.AsyncNetworkStream):
    """One TCP connection as asyncio's reader and writer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            if timeout is None:  # the load client bounds each whole request instead
                return await self._reader.read(max_bytes)
            return await asyncio.wait_for(self._reader.read(max_bytes), timeout)
        except asyncio.TimeoutError:
            raise httpcore.ReadTimeout("read timed out") from None
        except OSError as e:
            raise httpcore.ReadError(str(e)) from e

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
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


def connection_pool(url: str, connections: int) -> httpcore.AsyncConnectionPool:
    """A pool of up to `connections` HTTP/1.1 connections for the server at `url` (asyncio
    streams for http://, httpcore's default backend for https://), one new connection per
    request, as vLLM's benchmark client opens one: llama-server closes idle keep-alive
    connections (cpp-httplib's 5 s timeout) and a request sent on one just closed failed
    as a disconnect (4 of 8 requests per level in a sweep), which would count against the
    server a fault of the client's reuse. A loopback connect costs well under 1 ms."""
    backend = AsyncioBackend() if url.startswith("http://") else None
    return httpcore.AsyncConnectionPool(
        max_connections=connections,
        max_keepalive_connections=0,
        http1=True,
        http2=False,
        network_backend=backend,
    )
