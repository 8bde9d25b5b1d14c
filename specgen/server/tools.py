"""Tool calls (OpenAI's ``tools`` and ``tool_choice``): the prompt, the grammar of a call,
and the answer's ``tool_calls``. Pure: no HTTP, no model.

The prompt. A chat template that reads a ``tools`` variable (Hermes 2 Pro, Qwen 2.5 and 3,
Llama 3.1...; `TemplateTools.native`) gets the tools as llama-server ``--jinja`` and
transformers' ``apply_chat_template`` give them (OpenAI's tool objects), the
conversation's earlier calls (``tool_calls``) and tool results (``role: "tool"`` with
``tool_call_id``) as they are. A call's ``arguments`` go to the template as JSON text, or
as an object where the template needs one (Qwen's ``tool_call.arguments | tojson``:
`object_arguments` probes the template, as llama.cpp's minja does with its
``requires_object_arguments`` capability). The fallback, for a template that does not read
``tools`` (SmolLM2's ChatML): a system message listing the tools and the call format (the
JSON object of a call), earlier calls written into the assistant's text in that form, and
tool results as ``tool`` turns whose text names the call they answer.

The call syntax (`TemplateTools.syntax`). A template that reads ``tools`` and mentions
``<tool_call>`` (Hermes 2 Pro, Qwen 2.5, Qwen 3: llama.cpp's ``common_chat_templates``
detects the Hermes format the same way) has the Hermes syntax: a call is
``<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>``, several calls one per
line. Every other template has no known syntax: a call is the bare JSON object
``{"name": NAME, "arguments": {...}}``.

What each ``tool_choice`` generates (`Choice`; the grammar:
`specgen.server.callgrammar.call_grammar`):

- ``"none"``: plain text; the tools are still rendered (the model knows them).
- ``"required"`` or a named function: the whole answer is a call (of the named function, or
  of any tool), its arguments following the function's ``parameters`` schema (JSON Schema;
  any object when it has none): in the Hermes syntax one tagged call of a named function,
  one or more for ``"required"`` (one with ``parallel_tool_calls: false``), else one bare
  JSON object.
- ``"auto"`` (OpenAI's default when tools are given), Hermes syntax only: the model writes
  freely; from the first ``<tool_call>`` it writes, the rest is held to the calls' grammar
  (the call's JSON, the closing tag, then another call or the end). One llguidance grammar
  does both: free text is a lazy lexeme ending at the tag (llguidance's ``StructTag``
  construction, docs/syntax.md "Tool calling"), so the mask is a function of the output
  so far like any grammar's and speculation stays exact (the same mask on p and q,
  matchers rolled back with the caches: `specgen.grammarrows.GrammarProcessor`). Before the
  tag, the mask allows every token but the control tokens that are not end-of-generation
  (``<|im_start|>``...: not text, so not in the free-text rule). Beside a JSON
  ``response_format`` the free text is that JSON instead (`callgrammar.with_format`).
  Other syntaxes: a 400 saying to name the function or use ``required``.

The answer (`parse`): the text before the first ``<tool_call>`` is the message's content
(null when only whitespace), each complete call one entry of ``tool_calls`` with its
arguments as JSON text, finish reason ``tool_calls`` (``length`` where max_tokens cut
the answer: a last call cut short is dropped, the complete ones before it stand); an
answer without a complete call (text only, or its first call cut by max_tokens) is content
as written. Streaming (`ContentGate`): content goes out as generated, held back only while
it might be the start of ``<tool_call>`` (and trailing whitespace, which the content drops
before a call); the calls go out whole in the final chunk as ``delta.tool_calls``.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from specgen import ChatTemplateError
from specgen.server.schemas import ChatMessage, Tool, ToolChoiceNamed

Syntax = Literal["hermes", "json"]
"""How a call is written: Hermes' tagged JSON, or the bare JSON object (the fallback)."""

OPEN, CLOSE = "<tool_call>", "</tool_call>"
"""The Hermes call tags."""


@dataclass(frozen=True)
class TemplateTools:
    """What a chat template does with tools (read once per template, at start).

    Attributes:
        native: the template reads ``tools`` (else the system-message fallback).
        syntax: ``hermes`` for a native template that mentions ``<tool_call>``, else
            ``json``; ``tool_choice: "auto"`` is served for ``hermes`` only.
        object_arguments: earlier calls' ``arguments`` go to the template as an object
            (else as JSON text, OpenAI's form).
        thinks: the template writes or reads a model's reasoning (``<think>``,
            ``reasoning_content``, ``enable_thinking``), which is not parsed out of the
            answer: ``reasoning_format: "auto"`` is then refused.
    """

    native: bool = False
    syntax: Syntax = "json"
    object_arguments: bool = False
    thinks: bool = False

    @classmethod
    def of(cls, template: str, render: Callable[..., str] | None = None) -> TemplateTools:
        """Read a template's source; `render` ((messages, tools) -> text) probes it for
        `object_arguments` (see that function)."""
        native = "tools" in template
        syntax: Syntax = "hermes" if native and OPEN in template else "json"
        obj = native and render is not None and object_arguments(render)
        thinks = any(w in template for w in ("<think>", "reasoning_content", "enable_thinking"))
        return cls(native, syntax, obj, thinks)


