"""The HTTP edges of `specgen serve` over real sockets (the scripted scheduler of
`fake_server` behind the real app and uvicorn with `specgen.server.wire`'s protocol):
the API key's scheme in any case, and requests the HTTP parser refuses (an unknown
method, a malformed chunked body, a 64 KiB path, a 200 KB header line) answered with
OpenAI's error JSON, after which the server keeps serving; a streaming client that stops
reading loses its stream and its slot."""

from __future__ import annotations

import json
import socket

import fake_server as fake
import pytest
from support.served import USER, Served, serving

from specgen.server import wire
from specgen.server.app import Settings
from specgen.server.guard import bearer_token


def test_bearer_token_takes_the_scheme_in_any_case() -> None:
    assert bearer_token(b"Bearer k1") == b"k1"
    assert bearer_token(b"bearer k1") == b"k1"
    assert bearer_token(b"BEARER   k1") == b"k1"
    assert bearer_token(b"Basic k1") == b""
    assert bearer_token(b"Bearerk1") == b""
    assert bearer_token(b"") == b""


@pytest.mark.parametrize("header", ["bearer s3cret", "BEARER s3cret", "Bearer  s3cret"])
def test_the_key_is_accepted_with_the_scheme_in_any_case(header: str) -> None:
    with serving(Settings(api_key="s3cret")) as s:
        r = s.post("/v1/chat/completions", {"messages": USER}, headers={"Authorization": header})
        assert r.status_code == 200, r.text
        for wrong in ("bearer s3cre", "Basic s3cret", "s3cret", "bearer s3cret2"):
            r = s.post("/v1/chat/completions", {"messages": USER}, headers={"Authorization": wrong})
            assert r.status_code == 401
            assert "s3cret" not in r.text
        assert not any("s3cret" in line for line in s.log)


def _raw(s: Served, data: bytes) -> tuple[int, dict[str, str], bytes]:
    host, port = s.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(data)
        out = b""
        while chunk := sock.recv(1 << 16):  # to the server's end of its side
            out += chunk
    head, _, body = out.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


BAD = {
    "unknown-method": b"FROB /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    "malformed-chunked": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    "64k-path": b"GET /"
    + b"a" * (64 * 1024)
    + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    "200k-header": b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: "
    + b"a" * 200_000
    + b"\r\n\r\n",
}


def _check(s: Served, data: bytes, status: int) -> dict[str, str]:
    got, headers, body = _raw(s, data)
    assert got == status
    assert headers["content-type"] == "application/json"
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["message"]
    assert s.post("/v1/chat/completions", {"messages": USER}).status_code == 200
    return err


@pytest.mark.parametrize("name", list(BAD))
def test_requests_the_parser_refuses_get_openai_error_json_and_the_server_goes_on(
    name: str, served: Served
) -> None:
    err = _check(served, BAD[name], 400)
    if name.endswith(("path", "header")):
        assert err["code"] == "request_header_too_large"
        assert "65536 bytes" in err["message"]
    else:
        assert err["code"] == "invalid_http_request"


def test_without_httptools_h11_refusals_are_json_too() -> None:
    """uvicorn's fallback parser (httptools is a dependency; h11 serves without it):
    the parser's refusal in the same shape; h11 takes any method token, so the app
    answers an unknown one (405), in the same shape too."""
    http = {**wire.uvicorn_options(), "http": wire._h11_protocol()}
    with serving(http=http) as s:
        _check(s, BAD["malformed-chunked"], 400)
        _check(s, BAD["unknown-method"], 405)


@pytest.fixture
def served():
    with serving() as s:
        yield s


def test_a_client_that_stops_reading_its_stream_loses_it_and_its_slot() -> None:
    """A streaming client that takes no data for the send timeout (its receive buffer
    full) has its stream ended and its job cancelled, logged as finish stalled, while the
    server goes on serving: before, such a client held its slot until its generation's
    end. The generation asked for is far longer than any socket's buffers hold (5 million
    tokens, ignore_eos), and the test waits for its cancellation (a generation that ends
    by itself is not cancelled), bounded far above the timeout (no timing is asserted)."""
    sched = fake.FakeScheduler(n_ctx_slot=10_000_000)
    with serving(Settings(send_timeout_s=0.3), backend=fake.fake_backend(sched)) as s:
        host, port = s.url.removeprefix("http://").split(":")
        body = json.dumps(
            {"prompt": "Hi", "stream": True, "max_tokens": 5_000_000, "ignore_eos": True}
        ).encode()
        with socket.socket() as raw:
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting
            raw.connect((host, int(port)))
            raw.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            )  # and never read
            sched.wait(lambda f: len(f.cancelled) == 1, timeout_s=120)
            assert sched.slots_busy == 0
        assert s.post("/v1/completions", {"prompt": "Hi"}).status_code == 200
        # written with the cancel, in one turn of the event loop that has since answered
        assert any(
            "finish stalled (the client took no data for 0.3 s)" in line for line in s.log
        ), s.log


def test_the_runner_keeps_a_stalled_stream_out_of_uvicorns_log() -> None:
    import logging

    from specgen.server.responses import ClientStalled
    from specgen.server.runner import _not_stalled

    def record(exc: BaseException) -> logging.LogRecord:
        return logging.LogRecord("uvicorn.error", 40, "", 0, "x", (), (type(exc), exc, None))

    assert not _not_stalled(record(ClientStalled("c1: the client took no data for 60 s")))
    assert _not_stalled(record(ValueError("a real bug")))
