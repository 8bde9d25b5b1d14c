"""RPC: registering ggml-rpc-server endpoints through ggml's backend registry, with a probe
that turns ggml's process aborts into errors first."""

from __future__ import annotations

import ctypes
import os
import socket
import struct

import llama_cpp

from specgen.errors import ConfigError, RpcError
from specgen.llamacpp.devices import Device, _ggml, list_devices

# The default wheel is built without the RPC backend (`llama_supports_rpc()` is false).
REBUILD_WITH_RPC = (
    'CMAKE_ARGS="-DGGML_RPC=on" .venv/bin/pip install --force-reinstall --no-cache-dir'
    f" llama-cpp-python=={llama_cpp.__version__}"
)
RPC_PROBE_TIMEOUT_S = 5.0
# ggml-rpc.cpp in llama-cpp-python 0.3.36's llama.cpp: RPC_CMD_HELLO is always 14; the
# request is the client's 24 transport-capability bytes (RPC_CONN_CAPS_SIZE; zeros = plain
# TCP), the answer is major, minor, patch, padding and the server's 24 capability bytes.
# A server is compatible when its major equals ours and its minor is not newer.
_RPC_CMD_HELLO = 14
_RPC_CONN_CAPS_SIZE = 24
_RPC_PROTO_MAJOR, _RPC_PROTO_MINOR = 7, 0

_rpc_endpoints: list[str] = []  # servers registered in this process, in order


def rpc_supported() -> bool:
    """True when this llama-cpp-python was built with llama.cpp's RPC backend."""
    return bool(llama_cpp.llama_supports_rpc())


def parse_rpc_endpoints(spec: str) -> tuple[str, ...]:
    """Split ``--rpc HOST:PORT[,HOST:PORT...]`` into endpoints (llama.cpp's syntax).

    Raises:
        ConfigError: an empty list, an entry without ``:PORT``, or a port outside 1-65535.
            IPv6 literals are refused: ggml splits an endpoint at its first colon.
    """
    endpoints = tuple(e.strip() for e in spec.split(",") if e.strip())
    if not endpoints:
        raise ConfigError("--rpc: give at least one HOST:PORT")
    for e in endpoints:
        host, sep, port = e.partition(":")
        if e.count(":") > 1:
            raise ConfigError(f"--rpc: {e!r}: IPv6 addresses are not supported by ggml's RPC")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"--rpc: {e!r} is not HOST:PORT (e.g. 192.168.1.10:50052)")
    return endpoints


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError("connection closed")
        data += chunk
    return data


def probe_rpc_server(endpoint: str, timeout_s: float = RPC_PROBE_TIMEOUT_S) -> str:
    """Connect to one ggml-rpc-server and exchange its HELLO, with a timeout.

    ggml's own client aborts the whole process when it cannot connect or the versions
    differ (ggml-rpc.cpp, `rpc_dispatcher::start`), and its connect has no timeout; this
    probe turns those cases into an exception first. The probe disconnects before ggml
    connects: the server serves one client at a time.

    Returns:
        The server's protocol version, ``"major.minor.patch"``.

    Raises:
        RpcError: refused, unreachable, no answer within `timeout_s`, not an RPC server,
            or an incompatible protocol version. The message names the endpoint.
    """
    host, _, port = endpoint.partition(":")
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout_s)
    except TimeoutError as e:
        raise RpcError(
            f"cannot reach RPC server {endpoint}: no answer within {timeout_s:g} s"
        ) from e
    except OSError as e:  # refused, no route, unknown host
        raise RpcError(f"cannot reach RPC server {endpoint}: {e.strerror or e}") from e
    try:
        with sock:
            sock.sendall(
                struct.pack("<BQ", _RPC_CMD_HELLO, _RPC_CONN_CAPS_SIZE) + bytes(_RPC_CONN_CAPS_SIZE)
            )
            (size,) = struct.unpack("<Q", _recv_exactly(sock, 8))
            answer = _recv_exactly(sock, size) if size == 4 + _RPC_CONN_CAPS_SIZE else b""
    except TimeoutError as e:
        raise RpcError(
            f"RPC server {endpoint} did not answer within {timeout_s:g} s (it serves one"
            " client at a time: is another process using it?)"
        ) from e
    except OSError as e:  # reset or closed mid-handshake
        raise RpcError(
            f"RPC server {endpoint} closed the connection during the handshake (not a"
            " ggml-rpc-server, or an incompatible version)"
        ) from e
    if not answer:
        raise RpcError(
            f"RPC server {endpoint} answered with an unknown handshake: build ggml-rpc-server"
            f" from the llama.cpp that llama-cpp-python {llama_cpp.__version__} bundles"
            " (README: Beyond one machine)"
        )
    major, minor, patch = answer[:3]
    if major != _RPC_PROTO_MAJOR or minor > _RPC_PROTO_MINOR:
        raise RpcError(
            f"RPC server {endpoint} speaks protocol {major}.{minor}.{patch}; llama-cpp-python"
            f" {llama_cpp.__version__} needs {_RPC_PROTO_MAJOR}.{_RPC_PROTO_MINOR}.x: build"
            " ggml-rpc-server from the same llama.cpp version (README: Beyond one machine)"
        )
    return f"{major}.{minor}.{patch}"


