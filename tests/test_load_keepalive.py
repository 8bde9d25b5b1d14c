"""The load client's kept-alive connections and its one retry, against the stub server
(tests/openai_stub.py): a request that the server refuses by closing its kept-alive
connection unanswered is resent once on a fresh connection and counted; a fresh
connection's failure, and one after the response began, are the server's and are not."""

from __future__ import annotations

import asyncio
from typing import Any

from openai_stub import Stub, StubConfig

from specgen.bench import load
from specgen.bench.load import transport
from specgen.bench.load.client import COMPLETIONS, ROUTES
from specgen.bench.load.report import failures_text, to_dict
from specgen.bench.load.transport import AsyncioBackend, connection_pool
from specgen.bench.loadstats import LoadLevel, RequestRecord


def _send(stub: Stub, *prompts: str) -> list[RequestRecord]:
    """`prompts` one after another through one pool of one connection."""

    async def go() -> list[RequestRecord]:
        url = stub.url + ROUTES[COMPLETIONS]
        out = []
        async with connection_pool(stub.url, 1) as pool:
            for i, text in enumerate(prompts):
                p = load.LoadPrompt(f"p{i}", "k", prompt=text)
                body = {"prompt": text, "seed": i, "stream": True}
                out.append(await load.send_one(pool, url, body, COMPLETIONS, i, p, _clock, 30.0))
        return out

    return asyncio.run(go())


def _clock() -> float:
    return asyncio.get_running_loop().time()


def _peers(stub: Stub) -> list[Any]:
    return stub.server.peers


def test_a_request_refused_on_a_kept_alive_connection_is_resent_once_and_counted() -> None:
    """The server reads the second request on a connection and closes it unanswered (as one
    closing an idle connection just as a request comes): that request goes again on a new
    connection and completes; the first (fresh) one is not marked."""
    with Stub(StubConfig(n_chunks=3, answers_per_connection=1)) as stub:
        first, second = _send(stub, "one", "two")
        peers = _peers(stub)
    assert first.ok and not first.retried
    assert second.ok and second.retried and len(second.chunk_s) == 3
    assert second.output_tokens == 6 and second.chunk_s[0] > second.start_s
    # "one" and the refused "two" on one connection, the resent "two" on another
    assert len(peers) == 3 and peers[0] == peers[1] != peers[2]


def test_a_fresh_connection_closed_unanswered_is_a_disconnect_not_retried() -> None:
    with Stub(StubConfig(n_chunks=3)) as stub:
        (r,) = _send(stub, "SILENT")
        assert stub.served == 1  # the server saw it once
    assert r.failure == "disconnect" and not r.retried and r.chunk_s == ()


def test_a_kept_alive_connection_dropped_after_the_response_began_is_not_retried() -> None:
    """After a chunk of the body, and after half a status line (which httpcore reports as
    it reports no response at all: the client counts the bytes itself)."""
    with Stub(StubConfig(n_chunks=3)) as stub:
        first, dropped, _, half = _send(stub, "one", "DROP", "two", "HALF")
        peers = _peers(stub)
    assert len(peers) == 4 and peers[0] == peers[1] and peers[2] == peers[3]  # reused ones
    assert first.ok and dropped.failure == "disconnect" and not dropped.retried
    assert len(dropped.chunk_s) == 1  # the chunk that came before the drop
    assert half.failure == "disconnect" and not half.retried and half.chunk_s == ()


def test_retries_are_counted_per_level_in_the_summary_the_json_and_the_table() -> None:
    """Closed loop at 1 stream, each connection answering one POST: the warm-up opens one
    (after `/v1/models` on it), the 1st request is refused on it and resent on a connection
    of its own, the 2nd opens a new pooled one, the 3rd is refused on that one: 2 retried."""
    settings = load.LoadSettings(
        levels=(LoadLevel(0.0, concurrency=1),), num_prompts=3, max_tokens=4, seed=5, warmup=1
    )
    prompts = [load.LoadPrompt("p", "k", prompt="hello")]
    with Stub(StubConfig(n_chunks=2, answers_per_connection=1)) as stub:
        res = load.run_load(load.parse_servers([stub.url], []), prompts, settings)
        assert stub.served == 1 + 3 + 2  # every POST the server read, refused ones included
    (run,) = res.runs
    s = run.summary
    assert s.failures == () and s.n_completed == 3 and s.n_retried == 2
    assert [r.retried for r in run.records] == [True, False, True]
    saved = to_dict(res)["runs"][0]
    assert saved["summary"]["n_retried"] == 2
    assert [q["retried"] for q in saved["requests"]] == [True, False, True]
    assert failures_text(s) == "0 (2 retried)"


def test_writes_are_held_until_the_request_ends_or_its_response_is_read() -> None:
    """The transport sends a request's pieces as one, at httpcore's end of request (an
    empty write); a request ended otherwise is sent when its response is read."""
    get = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"

    async def go(port: int) -> bytes:
        s = await AsyncioBackend().connect_tcp("127.0.0.1", port)
        assert isinstance(s, transport._Stream)
        sent: list[bytes] = []
        write = s._writer.write
        s._writer.write = lambda data: (sent.append(data), write(data))[1]  # type: ignore[method-assign]
        got = b""

        async def responses(n: int) -> None:  # until n whole `/v1/models` bodies came
            nonlocal got
            while got.count(b"}]}") < n:
                data = await s.read(65536, timeout=30)  # a hang guard, never reached
                assert data, "the server closed the connection"
                got += data

        await s.write(get[:20])
        await s.write(get[20:])
        await s.write(b"")
        assert sent == [get]
        await responses(1)
        await s.write(get)  # no end: sent by the read
        assert sent == [get]
        await responses(2)
        assert sent == [get, get]
        await s.aclose()
        return got

    with Stub() as stub:
        got = asyncio.run(go(stub.server.server_address[1]))
    assert got.count(b"HTTP/1.1 200 OK") == 2
