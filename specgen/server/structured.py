"""vLLM's structured-output request fields as grammar specs: ``guided_json``,
``guided_regex``, ``guided_choice``, ``guided_grammar`` and their newer form
``structured_outputs`` (``{"json" | "regex" | "choice" | "grammar" | "json_object": ...}``),
as vLLM's OpenAI-compatible server takes them (``vllm/entrypoints/openai/protocol.py``,
``StructuredOutputsParams``). Clients written for vLLM send them in ``extra_body``; left
unread, the output would not be constrained, so they are served here through the same
llguidance grammars as ``response_format`` (exact under speculation, `specgen.grammar`).

A choice is a regular expression of the choices as literals: llguidance's regex syntax is
the Rust ``regex`` crate's, whose meta characters are escaped (`literal_regex`).
"""

from __future__ import annotations

from typing import Any

from specgen.errors import GrammarError
from specgen.grammarspec import GrammarSpec

#: the Rust regex crate's meta characters (its ``escape``), each escaped with a backslash
_META = frozenset("\\.+*?()|[]{}^$#&-~")


def literal_regex(text: str) -> str:
    """A regular expression (Rust ``regex`` syntax) that matches `text` exactly."""
    return "".join("\\" + c if c in _META else c for c in text)


def choice_spec(choices: list[str], source: str) -> GrammarSpec:
    """The output is exactly one of `choices`.

    Raises:
        GrammarError: no choice, or an empty one, naming `source`.
    """
    if not choices or any(c == "" for c in choices):
        raise GrammarError(f"{source}: give at least one choice, none of them empty")
    return GrammarSpec("regex", "(" + "|".join(literal_regex(c) for c in choices) + ")", source)


def vllm_specs(req: Any) -> list[GrammarSpec]:
    """The grammar specs a request's vLLM fields ask for (empty when it gives none); each
    names its field (``guided_json``, ``structured_outputs.regex``...) as its source.

    Raises:
        GrammarError: a schema that is no JSON object, an empty choice list.
    """
    asked = [("guided_", {k: getattr(req, "guided_" + k) for k in _KINDS})]
    so = req.structured_outputs
    if so is not None:
        asked.append(("structured_outputs.", {**vars(so), "json": so.json_}))
    specs: list[GrammarSpec] = []
    for prefix, given in asked:
        if given["json"] is not None:
            specs.append(GrammarSpec.json_schema(given["json"], prefix + "json"))
        if given["regex"] is not None:
            specs.append(GrammarSpec("regex", given["regex"], prefix + "regex"))
        if given["choice"] is not None:
            specs.append(choice_spec(given["choice"], prefix + "choice"))
        if given["grammar"] is not None:  # GBNF, or Lark as `grammar` takes it
            specs.append(GrammarSpec("gbnf", given["grammar"], prefix + "grammar"))
        if given.get("json_object"):
            specs.append(GrammarSpec("json_object", "", prefix + "json_object"))
    return specs


_KINDS = ("json", "regex", "choice", "grammar")
