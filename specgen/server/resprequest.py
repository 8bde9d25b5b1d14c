"""OpenAI's Responses API (``POST /v1/responses``) served as a chat request: a Responses
body becomes the chat completion body that asks the same (`ResponsesRequest.chat`), so
that every setting, constraint and refusal of ``/v1/chat/completions`` applies to it as
written once; `specgen.server.respbody` turns the chat answer back into a response.

What maps to what:

* ``instructions``: a system message before the ``input``; ``input``: a string (one user
  message) or a list of items: messages (text parts only), ``function_call`` items (an
  assistant message's ``tool_calls``) and ``function_call_output`` items (tool messages);
* ``max_output_tokens``: ``max_completion_tokens``; ``text.format``: ``response_format``;
  ``tools`` (``{"type": "function", "name", "parameters", ...}``) and a named
  ``tool_choice`` (``{"type": "function", "name"}``): the chat API's nested shapes;
  ``include: ["message.output_text.logprobs"]`` with ``top_logprobs``: ``logprobs``;
* any other field (``top_k``, ``seed``, ``stop``, ``logit_bias``, ...) is read as the chat
  route reads it (`specgen.server.fields`).

Nothing is stored: ``previous_response_id`` and ``conversation`` are refused, ``store``
changes nothing (as ``/v1/chat/completions``' ``store``). Sources: the ``openai``
package's ``ResponseCreateParams`` and OpenAI's Responses API reference.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    model_validator,
)

from specgen.logprobs import MAX_TOP
from specgen.server.fields import FIELDS, is_inert
from specgen.server.invalid import NoNearMisses, misspelt, near, validation_error
from specgen.server.requestconfig import RequestError

LOGPROBS = "message.output_text.logprobs"
"""The ``include`` value served: the output text's log-probabilities."""
ENCRYPTED = "reasoning.encrypted_content"
"""An ``include`` value that asks for nothing here (no reasoning item is generated), which
Codex and the Agents SDK send with ``store: false``."""


@dataclass(frozen=True)
class Rule:
    """What the server does with one Responses field: ``honoured``, ``ignored`` (changes
    nothing generated) or ``refused`` (unless its value is one of `inert`), and why."""

    status: Literal["honoured", "ignored", "refused"]
    note: str
    inert: tuple[Any, ...] = (None,)


_NOTHING_STORED = "nothing is stored; send the whole conversation as input"
_CACHING = "prompt caching is automatic"

RULES: dict[str, Rule] = {
    "model": Rule("honoured", "accepted; the server serves the one model it loaded"),
    "input": Rule(
        "honoured",
        "a string, or messages (text parts), function_call and function_call_output items",
    ),
    "instructions": Rule("honoured", "a system message before the input"),
    "max_output_tokens": Rule("honoured", "the most tokens to generate"),
    "temperature": Rule("honoured", "0 samples greedily"),
    "top_p": Rule("honoured", "nucleus sampling"),
    "tools": Rule("honoured", "function tools, as the chat route's"),
    "tool_choice": Rule("honoured", "none, auto, required or a named function"),
    "parallel_tool_calls": Rule("honoured", "as the chat route's"),
    "text": Rule("honoured", "format: text, json_object or json_schema; verbosity refused"),
    "stream": Rule("honoured", "server-sent events, OpenAI's response.* events"),
    "include": Rule("honoured", f"{LOGPROBS}; {ENCRYPTED} asks for nothing", inert=(None, [])),
    "top_logprobs": Rule("honoured", f"0-{MAX_TOP} alternatives per token, with include"),
    "reasoning": Rule("refused", "the model's reasoning is not controlled", inert=(None, {})),
    "previous_response_id": Rule("refused", _NOTHING_STORED),
    "conversation": Rule("refused", _NOTHING_STORED),
    "prompt": Rule("refused", "stored prompt templates are OpenAI's; send input"),
    "background": Rule("refused", "responses are answered as they run", inert=(None, False)),
    "truncation": Rule("refused", "the input is never cut", inert=(None, "disabled")),
    "context_management": Rule("refused", "the input is never compacted", inert=(None, [])),
    "moderation": Rule("refused", "nothing is moderated", inert=(None, {})),
    "access_programs": Rule("refused", "OpenAI's programs", inert=(None, [], {})),
    "store": Rule("ignored", "nothing is stored (GET /v1/responses/{id} is not served)"),
    "metadata": Rule("ignored", "sent back in the response"),
    "user": Rule("ignored", "an end-user id for abuse monitoring"),
    "safety_identifier": Rule("ignored", "an end-user id for abuse monitoring"),
    "service_tier": Rule("ignored", "one tier"),
    "prompt_cache_key": Rule("ignored", _CACHING),
    "prompt_cache_retention": Rule("ignored", _CACHING),
    "prompt_cache_options": Rule("ignored", _CACHING),
    "stream_options": Rule("ignored", "include_obfuscation: no padding is sent"),
    "max_tool_calls": Rule("ignored", "it limits built-in tools' calls: none is served"),
    "background_options": Rule("ignored", "background is refused"),
    "image": Rule("ignored", "no image is generated"),
}
"""Every field of OpenAI's ``ResponseCreateParams`` (``tests/test_responses_api.py``
checks the list against the installed ``openai`` package)."""

