"""The server's app on a loopback port in this process, over a fake backend
(`fake_server`) unless a test passes its own."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import fake_server as fake
import httpx
import openai
import uvicorn

from specgen.server import runner, wire
from specgen.server.app import Backend, Settings, State, create_app

USER = [{"role": "user", "content": "Hi there"}]


@dataclass
class Served:
    url: str
    state: State
    backend: Backend | None
    log: list[str] = field(default_factory=list)

    @property
    def sched(self) -> fake.FakeScheduler:
        assert self.backend is not None
        return self.backend.scheduler  # type: ignore[return-value]

    def client(self, key: str = "none") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0)

    def post(self, path: str, body: object = None, **kw) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=10, **kw)


@contextmanager
def serving(
    settings: Settings | None = None,
    backend: Backend | None = None,
    loaded: bool = True,
    http: dict | None = None,
) -> Iterator[Served]:
    """The app on a loopback port; `http`: uvicorn's parser options (`wire`'s by default)."""
    log: list[str] = []
    state = State(log=log.append)
    if loaded:
        state.backend = backend or fake.fake_backend()
    sock = runner.bind("127.0.0.1", 0)
    config = uvicorn.Config(
        create_app(state, settings or Settings()),
        log_config=None,
        access_log=False,
        lifespan="off",
        **(http or wire.uvicorn_options()),
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120  # generous: the wait ends when the server is up
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield Served(runner.url_of(sock), state, state.backend, log)
    finally:
        if state.backend is not None:
            state.backend.scheduler.shutdown()
        server.should_exit = True
        thread.join(10)
