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
from support.greedy import assert_same_or_near_tie
from support.net import free_port

from specgen import llamacpp
from specgen.errors import ConfigError, RpcError

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


REBUILD = (
    'CMAKE_ARGS="-DGGML_RPC=on" .venv/bin/pip install --force-reinstall --no-cache-dir'
    " llama-cpp-python==0.3.36"
)


def specgen(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specgen", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def assert_one_error_line(r: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specgen: error: "), r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.skipif(llamacpp.rpc_supported(), reason="this build has RPC")
def test_rpc_without_rpc_support_gives_the_rebuild_command(tiny_target):
    r = specgen("run", "--rpc", "127.0.0.1:50052", "-ngl", "99", "-m", str(tiny_target),
                "-md", "none", "-n", "4", "the cat")  # fmt: skip
    assert_one_error_line(r, REBUILD)
    assert r.stdout == ""


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
# again: a no-op, not a probe (the server is busy with this process's connection)
assert [d.name for d in llamacpp.add_rpc_servers([endpoint])] == ["CPU", "RPC0"]
print(json.dumps({"local": local, "remote": greedy(remote), "draft": greedy(draft),
                  "target_devices": remote.devices, "draft_devices": draft.devices}))
"""


@pytest.mark.rpc
def test_target_on_the_rpc_device_decodes_like_local(rpc_server, tiny_target):
    endpoint = rpc_server.endpoint
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


# --- the commands with --rpc (make test-rpc) ---------------------------------------------------

GREEDY = ["-n", "40", "--temp", "0", "--ignore-eos", "-c", "256", "-t", "1"]
PROMPT = "the cat on"


def run_json(*args: str) -> tuple[dict, str]:
    r = specgen("run", "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), r.stderr


@pytest.mark.rpc
@pytest.mark.parametrize("draft", ["none", "draft"])
def test_greedy_output_with_the_target_remote_equals_local(
    rpc_server, tiny_target, tiny_draft, draft
):
    md = str(tiny_draft) if draft == "draft" else "none"
    local, _ = run_json("-m", str(tiny_target), "-md", "none", *GREEDY, PROMPT)
    remote, log = run_json(
        "--rpc", rpc_server.endpoint, "-ngl", "99", "-ngld", "99", "--verbose",
        "-m", str(tiny_target), "-md", md, "--draft-max", "4", *GREEDY, PROMPT,
    )  # fmt: skip
    # llama.cpp's own placement log, one section per model load: every target layer on the
    # RPC device; the draft's, although -ngld 99 offloads them all, on this machine
    loads = log.split("llama_model_loader: loaded meta data")[1:]
    assert len(loads) == (2 if draft == "draft" else 1)
    assert "layer   0 assigned to device RPC0" in loads[0]
    assert "layer   1 assigned to device RPC0" in loads[0]
    if draft == "draft":
        assert "layer   0 assigned to device CPU" in loads[1]
        assert "assigned to device RPC0" not in loads[1]
        assert remote["stats"]["n_drafted"] > 0
    target = llamacpp.LlamaEngine(tiny_target, llamacpp.EngineConfig(n_ctx=256, n_threads=1))
    try:
        ids = target.tokenize(PROMPT.encode())
        assert_same_or_near_tie(target, ids, local["tokens"], remote["tokens"])
    finally:
        target.close()


@pytest.mark.rpc
def test_verify_passes_with_the_target_remote_and_the_draft_local(
    rpc_server, tiny_target, tiny_draft
):
    r = specgen("verify", "--rpc", rpc_server.endpoint, "-ngl", "99", "-m", str(tiny_target),
                "-md", str(tiny_draft), "-t", "1", "--samples", "300", "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr + r.stdout
    d = json.loads(r.stdout)
    assert d["passed"] and d["sampling"]["samples"] == 300 and d["greedy"]


@pytest.mark.rpc
def test_bench_records_the_endpoints_and_each_models_devices(
    rpc_server, tiny_target, tiny_draft, tmp_path
):
    prompts = tmp_path / "p.txt"
    prompts.write_text("the cat on\n", encoding="utf-8")
    out = tmp_path / "bench.json"
    r = specgen("bench", "--rpc", rpc_server.endpoint, "-ngl", "99", "-m", str(tiny_target),
                "-md", str(tiny_draft), "-t", "1", "-c", "256", "--prompts", str(prompts),
                "--draft-max", "4", "--runs", "1", "-n", "8", "--json", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr
    record = json.loads(out.read_text(encoding="utf-8"))["record"]
    assert record["rpc"] == [rpc_server.endpoint]
    assert record["target"]["devices"] == ["RPC0", "CPU"]
    assert record["draft"]["devices"] == ["CPU"]


@pytest.mark.rpc
def test_an_unreachable_server_is_one_line_naming_it(tiny_target):
    endpoint = f"127.0.0.1:{free_port()}"
    r = specgen("run", "--rpc", endpoint, "-ngl", "99", "-m", str(tiny_target), "-md", "none",
                "-n", "4", PROMPT)  # fmt: skip
    assert_one_error_line(r, f"cannot reach RPC server {endpoint}", "refused")
    assert r.stdout == ""


@pytest.mark.rpc
def test_a_server_killed_mid_generation_is_one_line_and_no_complete_output(rpc_server, tiny_target):
    # 5 ms each way through the relay: every target pass takes >= 10 ms, so the 200-token
    # generation is still running when the server is killed after its first output
    relay = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "delay_relay.py"), "--to", rpc_server.endpoint,
         "--delay-ms", "5"],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        endpoint = relay.stdout.readline().split()[-1]
        run = subprocess.Popen(
            [sys.executable, "-m", "specgen", "run", "--no-live", "--rpc", endpoint, "-ngl",
             "99", "-m", str(tiny_target), "-md", "none", "-n", "200", "--temp", "0",
             "--ignore-eos", "-c", "256", "-t", "1", PROMPT],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        first = run.stdout.read(1)  # generation has started
        rpc_server.proc.kill()
        rest, err = run.communicate(timeout=60)
    finally:
        relay.kill()
        relay.wait()
    assert first, err
    r = subprocess.CompletedProcess(run.args, run.returncode, first + rest, err.decode())
    assert_one_error_line(r, f"lost the connection to RPC server {endpoint}", "incomplete")
