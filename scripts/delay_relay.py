#!/usr/bin/env python3
"""A loopback TCP relay that delays every message by a fixed time in each direction.

A test tool for the RPC measurements (README: Beyond one machine): put it between specgen
and a local ggml-rpc-server to simulate a network with a given one-way delay on one
machine.

    python scripts/delay_relay.py --to 127.0.0.1:50052 --listen 127.0.0.1:50053 --delay-ms 5

Each chunk read from one side is written to the other side `--delay-ms` after it was read,
in order; chunks do not wait for each other (a pipe with latency, not a bandwidth limit).
A request and its answer therefore pay twice the delay, as over a real link. When one side
closes, the other is closed after the same delay, so a server that dies is seen by the
client as a lost connection. Prints ``listening on HOST:PORT`` on stdout once ready.
It listens on loopback addresses only: it has no authentication, like the RPC server.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import socket
import sys
import time

CHUNK = 1 << 20


def _endpoint(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host, int(port)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def read() -> None:
        try:
            while data := await reader.read(CHUNK):
                queue.put_nowait((time.monotonic() + delay_s, data))
        except (ConnectionError, OSError):
            pass
        queue.put_nowait((time.monotonic() + delay_s, b""))  # end of stream

    async def write() -> None:
        try:
            while True:
                due, data = await queue.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    break
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    await asyncio.gather(read(), write())


def _nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def _serve(listen: tuple[str, int], to: tuple[str, int], delay_s: float) -> None:
    async def handle(c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        try:
            s_reader, s_writer = await asyncio.open_connection(*to)
        except OSError:
            c_writer.close()  # the client sees a refused/closed connection, as without us
            return
        _nodelay(c_writer)
        _nodelay(s_writer)
        await asyncio.gather(_pipe(c_reader, s_writer, delay_s), _pipe(s_reader, c_writer, delay_s))

    server = await asyncio.start_server(handle, *listen)
    host, port = server.sockets[0].getsockname()[:2]
    print(f"listening on {host}:{port}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--to", type=_endpoint, required=True, help="HOST:PORT to forward to")
    ap.add_argument(
        "--listen", type=_endpoint, default=("127.0.0.1", 0), help="default 127.0.0.1:0 (free)"
    )
    ap.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay per message")
    args = ap.parse_args(argv)
    host = args.listen[0]
    try:
        loopback = ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        loopback = False
    if not loopback:
        print(f"delay_relay: error: --listen {host} is not a loopback address", file=sys.stderr)
        return 2
    if args.delay_ms < 0:
        print("delay_relay: error: --delay-ms must be >= 0", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve(args.listen, args.to, args.delay_ms / 1000))
    except KeyboardInterrupt:
        pass
    except OSError as e:
        print(f"delay_relay: error: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