CHAT_NAMES: dict[str, str] = {
    "messages": "send input",
    "max_tokens": "send max_output_tokens",
    "max_completion_tokens": "send max_output_tokens",
    "response_format": "send text.format",
    "logprobs": f'send include: ["{LOGPROBS}"]',
    "n": "a response holds one output",
}
"""Chat fields refused here, with what to send instead: they have a Responses name, or
ask for what a response cannot hold (``n``: several choices). Values that ask for
nothing (`_CHAT_INERT`) are accepted."""

_CHAT_INERT: dict[str, tuple[Any, ...]] = {"n": (None, 1), "logprobs": (None, False)}


class _Model(NoNearMisses):
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class TextPart(_Model):
    type: Literal["input_text", "output_text"]
    text: str


Content = str | list[TextPart]


class MessageItem(_Model):
    # a response's item sent back: its id and status; phase (commentary or final answer,
    # for OpenAI's models) has no place in a chat template
    ignored: ClassVar = frozenset({"id", "status", "phase"})
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Content


class FunctionCallItem(_Model):
    ignored: ClassVar = frozenset({"id", "status", "namespace", "caller", "async"})
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(_Model):
    ignored: ClassVar = frozenset({"id", "status", "name", "namespace", "caller"})
    type: Literal["function_call_output"]
    call_id: str  # (it names the call: its name and namespace add nothing)
    output: Content


def _kind(item: Any) -> str:
    return str(item.get("type", "message")) if isinstance(item, dict) else "message"


_TAGS = {"message": "Message", "function_call": "FunctionCall"}


def _tag(item: Any) -> str:
    # capitalised: pydantic puts the tag in an error's path, where `validation_error`
    # leaves it out
    return _TAGS.get(_kind(item), "FunctionCallOutput")


Item = Annotated[
    Annotated[MessageItem, Tag("Message")]
    | Annotated[FunctionCallItem, Tag("FunctionCall")]
    | Annotated[FunctionCallOutputItem, Tag("FunctionCallOutput")],
    Discriminator(_tag),
]


class FunctionTool(_Model):
    # the schema of what the function returns, and who may call it: neither is written
    # into the prompt, so neither changes what is generated
    ignored: ClassVar = frozenset({"output_schema", "allowed_callers"})
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    defer_loading: Literal[False] | None = None  # true: refused (`_TOOL_SWITCHES`)
    async_: Literal[False] | None = Field(default=None, alias="async")


class NamedTool(_Model):
    type: Literal["function"]
    name: str


class TextFormat(_Model):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> TextFormat:
        if self.type == "json_schema" and self.schema_ is None:  # OpenAI requires it too
            raise ValueError("schema is required with type json_schema")
        return self


class TextConfig(_Model):
    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = None  # others: `_check_kinds`


class _Items(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)
    input: list[Item]


class Body(BaseModel):
    """The Responses fields this module reads (the others go to the chat body as sent;
    a misspelt one is refused by `ResponsesRequest.of`)."""

    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)

    input: list[Item] | str = Field(union_mode="left_to_right")
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, gt=0)
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedTool | None = None
    text: TextConfig | None = None
    stream: bool | None = None
    include: list[Literal["message.output_text.logprobs", "reasoning.encrypted_content"]] | None = (
        None
    )
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP)
    metadata: dict[str, str] | None = None


def _asks_nothing(value: Any, inert: tuple[Any, ...]) -> bool:
    """`value` is one of `inert` (`is_inert`), or an object whose every member is null (a
    response's own ``"reasoning": {"effort": null, ...}`` sent back)."""
    if isinstance(value, dict) and value and all(v is None for v in value.values()):
        return True
    return is_inert(value, inert)


_CHANGING = tuple(n for n, r in RULES.items() if r.status != "ignored")