@ctypes.CFUNCTYPE(None, ctypes.c_char_p)
def _on_ggml_abort(message: bytes) -> None:
    # ggml calls abort() as soon as this returns, and its RPC client aborts on any lost
    # connection (ggml-rpc.cpp, RPC_STATUS_ASSERT, on its dispatcher thread): no exception
    # can unwind through llama_decode. So say what happened in one line and exit 1 here;
    # the output so far is flushed but declared incomplete, and no result is written.
    text = message.decode("utf-8", errors="replace").strip()
    where = ", ".join(_rpc_endpoints)
    if "RPC" in text or "connect" in text:
        detail = text.split(": ", 1)[-1]  # drop ggml's "file:line: " prefix
        line = (
            f"specgen: error: lost the connection to RPC server {where} ({detail});"
            " generation stopped, the output above is incomplete"
        )
    else:
        line = f"specgen: error: llama.cpp aborted: {text}"
    # the sink flushes generated text at every write, so only the cursor needs restoring
    try:
        if os.isatty(1):  # the live view hides the cursor: give it back
            os.write(1, b"\x1b[?25h\n")
    except OSError:  # exiting anyway
        pass
    os.write(2, (line + "\n").encode())
    os._exit(1)


# Referenced for the life of the process: ggml keeps the raw pointer.
_ABORT_CALLBACK_REF = _on_ggml_abort


def add_rpc_servers(endpoints: tuple[str, ...] | list[str]) -> tuple[Device, ...]:
    """Register RPC servers as ggml devices, before any model loads.

    As llama.cpp's `common/arg.cpp::add_rpc_devices`: `ggml_backend_reg_by_name("RPC")`,
    `ggml_backend_rpc_add_server` through `ggml_backend_reg_get_proc_address`, then
    `ggml_backend_register` for each server's registry. Every server is probed first
    (`probe_rpc_server`). Models loaded afterwards put their -ngl layers on the RPC devices
    first (llama.cpp's default device order), unless `EngineConfig.local_only`.

    From here on a lost connection ends the process with one line on stderr and exit code
    1 (`_on_ggml_abort`): ggml's RPC client cannot report it any other way.

    Returns:
        All devices now registered (local and remote).

    Raises:
        RpcError: no RPC support in this build (the message gives the rebuild command), or
            a server fails its probe or reports no devices.
    """
    if not rpc_supported():
        raise RpcError(
            "--rpc needs llama-cpp-python built with llama.cpp's RPC backend; rebuild it"
            f" with: {REBUILD_WITH_RPC}"
        )
    new = [e for e in endpoints if e not in _rpc_endpoints]
    for endpoint in new:  # not a registered one: ggml holds its only client connection
        probe_rpc_server(endpoint)
    g = _ggml()
    g.set_abort_callback(ctypes.cast(_ABORT_CALLBACK_REF, ctypes.c_void_p))
    rpc_reg = g.reg_by_name(b"RPC")
    address = g.reg_get_proc_address(rpc_reg, b"ggml_backend_rpc_add_server") if rpc_reg else None
    if not address:
        raise RpcError(f"this llama.cpp has no RPC registry; rebuild with: {REBUILD_WITH_RPC}")
    add_server = g.add_server_type(address)
    for endpoint in new:
        _rpc_endpoints.append(endpoint)  # before connecting: an abort names it
        reg = add_server(endpoint.encode())
        if not reg:
            raise RpcError(f"RPC server {endpoint} reports no devices")
        g.register(reg)
    return list_devices()
