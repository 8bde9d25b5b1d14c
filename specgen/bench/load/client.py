"""One streaming request of `specgen bench --url`: the request body, the SSE stream split into
lines and read (`StreamState`), and `send_one`, which turns whatever happens into a
`RequestRecord`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpcore

from specgen.bench.load import transport
from specgen.bench.load.prompts import LoadPrompt
from specgen.bench.load.results import LoadSettings
from specgen.bench.loadstats import RequestRecord, SpecStats
from specgen.errors import ConfigError

CHAT = "chat"
COMPLETIONS = "completions"
ROUTES = {CHAT: "/v1/chat/completions", COMPLETIONS: "/v1/completions"}


def request_body(
    p: LoadPrompt, endpoint: str, model: str, s: LoadSettings, temp: float, seed: int
) -> dict[str, Any]:
    """The JSON body of one streaming request (the wire format, hence a dict)."""
    body: dict[str, Any] = {"model": model}
    if endpoint == CHAT:
        msgs = p.messages if p.messages is not None else (("user", p.prompt or ""),)
        body["messages"] = [{"role": r, "content": c} for r, c in msgs]
    else:
        if p.prompt is None:
            raise ConfigError(
                f"prompt {p.id} has messages: the completions endpoint needs a prompt"
                " (use --endpoint chat)"
            )
        body["prompt"] = p.prompt
    body |= {"max_tokens": s.max_tokens, "temperature": temp, "seed": seed, "stream": True,
             "stream_options": {"include_usage": True}}  # fmt: skip
    if p.fields:
        body |= dict(p.fields)
    # a structure ends where its grammar completes, where only the end of generation is
    # allowed: ignoring EOS there would ask for tokens the grammar forbids
    if s.ignore_eos and not p.fields:
        body["ignore_eos"] = True
    for name in ("top_k", "top_p", "min_p"):
        if getattr(s, name) is not None:
            body[name] = getattr(s, name)
    return body


class StreamState:
    """Reads one SSE stream: `feed` takes the body's bytes as they come and splits them into
    lines (LF or CRLF: what servers send), stamping each chunk with text."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.chunk_s: list[float] = []
        self.text: list[str] = []
        self.speculative: dict[str, Any] | None = None  # specgen's own, verbatim
        self.usage_tokens: int | None = None
        self.spec: SpecStats | None = None
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.done = False
        self.done_s: float | None = None  # when `data: [DONE]` came
        self._rest = b""  # a line not yet ended

    def feed(self, data: bytes, t: float) -> None:
        if self._rest:
            data = self._rest + data
        lines = data.split(b"\n")
        self._rest = lines.pop()
        for line in lines:
            if line[:5] == b"data:":  # else comments, `event:` lines, blank separators
                self.data(line[5:], t)

    def data(self, payload: bytes, t: float) -> None:
        """The payload of one `data:` line (the CR of a CRLF is stripped here)."""
        payload = payload.strip()
        if payload == b"[DONE]":
            self.done, self.done_s = True, t
            return
        try:
            obj = json.loads(payload)
        except ValueError:  # not JSON, or not UTF-8
            self.error = "stream error"
            return
        if not isinstance(obj, dict):
            return
        if "error" in obj:
            self.error = "stream error"
        for choice in obj.get("choices") or ():
            if self.endpoint == CHAT:
                delta = choice.get("delta") or {}
                text = (delta.get("content") or "") + (delta.get("reasoning_content") or "")
            else:
                text = choice.get("text") or ""
            if text:
                self.chunk_s.append(t)
                self.text.append(text)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        usage = obj.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.usage_tokens = usage["completion_tokens"]
        self.spec = _spec_of(obj) or self.spec
        if isinstance(obj.get("speculative"), dict):
            self.speculative = obj["speculative"]


def _spec_of(obj: dict[str, Any]) -> SpecStats | None:
    sp = obj.get("speculative")
    if isinstance(sp, dict) and isinstance(sp.get("num_draft_tokens"), int):
        return SpecStats(
            sp["num_draft_tokens"], int(sp.get("num_accepted_draft_tokens") or 0), "speculative"
        )
    tm = obj.get("timings")
    if isinstance(tm, dict) and isinstance(tm.get("draft_n"), int):
        return SpecStats(tm["draft_n"], int(tm.get("draft_n_accepted") or 0), "timings")
    return None


async def send_one(
    pool: httpcore.AsyncConnectionPool,
    url: str,
    body: dict[str, Any],
    endpoint: str,
    index: int,
    p: LoadPrompt,
    clock: Callable[[], float],
    timeout_s: float,
    headers: dict[str, str] | None = None,
) -> RequestRecord:
    """One streaming request through `pool` (see `transport.connection_pool`), whatever
    happens: a failure is a record, never an exception. `timeout_s` bounds the whole
    request, a retry included (connecting: at most 10 s of it). A request that the server
    refused by closing its kept-alive connection (`transport.retryable`) is resent once on
    a fresh connection and marked `retried`; its times still start at the first send."""
    st = StreamState(endpoint)
    failure: str | None = None
    retried = False
    content = json.dumps(body).encode()
    head = [("Content-Type", "application/json"), ("Accept", "text/event-stream")]
    head += list((headers or {}).items())
    limit = {"connect": min(timeout_s, 10.0), "pool": timeout_s}
    start = clock()

    async def once(
        via: httpcore.AsyncConnectionPool | httpcore.AsyncHTTPConnection, attempt: transport.Attempt
    ) -> str | None:
        transport.current.set(attempt)
        ext = {"timeout": limit, "trace": attempt.trace}
        async with via.stream("POST", url, headers=head, content=content, extensions=ext) as resp:
            if resp.status != 200:
                await resp.aread()
                return f"http {resp.status}"
            # read on past [DONE] to the end of the body: a response left unread closes
            # its connection, and the next request would pay a new one
            async for data in resp.aiter_stream():
                st.feed(data, clock())
        return st.error or (None if st.done else "disconnect")

    async def stream() -> str | None:
        nonlocal retried
        attempt = transport.Attempt()
        try:
            return await once(pool, attempt)
        except (httpcore.NetworkError, httpcore.ProtocolError) as e:
            if not transport.retryable(attempt, e):
                raise
        retried = True  # nothing of a response came: `st` is as it was
        async with transport.fresh_connection(url) as conn:
            return await once(conn, transport.Attempt())

    try:
        failure = await asyncio.wait_for(stream(), timeout_s)
    except (asyncio.TimeoutError, httpcore.TimeoutException):
        failure = "timeout"
    except httpcore.ConnectError:
        failure = "connect"
    except (httpcore.NetworkError, httpcore.ProtocolError):
        failure = "disconnect"
    if st.done and failure in ("timeout", "disconnect"):
        failure = st.error  # the stream was whole; only what came after [DONE] went wrong
    end = st.done_s if st.done_s is not None else clock()  # E2EL ends at [DONE]
    tokens = st.usage_tokens if st.usage_tokens is not None else len(st.chunk_s)
    return RequestRecord(
        index=index, prompt_id=p.id, kind=p.kind, start_s=start, chunk_s=tuple(st.chunk_s),
        end_s=end, output_tokens=tokens, tokens_from_usage=st.usage_tokens is not None,
        spec=st.spec, failure=failure, finish_reason=st.finish_reason, retried=retried,
        text="".join(st.text), speculative=st.speculative,
    )  # fmt: skip