def _near(name: str) -> str | None:
    """The Responses field that changes the output whose name `name` is a likely
    misspelling of (the chat route checks its own names: `specgen.server.fields`)."""
    return None if name in RULES or name in FIELDS else near(name, _CHANGING)


_ITEM_KINDS = ("message", "function_call", "function_call_output")
_PART_KINDS = ("input_text", "output_text")


def _refuse(param: str, message: str) -> RequestError:
    return RequestError(400, f"{param}: {message}", param=param)


_TOOL_SWITCHES = {
    "defer_loading": "every tool is in the prompt (OpenAI's tool search loads deferred ones)",
    "async": "a call's output is awaited before the answer goes on",
}


def _check_kinds(given: dict[str, Any]) -> None:
    """What this server cannot serve, refused by name where pydantic would say only that
    a value is not one of those it reads: items and parts that are not text, tools and
    tool choices that are not functions, other ``include`` values, ``text.verbosity``."""
    tools = given.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise _refuse("tools", "a list of function tools")
    for i, tool in enumerate(tools or ()):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind == "function" and "function" in tool and "name" not in tool:
            raise _refuse(
                f"tools[{i}]", "a Responses function tool is flat: "
                '{"type": "function", "name": ..., "parameters": ...}',
            )  # fmt: skip
        for key, why in _TOOL_SWITCHES.items():
            if isinstance(tool, dict) and tool.get(key) not in (None, False):
                raise _refuse(f"tools[{i}].{key}", f"not served: {why}")
        if kind != "function":
            raise _refuse(
                f"tools[{i}]", f"tools of type {kind!r} are not served: only function tools"
                " (this server runs no tool of its own)",
            )  # fmt: skip
    choice = given.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") != "function":
        raise _refuse(
            "tool_choice", f"{choice.get('type')!r} is not served: none, auto, required or"
            ' {"type": "function", "name": ...}',
        )  # fmt: skip
    for i, value in enumerate(given.get("include") or ()):
        if value not in (LOGPROBS, ENCRYPTED):
            raise _refuse(f"include[{i}]", f"only {LOGPROBS!r} is served, not {value!r}")
    text = given.get("text")
    if isinstance(text, dict) and text.get("verbosity") not in (None, "medium"):
        raise _refuse("text.verbosity", "the answer's length is not steered (medium only)")
    input_ = given.get("input")
    if input_ is not None and not isinstance(input_, (str, list)):
        raise _refuse("input", "a string or a list of items")
    if not isinstance(input_, list):
        return
    for i, item in enumerate(input_):
        kind = _kind(item)
        if kind not in _ITEM_KINDS:
            raise _refuse(
                f"input[{i}]", f"items of type {kind!r} are not served: send messages,"
                " function_call and function_call_output items",
            )  # fmt: skip
        key = "output" if kind == "function_call_output" else "content"
        parts = item.get(key) if isinstance(item, dict) else None
        for j, part in enumerate(parts if isinstance(parts, list) else ()):
            got = part.get("type") if isinstance(part, dict) else None
            if got not in _PART_KINDS:
                raise _refuse(f"input[{i}].{key}[{j}]", f"only text parts are served, not {got!r}")


def _text(content: Content) -> str:
    return content if isinstance(content, str) else "".join(p.text for p in content)