_PROBE_ARGS = {"probe_key": "probe_value"}
_PROBE_TOOL = {
    "type": "function",
    "function": {"name": "probe_fn", "parameters": {"type": "object"}},
}


def object_arguments(render: Callable[..., str]) -> bool:
    """Whether a template needs a call's arguments as an object: it renders JSON text
    arguments escaped (Qwen 2.5's ``tojson`` on a string gives ``"{\\"probe_key\\"...``) and
    object arguments as JSON. llama.cpp probes the same (minja's ``chat_template_caps``,
    ``requires_object_arguments``). A template that fails on either form keeps JSON text.
    """

    def shows(arguments: object) -> bool:
        call = {"id": "call_probe", "type": "function",
                "function": {"name": "probe_fn", "arguments": arguments}}  # fmt: skip
        msgs = [
            {"role": "user", "content": "probe"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
        ]
        try:
            text = render(msgs, [_PROBE_TOOL])
        except ChatTemplateError:
            return False
        return '"probe_key": "probe_value"' in text or '"probe_key":"probe_value"' in text

    return not shows(json.dumps(_PROBE_ARGS)) and shows(dict(_PROBE_ARGS))


@dataclass(frozen=True)
class Choice:
    """What a request's ``tool_choice`` asks (see the module docstring).

    Attributes:
        kind: ``none``, ``auto``, ``required`` or ``named``.
        name: the function of ``named``; "" otherwise.
        syntax: how calls are written (the template's).
        parallel: more than one call may be made (``parallel_tool_calls``, default true;
            the bare JSON syntax makes one).
    """

    kind: Literal["none", "auto", "required", "named"]
    name: str = ""
    syntax: Syntax = "json"
    parallel: bool = True

    @property
    def calls(self) -> bool:
        """Whether the answer may hold calls (parsed into ``tool_calls``)."""
        return self.kind != "none"


def choice_of(
    tools: list[Tool] | None,
    choice: Any,
    template: TemplateTools = TemplateTools(),
    parallel: bool | None = None,
) -> Choice | None:
    """The request's `Choice`, or None without tools.

    Raises:
        ValueError: a message for the 400 (auto where the template's call syntax is not
            known, an unknown name, a choice without tools).
    """
    if not tools:
        if choice not in (None, "none"):
            raise ValueError("tool_choice needs tools")
        return None
    syntax = template.syntax
    multi = parallel is not False and syntax == "hermes"
    if choice == "none":
        return Choice("none", syntax=syntax)
    if choice is None or choice == "auto":
        if syntax != "hermes":
            how = (
                "this model's chat template does not render tools"
                if not template.native
                else "this model's chat template has no known tool-call syntax"
            )
            raise ValueError(
                f'tool_choice "auto" (the default with tools) is served for templates with'
                f" Hermes/Qwen <tool_call> calls only, and {how}: name the function"
                ' ({"type": "function", "function": {"name": ...}}) or use "required" (the'
                ' answer is then a call), or "none"'
            )
        return Choice("auto", syntax=syntax, parallel=multi)
    if choice == "required":
        return Choice("required", syntax=syntax, parallel=multi)
    assert isinstance(choice, ToolChoiceNamed)
    names = [t.function.name for t in tools]
    if choice.function.name not in names:
        raise ValueError(
            f"tool_choice names {choice.function.name!r}, which is not among the tools"
            f" ({', '.join(names)})"
        )
    # a named function is called once: the client forced that call, and asked for no other
    # (OpenAI answers it with one; the grammar's repeats let a small model call it again)
    return Choice("named", choice.function.name, syntax, False)


def tool_dicts(tools: list[Tool]) -> list[dict[str, Any]]:
    """The tools as OpenAI's JSON objects (what a template's ``tools`` variable holds)."""
    return [t.model_dump(exclude_none=True) for t in tools]


def system_text(tools: list[Tool], calls: bool = True) -> str:
    """The tools written for a template that does not render them; without `calls`
    (``tool_choice: "none"``) the list alone, without the call format."""
    lines = [
        "You may call functions. The functions available, as JSON Schemas:"
        if calls
        else "The functions available (answer in text: none is called now), as JSON Schemas:",
        *(json.dumps(t.function.model_dump(exclude_none=True)) for t in tools),
    ]
    if calls:
        lines.append(
            'To call one, answer with the JSON object {"name": NAME, "arguments": {...}} and'
            " nothing else."
        )
    return "\n".join(lines)


def _arguments(text: str, as_object: bool) -> Any:
    if not as_object:
        return text
    try:
        return json.loads(text)
    except ValueError:  # not JSON: the template gets it as it was sent
        return text


def render_messages(
    messages: list[dict[str, Any]],
    chat: list[ChatMessage],
    tools: list[Tool] | None,
    template: TemplateTools,
    instruct: bool = True,
) -> list[dict[str, Any]]:
    """The messages (text already joined by `requestconfig.messages_of`) with tool calls and
    results as the template takes them: as they are for a template that renders tools
    (`TemplateTools.native`; arguments as objects where it needs them), else written as
    text (see the module docstring); `instruct` False (``tool_choice: "none"``) leaves the
    call format out of the fallback's system message."""
    native = template.native
    out: list[dict[str, Any]] = []
    for m, src in zip(messages, chat, strict=True):
        m = dict(m)
        if src.tool_calls:
            calls: list[dict[str, Any]] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.function.name,
                              "arguments": _arguments(c.function.arguments,
                                                      native and template.object_arguments)}}
                for c in src.tool_calls
            ]  # fmt: skip
            if native:
                m["tool_calls"] = calls
            else:
                text = "".join(
                    f'{{"name": {json.dumps(c["function"]["name"])}, "arguments":'
                    f" {c['function']['arguments']}}}"
                    for c in calls
                )
                m["content"] = (m.get("content") or "") + text
        if src.role == "tool":
            if native:
                if src.tool_call_id is not None:
                    m["tool_call_id"] = src.tool_call_id
                if src.name is not None:
                    m["name"] = src.name
            else:
                m["content"] = f"Result of call {src.tool_call_id or ''}: {m.get('content', '')}"
        out.append(m)
    if tools and not native:
        text = system_text(tools, instruct)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{text}"}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out


