"""A tiny OpenAI-protocol server for the load client's tests and scripts/load_overhead.py:
`POST /v1/chat/completions` and `/v1/completions` stream fixed chunks at fixed delays
(HTTP/1.1, chunked, keep-alive), with a usage chunk and optional speculative statistics.

A prompt (or last message) containing a marker misbehaves: `FAIL500` answers HTTP 500,
`DROP` closes the connection after the first chunk, `SILENT` closes it without answering,
`HALF` after half a status line,
`HANG` never answers (until `close`). `answers_per_connection=N` closes a kept-alive
connection, unanswered, when its (N+1)-th POST has been read (as a server closing an idle
connection just as a request comes); `peers` lists each POST's client address, so a test
can tell which went on one connection.
`hold_after=N` makes every request after the N-th wait until `release()`: a test can then
act while the client is provably in the middle of a level. `served` counts requests begun;
`times_s` holds, per completed stream (by its seed), the server's `time.perf_counter()` when
it began reading the request and when it wrote `data: [DONE]` (on Linux a system-wide
monotonic clock, so a client in another process can compare its own stamps). Run as a script it serves until killed and prints its port.
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class StubConfig:
    n_chunks: int = 4
    tokens_per_chunk: int = 2
    first_delay_s: float = 0.0
    delay_s: float = 0.0
    usage: bool = True
    spec: str | None = None  # "speculative" (specgen), "timings" (llama-server), None
    hold_after: int | None = None
    close_idle_s: float | None = None  # close a keep-alive connection idle this long
    answers_per_connection: int | None = None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.posts = 0  # on this connection
        # small writes of a stream: without this, Nagle's algorithm holds each one until the
        # client's delayed ACK (40 ms), and the stub measures TCP, not the client
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # as cpp-httplib's keep-alive timeout (llama-server): an idle connection is closed
        # without a word, and a client reusing it finds it gone
        self.connection.settimeout(self.server.config.close_idle_s)

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _send_json(self, code: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._send_json(
                200, {"object": "list", "data": [{"id": "stub-model", "sha256": "00" * 32}]}
            )
        else:
            self._send_json(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        t0 = time.perf_counter()
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        srv = self.server
        with srv.lock:
            srv.served += 1
            n = srv.served
            srv.bodies.append(body)
            srv.peers.append(self.client_address)
            srv.changed.notify_all()
        cfg = srv.config
        self.posts += 1
        text = body.get("prompt") or (body.get("messages") or [{}])[-1].get("content", "")
        limit = cfg.answers_per_connection
        if "SILENT" in text or (limit is not None and self.posts > limit):
            self.close_connection = True  # the request was read whole: a FIN, not a reset
            return
        if "HALF" in text:
            self.wfile.write(b"HTTP/1.1 2")
            self.wfile.flush()
            self.close_connection = True
            return
        if cfg.hold_after is not None and n > cfg.hold_after:
            srv.release_event.wait()
        if "FAIL500" in text:
            self._send_json(500, {"error": {"message": "planted failure", "type": "server_error"}})
            return
        if "HANG" in text:
            srv.release_event.wait()
            return
        chat = "messages" in body
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(cfg.n_chunks):
            time.sleep(cfg.first_delay_s if i == 0 else cfg.delay_s)
            piece = "ab" * cfg.tokens_per_chunk
            choice = {"index": 0, "finish_reason": "length" if i == cfg.n_chunks - 1 else None}
            choice |= {"delta": {"content": piece}} if chat else {"text": piece}
            self._event({"id": "x", "object": "chunk", "choices": [choice]})
            if "DROP" in text:
                self.wfile.flush()
                self.connection.shutdown(2)  # mid-stream: no terminating chunk
                self.close_connection = True
                return
        final: dict[str, Any] = {"id": "x", "object": "chunk", "choices": []}
        tokens = cfg.n_chunks * cfg.tokens_per_chunk
        if cfg.usage:
            final["usage"] = {
                "prompt_tokens": 5,
                "completion_tokens": tokens,
                "total_tokens": tokens + 5,
            }
        if cfg.spec == "speculative":
            final["speculative"] = {
                "num_draft_tokens": 3 * cfg.n_chunks,
                "num_accepted_draft_tokens": 2 * cfg.n_chunks,
            }
        elif cfg.spec == "timings":
            final["timings"] = {"draft_n": 4 * cfg.n_chunks, "draft_n_accepted": cfg.n_chunks}
        self._event(final)
        t_done = time.perf_counter()
        self._write(b"data: [DONE]\n\n")
        self._write(b"")  # the last chunk of the chunked body
        with srv.lock:
            srv.times_s[body.get("seed")] = (t0, t_done)

    def _event(self, obj: Any) -> None:
        self._write(f"data: {json.dumps(obj)}\n\n".encode())

    def _write(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the default backlog (5) drops connects of 8 streams at once

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that closes its kept-alive connection is not news

    def __init__(self, config: StubConfig) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.config = config
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.release_event = threading.Event()
        self.served = 0
        self.bodies: list[Any] = []
        self.peers: list[Any] = []  # (host, port) of each POST's connection
        self.times_s: dict[Any, tuple[float, float]] = {}  # by seed (the last one wins)


class Stub:
    """The stub server on a free loopback port, serving in a thread while open."""

    def __init__(self, config: StubConfig | None = None) -> None:
        self.server = _Server(config or StubConfig())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def served(self) -> int:
        return self.server.served

    @property
    def bodies(self) -> list[Any]:
        return self.server.bodies

    def wait_served(self, n: int, timeout_s: float = 60) -> bool:
        """Until at least `n` requests have begun (False after `timeout_s`)."""
        with self.server.changed:
            return self.server.changed.wait_for(lambda: self.server.served >= n, timeout_s)

    def release(self) -> None:
        self.server.release_event.set()

    def close(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> Stub:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--chunks", type=int, default=64)
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    ap.add_argument("--delay-ms", type=float, default=5.0)
    a = ap.parse_args()
    stub = Stub(StubConfig(a.chunks, a.tokens_per_chunk, a.delay_ms / 1000, a.delay_ms / 1000))
    print(stub.url, flush=True)
    try:
        for _ in iter(input, "durations"):
            pass
        print(json.dumps(list(stub.server.times_s.items())), flush=True)
        threading.Event().wait()
    except (EOFError, KeyboardInterrupt):
        pass


if __name__ == "__main__":
    main()
