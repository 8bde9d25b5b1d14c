"""Signals and loading through the real runner (`specgen.server.runner`) in a child process,
with the scripted scheduler of `fake_server` (no models): /health is 503 while loading,
SIGTERM or SIGINT ends the streams in flight with a final chunk and exits 0, a second
signal exits 130 at once. Every wait is for an observable state (a line, a chunk, a
status), never for time."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from specgen.errors import ConfigError
from specgen.server import runner

TESTS = Path(__file__).resolve().parent
SCRIPT = TESTS / "fake_server.py"


class Child:
    def __init__(self, *args: str) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)])}
        self.proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        self.url = self.expect("listening ")

    def expect(self, prefix: str) -> str:
        """The rest of the next stdout line, which must start with `prefix`."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith(prefix), (line, self.stderr())
        return line[len(prefix) :].strip()

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return ""
        assert self.proc.stderr is not None
        return self.proc.stderr.read()

    def wait(self) -> int:
        return self.proc.wait(timeout=30)


def test_the_bound_socket_already_accepts_connections() -> None:
    # the URL is printed before uvicorn starts: a client that connects at once must wait
    # in the backlog, not be refused (a /health right after the line was, once in CI)
    sock = runner.bind("127.0.0.1", 0)
    try:
        host, port = sock.getsockname()[:2]
        with socket.create_connection((host, port), timeout=5):
            pass
        with pytest.raises(ConfigError, match="cannot listen there"):
            runner.bind("127.0.0.1", port)
    finally:
        sock.close()


@pytest.fixture
def child() -> Iterator[Child]:
    c = Child()
    c.expect("ready ")
    yield c
    if c.proc.poll() is None:
        c.proc.kill()
        c.proc.wait()


def held_stream(url: str) -> tuple[httpx.Client, httpx.Response, Iterator[str]]:
    client = httpx.Client(timeout=30)
    body = {"messages": [{"role": "user", "content": "HOLD"}], "stream": True}
    r = client.send(
        client.build_request("POST", url + "/v1/chat/completions", json=body), stream=True
    )
    lines = (line for line in r.iter_lines() if line.startswith("data: "))
    next(lines)  # the role
    next(lines)  # its first round: the job is held in its slot now
    return client, r, lines


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_a_stream_ends_it_with_a_final_chunk_and_exits_0(child, sig) -> None:
    client, r, lines = held_stream(child.url)
    try:
        child.proc.send_signal(sig)
        rest = list(lines)
    finally:
        r.close()
        client.close()
    assert rest[-1] == "data: [DONE]"
    final = json.loads(rest[-2][6:])
    assert final["choices"][0]["finish_reason"] == "abort"
    assert final["error"]["code"] == "shutdown"
    assert final["speculative"]["finish"] == "interrupted"
    assert child.wait() == 0
    err = child.stderr()
    assert "stopping" in err and "Traceback" not in err
    assert child.expect("closed") == ""  # the models freed once the worker had stopped


def test_an_idle_server_exits_0_on_sigterm(child) -> None:
    assert httpx.get(child.url + "/health").status_code == 200
    child.proc.send_signal(signal.SIGTERM)
    assert child.wait() == 0


def test_a_second_signal_exits_130_at_once() -> None:
    c = Child()
    c.expect("ready ")
    client = httpx.Client(timeout=30)
    try:
        body = {"prompt": "STUCK", "stream": True}  # a job that shutdown cannot end
        r = client.send(
            client.build_request("POST", c.url + "/v1/completions", json=body), stream=True
        )
        lines = (line for line in r.iter_lines() if line.startswith("data: "))
        next(lines)
        c.proc.send_signal(signal.SIGTERM)
        assert "stopping" in c.proc.stderr.readline()  # type: ignore[union-attr]
        c.proc.send_signal(signal.SIGTERM)
        assert c.wait() == 130
        # the hung job's worker never stopped: its models are not freed under it
        err = c.stderr()
        assert "a decode is still under way" in err and "Traceback" not in err
        assert c.proc.stdout.read() == ""  # type: ignore[union-attr]
    finally:
        client.close()
        if c.proc.poll() is None:
            c.proc.kill()


def test_health_is_503_until_the_models_are_loaded(tmp_path: Path) -> None:
    gate = tmp_path / "loaded"
    c = Child("--load-gate", str(gate))
    try:
        r = httpx.get(c.url + "/health")
        assert r.status_code == 503 and r.json()["error"]["message"] == "Loading model"
        assert httpx.get(c.url + "/v1/models").status_code == 503
        gate.touch()
        c.expect("ready ")
        assert httpx.get(c.url + "/health").json() == {"status": "ok"}
        c.proc.send_signal(signal.SIGTERM)
        assert c.wait() == 0
    finally:
        if c.proc.poll() is None:
            c.proc.kill()


def test_sigterm_while_loading_waits_for_the_load_then_exits_0(tmp_path: Path) -> None:
    gate = tmp_path / "loaded"
    c = Child("--load-gate", str(gate))
    try:
        assert httpx.get(c.url + "/health").status_code == 503
        c.proc.send_signal(signal.SIGTERM)
        assert "stopping" in c.proc.stderr.readline()  # type: ignore[union-attr]
        gate.touch()  # it stopped listening at once; the load is waited for, then freed
        assert c.wait() == 0
    finally:
        if c.proc.poll() is None:
            c.proc.kill()
