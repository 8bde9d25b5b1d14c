"""The grammar of a chat answer with tool calls (`call_grammar`, `specgen.server.tools`
says what each ``tool_choice`` generates) and the schema of one call (`call_schema`).
Pure: no HTTP, no model; compiled by `specgen.grammar` like any request's grammar.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from specgen import GrammarError
from specgen.grammarspec import JSON_DEFAULTS, GrammarSpec
from specgen.server.schemas import Tool
from specgen.server.tools import CLOSE, OPEN, Choice

_DATA_KEYS = frozenset({"const", "enum", "default", "examples"})
"""Keys whose values are JSON data, not schemas: a ``$ref`` inside them is not a reference."""


def _rebased(node: Any, root: str) -> Any:
    """`node` (a schema) with every local ``$ref`` (``#``, ``#/...``) moved under the JSON
    pointer `root`, where the schema now stands inside a larger one: a pointer resolves
    against the whole document's root (JSON Schema 2020-12, section 8.2.3.1), so a tool's
    ``#/$defs/Address`` names ``root/$defs/Address`` once its parameters are wrapped in
    the call's schema (else "Pointer does not exist", or ``#`` meaning the wrapper)."""
    if isinstance(node, list):
        return [_rebased(v, root) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            out[key] = root + value[1:]
        elif key in _DATA_KEYS:
            out[key] = value
        else:
            out[key] = _rebased(value, root)
    return out


def call_schema(tool: Tool, at: str = "#") -> dict[str, Any]:
    """The JSON Schema of one call of `tool`: ``{"name": NAME, "arguments": {...}}``, the
    parameters' local references rebased for a call schema standing at the pointer `at`
    of the grammar's schema (`_rebased`). A function without ``parameters`` takes none
    (OpenAI's reference: "an empty parameter list"), so its arguments are ``{}``."""
    params = tool.function.parameters
    if params is None:
        params = {"type": "object", "properties": {}, "additionalProperties": False}
    elif not params:
        params = {"type": "object"}
    return {
        "type": "object",
        "properties": {
            "name": {"const": tool.function.name},
            "arguments": _rebased(params, f"{at}/properties/arguments"),
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _calls_schema(tools: list[Tool], name: str) -> tuple[dict[str, Any], str]:
    """The calls' schema, and the field an error in it is named by: the one tool's
    ``tools[i].function.parameters``, or ``tools[].function.parameters`` for several."""
    chosen = [t for t in tools if name in ("", t.function.name)]
    if len(chosen) == 1:
        at = next(i for i, t in enumerate(tools) if t is chosen[0])
        return call_schema(chosen[0]), f"tools[{at}].function.parameters"
    calls = [call_schema(t, f"#/anyOf/{i}") for i, t in enumerate(chosen)]
    return {"anyOf": calls}, "tools[].function.parameters"


def culprit(
    tools: list[Tool],
    choice: Choice,
    check: Callable[[GrammarSpec], object],
    fmt: GrammarSpec | None = None,
) -> tuple[str, str] | None:
    """The first tool `choice` may call whose calls' grammar alone fails `check` (a
    compile), else the request's own format `fmt` if it fails alone: its field
    (``tools[i].function.parameters``, ``response_format...``) and its error; None where
    each compiles alone. For the error of a calls' grammar that failed, which named no
    tool (or all of them) and could list the whole grammar."""
    for i, tool in enumerate(tools):
        if choice.name not in ("", tool.function.name):
            continue
        source = f"tools[{i}].function.parameters"
        try:
            # the call's schema alone first: llguidance's error then quotes no Lark rules
            check(GrammarSpec.json_schema(call_schema(tool), source))
            spec = call_grammar([tool], choice)
            if spec is not None:
                check(dataclasses.replace(spec, source=source))
        except GrammarError as e:
            return source, str(e).replace("tools[0].function.parameters", source, 1)
    if fmt is not None:
        try:
            check(fmt)
        except GrammarError as e:
            return fmt.source, str(e)
    return None


def with_format(tools: list[Tool], choice: Choice, fmt: GrammarSpec | None) -> GrammarSpec | None:
    """The answer's grammar for `choice` beside the request's own format `fmt` (its
    ``response_format``, which shapes a text answer): for ``auto``, the calls or JSON that
    follows `fmt`; for ``required`` or a named function, the calls (an answer that is all
    calls has no text to shape); None for ``none`` (`fmt` alone then holds the text).

    Raises:
        ValueError: `fmt` is a grammar or a regex, not JSON, beside calls (not served).
    """
    if fmt is not None and choice.calls and fmt.schema is None:
        raise ValueError(
            f"tool_choice {choice.kind!r} and {fmt.source} both constrain the output: beside"
            " tool calls only a JSON format (response_format) is served"
        )
    answer = fmt.schema if fmt is not None and choice.kind == "auto" else None
    return call_grammar(tools, choice, answer)


def call_grammar(
    tools: list[Tool], choice: Choice, answer: dict[str, Any] | None = None
) -> GrammarSpec | None:
    """The grammar of the answer for `choice` (None for ``none``: plain text).

    Bare JSON syntax: a JSON Schema (one call). Hermes syntax: a Lark grammar (llguidance's
    dialect) with the call's JSON Schema inline (``%json``, under `JSON_DEFAULTS`'
    whitespace, as every schema here): the tagged calls, preceded for ``auto`` by free
    text that ends at the first ``<tool_call>`` (a lazy lexeme), or, with `answer` (the
    JSON Schema of a text answer: ``response_format``), either JSON that follows it or
    the calls.
    """
    if choice.kind == "none":
        return None
    schema, source = _calls_schema(tools, choice.name)
    if choice.syntax == "json":
        return GrammarSpec.json_schema(schema, source)
    inline = json.dumps({**schema, "x-guidance": JSON_DEFAULTS}, ensure_ascii=False)
    more = f' ("\\n" "{OPEN}" call_body)*' if choice.parallel else ""
    lines = ["%llguidance {}"]
    if choice.kind == "auto" and answer is None:
        lines += [
            "start: TEXT | calls",
            f"calls: call_open call_body{more}",
            f'call_open[lazy]: TEXT "{OPEN}"',
            "TEXT: /(.|\\n)*/",
        ]
    elif choice.kind == "auto":  # the answer's own whitespace options win, as they do alone
        assert answer is not None
        own = {**answer, "x-guidance": {**JSON_DEFAULTS, **answer.get("x-guidance", {})}}
        text = json.dumps(own, ensure_ascii=False)
        lines += [f"start: %json {text} | calls", f'calls: "{OPEN}" call_body{more}']
    else:
        lines += ["start: calls", f'calls: "{OPEN}" call_body{more}']
    lines.append(f'call_body: "\\n" %json {inline} "\\n{CLOSE}"')
    return GrammarSpec("lark", "\n".join(lines) + "\n", source)
