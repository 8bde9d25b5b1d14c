"""A chat answer as an OpenAI Responses API response (`Built`): the whole response from
the chat completion body, or the stream's ``response.*`` events from its chunks, both
built from the same output items (a ``message`` with one ``output_text`` part, then a
``function_call`` item per call). Pure but for `respond`, which answers the route.

The chat answer's finish maps to the response's ``status``: ``stop`` and ``tool_calls``
to ``completed``; ``length`` to ``incomplete`` (``incomplete_details.reason``:
``max_output_tokens``); ``abort`` (a shutdown mid-generation, a failure) to ``failed``
with its ``error``. specgen's ``timings`` and ``speculative`` ride along as in a chat
answer. Source: OpenAI's Responses API reference (the ``openai`` package's ``Response``
and ``ResponseStreamEvent`` types).
"""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from specgen.server.responses import Run, Streamed
from specgen.server.resprequest import ResponsesRequest, renamed

_EXTRAS = ("timings", "speculative", "tokens")
"""specgen's fields of a chat answer, carried into the response as they are."""


def _usage(chat: dict[str, Any] | None) -> dict[str, Any] | None:
    if chat is None:
        return None
    details = chat.get("prompt_tokens_details") or {}
    return {
        "input_tokens": chat["prompt_tokens"],
        "input_tokens_details": {
            "cached_tokens": details.get("cached_tokens", 0),
            "cache_write_tokens": 0,  # (OpenAI bills writes to its cache: none here)
        },
        "output_tokens": chat["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": chat["total_tokens"],
    }


class Built:
    """One response under construction: its items, its end, and the events that say so.

    Args:
        asked: the request (its fields are echoed in the response, as OpenAI's are).
        chat_id: the chat answer's id (``chatcmpl-HEX``): the response is ``resp_HEX``,
            its message ``msg_HEX``, its calls ``fc_HEX_I``.
        created: the chat answer's ``created`` (Unix seconds).
        model: the model served (its id in ``/v1/models``).
    """

    def __init__(self, asked: ResponsesRequest, chat_id: str, created: int, model: str) -> None:
        self.asked, self.model = asked, model
        self.hex = chat_id.rpartition("-")[2]
        self.created = created
        self.output: list[dict[str, Any]] = []
        self.message: dict[str, Any] | None = None  # the message item, while open
        self.status = "in_progress"
        self.finish: str | None = None
        self.error: dict[str, Any] | None = None
        self.usage: dict[str, Any] | None = None
        self.extras: dict[str, Any] = {}
        self._seq = 0
        self._pending: list[dict[str, Any]] = []  # logprobs of rounds without text yet

    # -- the response object ----------------------------------------------------------

    def response(self) -> dict[str, Any]:
        """The response object as it stands (OpenAI's ``Response``)."""
        b, given = self.asked.body, self.asked.given
        fmt = b.text.format if b.text is not None and b.text.format is not None else None
        incomplete = {"reason": "max_output_tokens"} if self.status == "incomplete" else None
        return {
            "id": f"resp_{self.hex}",
            "object": "response",
            "created_at": self.created,
            "status": self.status,
            "error": self.error,
            "incomplete_details": incomplete,
            "instructions": b.instructions,
            "max_output_tokens": b.max_output_tokens,
            "model": self.model,
            "output": self.output,
            "parallel_tool_calls": given.get("parallel_tool_calls", True),
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": False,
            "temperature": given.get("temperature"),
            "text": {
                "format": (
                    fmt.model_dump(exclude_none=True, by_alias=True)
                    if fmt is not None
                    else {"type": "text"}
                )
            },
            "tool_choice": given.get("tool_choice", "auto"),
            "tools": [t.model_dump(exclude_none=True, by_alias=True) for t in b.tools or ()],
            "top_logprobs": b.top_logprobs,
            "top_p": given.get("top_p"),
            "truncation": "disabled",
            "usage": self.usage,
            "metadata": b.metadata or {},
            "user": given.get("user"),
            **self.extras,
        }

    def _end(self, chat: dict[str, Any], finish: str | None) -> None:
        """The status of a chat answer that ended with `finish` (and maybe an error)."""
        self.finish = finish
        err = chat.get("error")
        if finish == "abort" or err:
            self.status = "failed"
            err = err or {}
            # OpenAI's codes: a grammar given up on mid-generation is the request's
            code = "invalid_prompt" if err.get("code") == "invalid_grammar" else "server_error"
            message = renamed(err.get("message") or "the generation stopped before its end")
            self.error = {"code": code, "message": message}
        elif finish == "length":
            self.status = "incomplete"
        else:
            self.status = "completed"
        self.extras.update({k: chat[k] for k in _EXTRAS if chat.get(k) is not None})

    def _message_item(self) -> dict[str, Any]:
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return {
            "id": f"msg_{self.hex}",
            "type": "message",
            "status": "in_progress",
            "role": "assistant",
            "content": [part],
        }

    def _call_item(self, call: dict[str, Any]) -> dict[str, Any]:
        n = sum(1 for x in self.output if x["type"] == "function_call")
        return {
            "id": f"fc_{self.hex}_{n}",
            "type": "function_call",
            "status": "completed",
            "call_id": call["id"],
            "name": call["function"]["name"],
            "arguments": call["function"]["arguments"],
        }

    # -- whole ------------------------------------------------------------------------

    def whole(self, chat: dict[str, Any]) -> dict[str, Any]:
        """The response of a whole chat answer (`chat`: its body, one choice)."""
        choice = chat["choices"][0]
        message = choice["message"]
        if message.get("content"):
            item = self._message_item()
            part = item["content"][0]
            part["text"] = message["content"]
            lps = (choice.get("logprobs") or {}).get("content") or []
            # beside calls, the chat answer's logprobs run on through the calls' tokens
            n_bytes = len(part["text"].encode("utf-8", "surrogatepass"))
            part["logprobs"] = _covering(lps, n_bytes) if message.get("tool_calls") else lps
            self.output.append(item)
        for call in message.get("tool_calls") or ():
            self.output.append(self._call_item(call))
        self._end(chat, choice["finish_reason"])
        for item in self.output:  # the calls returned are whole: a cut one is dropped
            item["status"] = "completed"
        if self.status != "completed" and self.output and self.output[-1]["type"] == "message":
            self.output[-1]["status"] = "incomplete"  # the item the end cut, as streamed
        self.usage = _usage(chat.get("usage"))
        return self.response()

    # -- stream -----------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    def _snapshot(self, kind: str) -> dict[str, Any]:
        return self._event(kind, response=copy.deepcopy(self.response()))

    def _open_message(self) -> list[dict[str, Any]]:
        self.message = self._message_item()
        self.output.append(self.message)
        index = len(self.output) - 1
        part = {**self.message["content"][0], "logprobs": []}  # not the list that grows
        shown = {**self.message, "content": []}
        return [
            self._event("response.output_item.added", output_index=index, item=shown),
            self._event(
                "response.content_part.added", item_id=self.message["id"],
                output_index=index, content_index=0, part=part,
            ),
        ]  # fmt: skip

    def _text(self, delta: str, logprobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        events = self._open_message() if self.message is None else []
        assert self.message is not None
        part = self.message["content"][0]
        part["text"] += delta
        part["logprobs"].extend(logprobs)
        events.append(
            self._event(
                "response.output_text.delta", item_id=self.message["id"],
                output_index=self.output.index(self.message), content_index=0,
                delta=delta, logprobs=logprobs,
            )
        )  # fmt: skip
        return events

    def _close_message(self, status: str) -> list[dict[str, Any]]:
        m = self.message
        if m is None:
            return []
        events = self._text("", self._pending) if self._pending else []
        self._pending = []
        self.message = None
        m["status"] = status
        part, index, item_id = m["content"][0], self.output.index(m), m["id"]
        return [
            *events,
            self._event(
                "response.output_text.done", item_id=item_id, output_index=index,
                content_index=0, text=part["text"], logprobs=part["logprobs"],
            ),
            self._event(
                "response.content_part.done", item_id=item_id, output_index=index,
                content_index=0, part=part,
            ),
            self._event("response.output_item.done", output_index=index, item=m),
        ]  # fmt: skip

    def _call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        item = self._call_item(call)
        self.output.append(item)
        index, args = len(self.output) - 1, item["arguments"]
        return [
            self._event(
                "response.output_item.added", output_index=index,
                item={**item, "arguments": "", "status": "in_progress"},
            ),
            self._event(
                "response.function_call_arguments.delta", item_id=item["id"],
                output_index=index, delta=args,
            ),
            self._event(
                "response.function_call_arguments.done", item_id=item["id"],
                output_index=index, name=item["name"], arguments=args,
            ),
            self._event("response.output_item.done", output_index=index, item=item),
        ]  # fmt: skip

    def _uncovered(self) -> int:
        """Bytes of the open message's text that its logprobs do not spell yet."""
        if self.message is None:
            return 0
        part = self.message["content"][0]
        covered = sum(_n_bytes(x) for x in part["logprobs"])
        return len(part["text"].encode("utf-8", "surrogatepass")) - covered

    def start(self) -> list[dict[str, Any]]:
        """The stream's first events: ``response.created``, ``response.in_progress``."""
        return [self._snapshot("response.created"), self._snapshot("response.in_progress")]

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """The events of one chat chunk (`specgen.server.shapes`: the role, a round's text
        with its logprobs, the calls, the finish with the statistics, the usage)."""
        if not chunk["choices"]:  # the usage chunk, the last
            self.usage = _usage(chunk.get("usage"))
            return []
        choice = chunk["choices"][0]
        delta = choice.get("delta") or {}
        lps = [*self._pending, *((choice.get("logprobs") or {}).get("content") or [])]
        self._pending = []
        text, calls = delta.get("content") or "", delta.get("tool_calls")
        if calls:  # the held rounds' logprobs: the text's, then the calls' (not listed)
            lps = _covering(lps, self._uncovered() + len(text.encode("utf-8", "surrogatepass")))
        events: list[dict[str, Any]] = []
        if text or (lps and calls and self.message is not None):
            events += self._text(text, lps)
        else:  # the role, a round that released no text yet, the end
            self._pending = lps
        if calls:
            events += self._close_message("completed")
            for call in calls:
                events += self._call(call)
        if choice.get("finish_reason") is not None:
            self._end(chunk, choice["finish_reason"])
        return events

    def close(self) -> list[dict[str, Any]]:
        """The stream's last events: the message closed, then ``response.completed``,
        ``response.incomplete`` or ``response.failed`` with the whole response."""
        if self.finish is None:  # no finish came: the run ended without one
            self.status = "failed"
            self.error = {"code": "server_error", "message": "the generation ended early"}
        item_status = "completed" if self.status == "completed" else "incomplete"
        events = self._close_message(item_status)
        kind = {"completed": "completed", "incomplete": "incomplete"}.get(self.status, "failed")
        return [*events, self._snapshot(f"response.{kind}")]


def _n_bytes(logprob: dict[str, Any]) -> int:
    raw = logprob.get("bytes")
    return len(raw) if raw is not None else len(str(logprob["token"]).encode())


def _covering(logprobs: list[dict[str, Any]], n_bytes: int) -> list[dict[str, Any]]:
    """The first of `logprobs` (chat entries, with their tokens' ``bytes``) that spell
    `n_bytes` bytes of text: the tokens that start within them."""
    room, out = n_bytes, []
    for x in logprobs:
        if room <= 0:
            break
        out.append(x)
        room -= _n_bytes(x)
    return out


def _sse(event: dict[str, Any]) -> dict[str, str]:
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return {"event": event["type"], "data": data}


async def _events(run: Run, built: Built) -> AsyncIterator[dict[str, str]]:
    """The run's chat chunks as Responses events (the first with the first token, as the
    chat stream's role chunk: a client timing its first event times the first token)."""
    started = False
    try:
        async for chunk in run.chunks(True):
            if not started:
                started = True
                for event in built.start():
                    yield _sse(event)
            for event in built.feed(chunk):
                yield _sse(event)
        for event in built.close():
            yield _sse(event)
    finally:  # the client went away mid-stream: free the slot
        run.cancel()


async def respond(
    run: Run, asked: ResponsesRequest, request: Request, send_timeout_s: float
) -> Response:
    """The route's answer: the response object, or its events streamed."""
    built = Built(asked, run.shape.id, run.shape.created, run.shape.model)
    if asked.stream:
        return Streamed(run, True, send_timeout_s, events=_events(run, built))
    with asked.names_in_errors():  # a failure mid-generation (a grammar's) named as here
        chat = await run.body(request)
    if chat is None:  # the client went away
        return Response(status_code=499)
    return JSONResponse(built.whole(chat))
