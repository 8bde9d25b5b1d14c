"""The target on llama.cpp's RPC backend (`--rpc`).

Tests marked ``rpc`` need llama-cpp-python built with RPC and ``ggml-rpc-server`` from the
same llama.cpp (``make test-rpc`` builds both into ``.venv-rpc``); they are skipped
otherwise. The others run on the default wheel: endpoint parsing, the connection probe
against fake servers, the refusal without RPC support, and the delay relay.

Every RPC test talks to the server from a child process: ggml registers a server for the
life of a process and ends the process when its connection is lost.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from specgen import llamacpp
from specgen.errors import ConfigError, RpcError
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parent.parent


# --- endpoints and the probe (default wheel) ---------------------------------------------------


def test_endpoints_are_split_and_checked():
    assert llamacpp.parse_rpc_endpoints("10.0.0.2:50052, host-b:7000") == (
        "10.0.0.2:50052",
        "host-b:7000",
    )
    for bad in ("", " , ", "host", "host:", ":50052", "host:port", "host:70000", "::1:50052"):
        with pytest.raises(ConfigError, match="--rpc"):
            llamacpp.parse_rpc_endpoints(bad)


def test_a_refused_connection_names_the_endpoint():
    endpoint = f"127.0.0.1:{free_port()}"
    with pytest.raises(RpcError, match=f"cannot reach RPC server {endpoint}: .*refused"):
        llamacpp.probe_rpc_server(endpoint)


def fake_server(answer: bytes | None) -> Iterator[str]:
    """A listener that reads one HELLO and sends `answer` (None: never answers)."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(64)
            if answer is not None:
                conn.sendall(answer)
            stop.wait(5)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()


@pytest.fixture
def silent_server() -> Iterator[str]:
    yield from fake_server(None)


@pytest.fixture
def old_server() -> Iterator[str]:
    # HELLO answer of protocol 6.1.0: size, major, minor, patch, padding, 24 caps bytes
    yield from fake_server(struct.pack("<Q", 28) + bytes([6, 1, 0, 0]) + bytes(24))


@pytest.fixture
def http_server() -> Iterator[str]:
    yield from fake_server(b"HTTP/1.1 400 Bad Request\r\n\r\n")


def test_a_server_that_never_answers_times_out(silent_server):
    with pytest.raises(RpcError, match=f"{silent_server} did not answer within 0.3 s"):
        llamacpp.probe_rpc_server(silent_server, timeout_s=0.3)


def test_an_incompatible_protocol_version_is_refused(old_server):
    with pytest.raises(RpcError, match=f"{old_server} speaks protocol 6.1.0.*needs 7.0.x"):
        llamacpp.probe_rpc_server(old_server)


def test_something_that_is_not_an_rpc_server_is_refused(http_server):
    with pytest.raises(RpcError, match=f"{http_server} answered with an unknown handshake"):
        llamacpp.probe_rpc_server(http_server)


@pytest.mark.skipif(llamacpp.rpc_supported(), reason="this build has RPC")
def test_without_rpc_support_the_refusal_gives_the_rebuild_command():
    with pytest.raises(RpcError) as e:
        llamacpp.add_rpc_servers(["127.0.0.1:50052"])
    assert 'CMAKE_ARGS="-DGGML_RPC=on" .venv/bin/pip install --force-reinstall' in str(e.value)
    assert "llama-cpp-python==0.3.36" in str(e.value)


# --- the delay relay ---------------------------------------------------------------------------


@pytest.fixture
def echo_then_close() -> Iterator[tuple[int, threading.Event]]:
    """A server that echoes one message, then closes when `close` is set."""
    listener = socket.create_server(("127.0.0.1", 0))
    close = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.sendall(conn.recv(1024))
            close.wait(10)

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1], close
    close.set()
    listener.close()


def test_the_relay_forwards_both_ways_and_passes_on_a_close(echo_then_close):
    port, close = echo_then_close
    relay = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "delay_relay.py"), "--to", f"127.0.0.1:{port}",
         "--delay-ms", "1"],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        listening = relay.stdout.readline().split()[-1]
        host, _, relay_port = listening.partition(":")
        with socket.create_connection((host, int(relay_port)), timeout=10) as c:
            c.sendall(b"hello rpc")
            assert c.recv(1024) == b"hello rpc"
            close.set()  # the server goes away: the client must see end of stream
            assert c.recv(1024) == b""
    finally:
        relay.kill()
        relay.wait()


def test_the_relay_refuses_a_non_loopback_address():
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "delay_relay.py"), "--to", "127.0.0.1:1",
         "--listen", "0.0.0.0:0"],
        capture_output=True,
        text=True,
        timeout=30,
    )  # fmt: skip
    assert r.returncode == 2 and "not a loopback address" in r.stderr


# --- the engine on a real ggml-rpc-server (make test-rpc) --------------------------------------

ENGINE_SCRIPT = """
import json, sys
import numpy as np
from specgen import llamacpp
from specgen.llamacpp import EngineConfig, LlamaEngine
path, endpoint, n = sys.argv[1], sys.argv[2], int(sys.argv[3])

def greedy(engine):
    logits = engine.decode(engine.tokenize(b"the cat on"))
    out = []
    for _ in range(n):
        out.append(int(np.argmax(logits[-1])))
        logits = engine.decode([out[-1]])
    return out

local = greedy(LlamaEngine(path, EngineConfig(n_ctx=256)))
llamacpp.add_rpc_servers([endpoint])
remote = LlamaEngine(path, EngineConfig(n_ctx=256, n_gpu_layers=-1))
draft = LlamaEngine(path, EngineConfig(n_ctx=256, n_gpu_layers=-1, local_only=True))
print(json.dumps({"local": local, "remote": greedy(remote), "draft": greedy(draft),
                  "target_devices": remote.devices, "draft_devices": draft.devices}))
"""


@pytest.mark.rpc
def test_target_on_the_rpc_device_decodes_like_local(rpc_server, tiny_target):
    endpoint, _ = rpc_server
    r = subprocess.run(
        [sys.executable, "-c", ENGINE_SCRIPT, str(tiny_target), endpoint, "24"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["target_devices"] == ["RPC0", "CPU"]
    assert out["draft_devices"] == ["CPU"]
    # same llama.cpp build, same CPU kernels on both sides: bit-identical greedy paths
    assert out["remote"] == out["local"] == out["draft"]
