"""Run the server: bind, answer /health with 503 while the models load (in a thread),
serve, and shut down cleanly on SIGINT/SIGTERM.

uvicorn runs programmatically with its own signal handling turned off: the first SIGINT or
SIGTERM stops new requests (503), lets the scheduler end every in-flight request with a
final chunk (finish_reason "abort"), waits for those responses to be written, then stops
uvicorn; the exit code is 0. A second SIGINT/SIGTERM stops at once with 130.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Callable, Iterator

import uvicorn
from sse_starlette.sse import AppStatus

from specgen import ConfigError, eventloop
from specgen.server import wire
from specgen.server.app import Backend, Settings, State, create_app
from specgen.server.guard import is_loopback
from specgen.server.responses import ClientStalled

EXIT_INTERRUPTED = 130
GRACEFUL_S = 10  # uvicorn's wait for open responses after the streams have ended
_BACKLOG = 2048  # uvicorn's default (`uvicorn.Config.backlog`)


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers (it would re-raise the signal at exit)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def install_signal_handlers(self) -> None:  # uvicorn before 0.29
        pass


def open_warning(host: str, api_key: str | None) -> str | None:
    """The warning for a server anyone on the network can use, else None."""
    if api_key or is_loopback(host):
        return None
    return (
        f"--host {host} without --api-key: anyone who can reach this machine can use the"
        " models; set --api-key (or SPECGEN_API_KEY), or bind 127.0.0.1"
    )


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (port 0: any free port) and listening, before anything
    loads: a client that connects as soon as the URL is printed waits in the backlog until
    uvicorn accepts, where a socket only bound refused it (a test's /health right after
    the line failed that way once in a full run).

    Raises:
        ConfigError: the host does not resolve, or the address cannot be bound (in use,
            or a privileged port).
    """
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (socket.gaierror, OverflowError) as e:
        raise ConfigError(f"--host {host} --port {port}: {e}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(_BACKLOG)  # uvicorn's own listen on it later sets the same backlog
    except OSError as e:
        sock.close()
        raise ConfigError(
            f"--host {host} --port {port}: cannot listen there: {e.strerror or e}"
        ) from None
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _not_cancelled(record: logging.LogRecord) -> bool:
    return not (record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError))


def _not_stalled(record: logging.LogRecord) -> bool:
    """uvicorn logs the exception that ends a stalled stream (`Streamed`) as a traceback;
    the request's own log line already says it."""
    return not (record.exc_info and isinstance(record.exc_info[1], ClientStalled))


class _Stopper:
    """The signal handlers: drain on the first signal, stop at once on the second."""

    def __init__(self, state: State, server: _Server, say: Callable[[str], None]) -> None:
        self.state, self.server, self.say = state, server, say
        self.code = 0
        self.signals = 0
        self.task: asyncio.Task[None] | None = None

    def __call__(self, name: str) -> None:
        self.signals += 1
        if self.signals > 1:
            self.code = EXIT_INTERRUPTED
            # uvicorn cancels the responses under way: its log of each cancellation is a
            # traceback, where the user asked to stop
            logging.getLogger("uvicorn.error").addFilter(_not_cancelled)
            self.server.force_exit = True
            self.server.should_exit = True
            return
        self.state.draining = True
        self.say(f"{name}: stopping: ending {self.state.in_flight} request(s) in flight")
        self.task = asyncio.get_running_loop().create_task(self.drain())

    async def drain(self) -> None:
        b = self.state.backend
        if b is not None:
            # the scheduler ends every job (Done "interrupted" or Failed "shutdown"); the
            # responses then write their final chunk
            await asyncio.to_thread(b.scheduler.shutdown)
            while self.state.in_flight and not self.server.force_exit:
                await asyncio.sleep(0.02)
        self.server.should_exit = True


@eventloop.blocking
async def serve(
    sock: socket.socket,
    settings: Settings,
    open_backend: Callable[[State], Backend],
    ready: Callable[[str, Backend], None],
    say: Callable[[str], None],
) -> int:
    """Serve on the bound `sock` until a signal; returns the exit code (0, or 130 after a
    second SIGINT/SIGTERM).

    Args:
        sock: from `bind`.
        settings: the server's fixed settings.
        open_backend: loads the models and starts the scheduler (run in a thread while
            /health answers 503); its exceptions end the server and are raised here.
        ready: called once the backend serves, with the base URL (the ready line).
        say: one line to stderr (per-request log, shutdown notes).
    """
    state = State(log=say)
    config = uvicorn.Config(
        create_app(state, settings),
        log_config=None,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=GRACEFUL_S,
        **wire.uvicorn_options(),
    )
    logging.getLogger("uvicorn.error").addFilter(_not_stalled)
    server = _Server(config)
    stopper = _Stopper(state, server, say)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopper, sig.name)
    # streams end through the scheduler's final events, never cut by sse-starlette
    AppStatus.disable_automatic_graceful_drain()
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    loading = asyncio.create_task(asyncio.to_thread(open_backend, state))
    backend: Backend | None = None
    try:
        await asyncio.wait({serving, loading}, return_when=asyncio.FIRST_COMPLETED)
        if not loading.done():  # uvicorn stopped first (a second signal): wait for the load
            await asyncio.wait({loading})
        if loading.exception() is not None:
            server.should_exit = True
            await serving
            raise loading.exception()  # type: ignore[misc]
        backend = loading.result()
        if state.draining:  # a signal came while loading: nothing to serve
            server.should_exit = True
        else:
            state.backend = backend
            state.metrics.watch(
                lambda: backend.scheduler.queue_depth,
                lambda: backend.scheduler.slots_busy,
                backend.scheduler.n_parallel,
            )
            ready(url_of(sock), backend)
        await serving
        if stopper.task is not None and not stopper.task.done():
            stopper.task.cancel()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        # the models are freed only once the worker has stopped (a model freed while a
        # decode runs on it was a segfault at exit); after a second signal no wait
        if backend is not None:
            if backend.scheduler.shutdown(0.0 if stopper.signals > 1 else None):
                backend.close()
            else:
                say("a decode is still under way: its models are freed by the process's exit")
        sock.close()
    return stopper.code
