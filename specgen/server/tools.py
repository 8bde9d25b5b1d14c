"""Tool calls (OpenAI's ``tools`` and ``tool_choice``): the prompt, the grammar of a call,
and the answer's ``tool_calls``. Pure: no HTTP, no model.

The prompt. A chat template that reads a ``tools`` variable (Hermes, Qwen 2.5, Llama 3.1;
`specgen.chat.ChatFormatter.renders_tools`) gets the tools as llama-server ``--jinja`` and
transformers give them, and the conversation's earlier calls (``tool_calls``) and tool
results (``role: "tool"``) as they are. A template that does not (SmolLM2's ChatML) gets a
system message listing the tools and the call format (the JSON object of a call), earlier
calls written into the assistant's text in that form, and tool results as
``tool`` turns whose text names the call they answer.

The call. ``tool_choice: "required"`` or a named function constrains the whole answer to
one JSON object ``{"name": NAME, "arguments": {...}}`` whose arguments follow the
function's ``parameters`` schema (JSON Schema; any object when it has none): the grammar
is a JSON Schema (`specgen.grammar`), so the call is exact under speculation like any
constrained output. ``"none"`` is plain text. ``"auto"`` (OpenAI's default when tools are
given) would need the grammar to start only once the model opens a call: not served, a
400 says to name the tool or use ``required``.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from specgen.grammar import GrammarSpec
from specgen.server.schemas import ChatMessage, Tool, ToolChoiceNamed


def choice_of(tools: list[Tool] | None, choice: Any) -> str | None:
    """The function to call ("" for any of them: ``required``), or None for plain text.

    Raises:
        ValueError: a message for the 400 (auto, an unknown name, a choice without tools).
    """
    if not tools:
        if choice not in (None, "none"):
            raise ValueError("tool_choice needs tools")
        return None
    if choice == "none":
        return None
    if choice is None or choice == "auto":
        raise ValueError(
            'tool_choice "auto" is not served: name the function ({"type": "function",'
            ' "function": {"name": ...}}) or use "required" (the answer is then a call), or'
            ' "none"'
        )
    if choice == "required":
        return ""
    assert isinstance(choice, ToolChoiceNamed)
    names = [t.function.name for t in tools]
    if choice.function.name not in names:
        raise ValueError(
            f"tool_choice names {choice.function.name!r}, which is not among the tools"
            f" ({', '.join(names)})"
        )
    return choice.function.name


def call_schema(tool: Tool) -> dict[str, Any]:
    """The JSON Schema of one call of `tool`: ``{"name": NAME, "arguments": {...}}``."""
    params = tool.function.parameters or {"type": "object"}
    return {
        "type": "object",
        "properties": {"name": {"const": tool.function.name}, "arguments": params},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def call_grammar(tools: list[Tool], name: str) -> GrammarSpec:
    """The grammar of the answer: one call of the named function, or of any ("")."""
    chosen = [t for t in tools if name in ("", t.function.name)]
    schemas = [call_schema(t) for t in chosen]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    return GrammarSpec.json_schema(schema, "tools[].function.parameters")


def tool_dicts(tools: list[Tool]) -> list[dict[str, Any]]:
    """The tools as OpenAI's JSON objects (what a template's ``tools`` variable holds)."""
    return [t.model_dump(exclude_none=True) for t in tools]


def system_text(tools: list[Tool]) -> str:
    """The tools written for a template that does not render them."""
    lines = [
        "You may call functions. The functions available, as JSON Schemas:",
        *(json.dumps(t.function.model_dump(exclude_none=True)) for t in tools),
        'To call one, answer with the JSON object {"name": NAME, "arguments": {...}} and'
        " nothing else.",
    ]
    return "\n".join(lines)


def render_messages(
    messages: list[dict[str, Any]], chat: list[ChatMessage], tools: list[Tool] | None, native: bool
) -> list[dict[str, Any]]:
    """The messages (text already joined by `shapes.messages_of`) with tool calls and
    results as the template takes them: as they are for a template that renders tools
    (`native`), else written as text (see the module docstring)."""
    out: list[dict[str, Any]] = []
    for m, src in zip(messages, chat, strict=True):
        m = dict(m)
        if src.tool_calls:
            calls: list[dict[str, Any]] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.function.name, "arguments": c.function.arguments}}
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
            else:
                m["content"] = f"Result of call {src.tool_call_id or ''}: {m.get('content', '')}"
        out.append(m)
    if tools and not native:
        text = system_text(tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{text}"}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out


def tool_calls_of(text: str) -> list[dict[str, Any]] | None:
    """OpenAI's ``message.tool_calls`` of a complete call's text ``{"name", "arguments"}``:
    one call, its arguments as JSON text; None when the text is no complete call (cut by
    max_tokens)."""
    try:
        call = json.loads(text)
    except ValueError:
        return None
    if not isinstance(call, dict) or "name" not in call or "arguments" not in call:
        return None
    return [
        {
            "id": f"call_{secrets.token_hex(12)}",
            "type": "function",
            "function": {
                "name": call["name"],
                "arguments": json.dumps(call["arguments"], ensure_ascii=False),
            },
        }
    ]