def messages_of(body: Body) -> list[dict[str, Any]]:
    """The chat messages of `body`'s instructions and input: a function_call item joins
    the assistant message just before it (or a new one), as the chat API lists calls."""
    out: list[dict[str, Any]] = []
    if body.instructions is not None:
        out.append({"role": "system", "content": body.instructions})
    items = (
        [MessageItem(role="user", content=body.input)]
        if isinstance(body.input, str)
        else body.input
    )
    for item in items:
        if isinstance(item, MessageItem):
            out.append({"role": item.role, "content": _text(item.content)})
        elif isinstance(item, FunctionCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = out[-1] if out else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": None}
                out.append(last)
            last.setdefault("tool_calls", []).append(call)
        else:
            out.append(
                {"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output)}
            )
    return out


# a chat error's field as the Responses API names it (the longest match first)
_RENAMED = (
    (re.compile(r"\bmessages\[\d+\]"), "input"),
    (re.compile(r"\bmessages\b"), "input"),
    (re.compile(r"\bmax_(completion_)?tokens\b"), "max_output_tokens"),
    (re.compile(r"\bresponse_format\.json_schema\.schema\b"), "text.format.schema"),
    (re.compile(r"\bresponse_format(\.json_schema)?\b"), "text.format"),
    (re.compile(r"\btools\[(\d+)\]\.function\b"), r"tools[\1]"),
    (re.compile(r"\btool_choice\.function\b"), "tool_choice"),
)


def renamed(text: str) -> str:
    """`text` (a chat error's param or message) with the chat fields named as here. A
    message's index into the chat messages is not one into ``input`` (instructions and
    calls move it), so ``messages[i]`` becomes ``input``."""
    for pattern, name in _RENAMED:
        text = pattern.sub(name, text)
    return text


@dataclass(frozen=True)
class ResponsesRequest:
    """One Responses request: what it asked (`body`, and the fields sent, `given`), and
    the chat completion body that asks the same (`chat`)."""

    body: Body
    given: dict[str, Any]
    chat: dict[str, Any]

    @classmethod
    def of(cls, raw: bytes) -> ResponsesRequest:
        """Parse a request body.

        Raises:
            RequestError: 400 naming the field: not JSON, a field refused (`RULES`,
                `CHAT_NAMES`), an item or part this server cannot read, a wrong value.
        """
        try:
            given = json.loads(raw)
        except ValueError as e:
            raise RequestError(400, f"the request body is not valid JSON: {e}") from None
        if not isinstance(given, dict):
            raise RequestError(400, "the request body must be a JSON object")
        for name, rule in RULES.items():
            if rule.status == "refused" and not _asks_nothing(given.get(name), rule.inert):
                raise RequestError(
                    400, f"{name} is not supported by this server: {rule.note}", param=name
                )
        for name, instead in CHAT_NAMES.items():
            if not _asks_nothing(given.get(name), _CHAT_INERT.get(name, (None,))):
                raise RequestError(
                    400, f"{name} is a chat completions field; {instead}", param=name
                )
        for name in given:
            close = _near(name)
            if close is not None:
                raise RequestError(400, misspelt(name, close), param=name)
        _check_kinds(given)
        try:
            if isinstance(given.get("input"), list):  # its items' errors, not the str branch's
                _Items.model_validate({"input": given["input"]})
            body = Body.model_validate(given)
        except ValidationError as e:
            message, param = validation_error(e)
            raise RequestError(400, message, param=param) from None
        return cls(body, given, _chat_body(body, given))

    @property
    def stream(self) -> bool:
        return bool(self.body.stream)

    @contextlib.contextmanager
    def names_in_errors(self) -> Iterator[None]:
        """Re-raise the chat route's `RequestError` with the fields named as here (`renamed`)."""
        try:
            yield
        except RequestError as e:
            param = renamed(e.param) if e.param is not None else None
            raise RequestError(
                e.status, renamed(e.message), type_=e.type, param=param, code=e.code,
                headers=e.headers,
            ) from None  # fmt: skip


_NOT_CHAT = {"type", "defer_loading", "async_"}  # a tool's fields the chat route has not


def _chat_body(body: Body, given: dict[str, Any]) -> dict[str, Any]:
    """The chat completion body that asks what `body` asks; fields of neither API (a
    client's extras, llama-server's and vLLM's samplers) go through as sent."""
    chat = {k: v for k, v in given.items() if k not in RULES}
    for name in ("model", "temperature", "top_p", "parallel_tool_calls", "stream"):
        if given.get(name) is not None:
            chat[name] = given[name]
    chat["messages"] = messages_of(body)
    if body.max_output_tokens is not None:
        chat["max_completion_tokens"] = body.max_output_tokens
    if body.tools is not None:
        chat["tools"] = [
            {"type": "function", "function": t.model_dump(exclude=_NOT_CHAT, exclude_none=True)}
            for t in body.tools
        ]
    choice = body.tool_choice
    if choice in ("auto", "none") and not body.tools:  # asks nothing (a response's own)
        choice = None
    if isinstance(choice, NamedTool):
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif choice is not None:
        chat["tool_choice"] = choice
    fmt = body.text.format if body.text is not None else None
    if fmt is not None and fmt.type == "json_schema":
        schema = fmt.model_dump(exclude={"type"}, exclude_none=True, by_alias=True)
        chat["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif fmt is not None:
        chat["response_format"] = {"type": fmt.type}
    if LOGPROBS in (body.include or ()):
        chat["logprobs"] = True
        if body.top_logprobs:
            chat["top_logprobs"] = body.top_logprobs
    elif body.top_logprobs:
        raise RequestError(400, f'top_logprobs needs include: ["{LOGPROBS}"]', param="top_logprobs")
    if body.stream:  # the usage goes in response.completed
        chat["stream_options"] = {"include_usage": True}
    return chat