# -- the answer ---------------------------------------------------------------------------


def _call_entry(call: Any) -> dict[str, Any] | None:
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    if "arguments" not in call:
        return None
    return {
        "id": f"call_{secrets.token_hex(12)}",
        "type": "function",
        "function": {
            "name": call["name"],
            "arguments": json.dumps(call["arguments"], ensure_ascii=False),
        },
    }


_HERMES_CALL = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), flags=re.DOTALL)


def parse(text: str, syntax: Syntax) -> tuple[str | None, list[dict[str, Any]] | None]:
    """``(content, tool_calls)`` of an answer (see the module docstring).

    Returns:
        tool_calls as OpenAI's ``message.tool_calls`` (``id``, ``type``, ``function.name``,
        ``function.arguments`` as JSON text), or None when the text holds no complete call
        (content is then the whole text); content is the text before the first call, None
        when only whitespace. A last call cut short (the answer ended inside it or inside its
        opening tag: max_tokens) is dropped after complete ones.
    """
    if syntax == "json":
        try:
            entry = _call_entry(json.loads(text))
        except ValueError:
            entry = None
        return (None, [entry]) if entry is not None else (text, None)
    start = text.find(OPEN)
    if start < 0:
        return text, None
    calls: list[dict[str, Any]] = []
    pos = start
    for m in _HERMES_CALL.finditer(text, start):
        if text[pos : m.start()].strip():  # text between calls: not a call answer
            return text, None
        try:
            entry = _call_entry(json.loads(m.group(1)))
        except ValueError:
            return text, None
        if entry is None:
            return text, None
        calls.append(entry)
        pos = m.end()
    rest = text[pos:].strip()
    # something after the calls (not a call answer), or a first call cut short; a later
    # call cut short (max_tokens) leaves the complete ones standing, even when the cut
    # fell inside its tag ("<tool_": the answer was all calls up to there)
    cut = (rest.startswith(OPEN) and CLOSE not in rest) or OPEN.startswith(rest)
    if not calls or (rest and not cut):
        return text, None
    head = text[:start].rstrip()
    return (head if head.strip() else None), calls


class ContentGate:
    """A streamed answer's content: what may go out now, given the text so far.

    With `open` (``auto``) the text before a call streams, held back only where it might
    be the start of ``<tool_call>`` or is trailing whitespace (both dropped from the content
    if a call follows); with the answer all call (``required``, named) nothing streams.
    `released` counts the characters sent."""

    def __init__(self, open_: bool) -> None:
        self.open = open_
        self.text = ""
        self.released = 0

    def feed(self, text: str) -> str:
        """The content to send after `text` (the next piece of the answer); may be ""."""
        self.text += text
        if not self.open:
            return ""
        head = self.text
        at = head.find(OPEN)
        if at >= 0:
            head = head[:at]
        else:
            for n in range(min(len(OPEN) - 1, len(head)), 0, -1):
                if OPEN.startswith(head[-n:]):
                    head = head[:-n]
                    break
        head = head.rstrip()
        if len(head) <= self.released:
            return ""
        out = head[self.released :]
        self.released = len(head)
        return out


def content_rest(gate: ContentGate, content: str | None) -> str:
    """The part of the final content not streamed yet (`content` from `parse`)."""
    return (content or "")[gate.released :]
