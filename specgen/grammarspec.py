"""What a request constrains its output to, before compilation: `GrammarSpec` and the
flags that make one (`spec_of`). No llguidance here: a server validates and keys requests
by spec without loading it; `specgen.grammar` compiles a spec.

Formats (`GrammarSpec.kind`):

- ``json_schema``: JSON Schema (llguidance's coverage, docs/json_schema.md of llguidance);
- ``json_object``: any JSON object (``{"type": "object"}``), OpenAI's JSON mode;
- ``lark``: llguidance's Lark dialect;
- ``gbnf``: llama.cpp's GBNF, converted by llguidance's `gbnf_to_lark` (``any_to_lark``:
  a Lark grammar, or one starting with ``%llguidance``, is taken as it is);
- ``regex``: a regular expression the whole output must match.

JSON whitespace (`JSON_DEFAULTS`). JSON Schema grammars default to *fixed* separators,
``", "`` between items and ``": "`` after keys, no other whitespace: the layout of Python's
``json.dumps`` and of most JSON in models' training text. Measured on the demo vocabulary
(FIELD.md): on a 24-token record 10 positions allow a single token with fixed separators
against 4 with JSON's flexible whitespace, and each such position is a token the grammar
proposes for free (no draft pass). Flexible whitespace also lets small models loop on
newlines until max_tokens. OpenAI's structured outputs promise no whitespace either. A
schema's own ``"x-guidance"`` options (e.g. ``{"whitespace_flexible": true}``) override
the default.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeGuard

from specgen.errors import ConfigError, GrammarError

GrammarKind = Literal["json_schema", "json_object", "lark", "gbnf", "regex"]
GRAMMAR_KINDS: tuple[GrammarKind, ...] = ("json_schema", "json_object", "lark", "gbnf", "regex")

JSON_DEFAULTS: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
"""llguidance's JSON compile options used under every schema unless its ``x-guidance``
says otherwise (see the module docstring: fixed separators, chosen for forced tokens)."""


@dataclass(frozen=True)
class GrammarSpec:
    """What a request constrains its output to, before compilation; frozen and hashable
    (the compiled grammar is cached per spec, and settings are keyed by it).

    Attributes:
        kind: one of `GRAMMAR_KINDS`.
        text: the grammar source, or the schema as compact JSON text (keys in their given
            order: it is the order properties are generated in); empty for
            ``json_object``.
        source: where it came from, for error messages (``--json-schema``,
            ``response_format.json_schema.schema``, ``grammar``...).
    """

    kind: GrammarKind
    text: str = ""
    source: str = "grammar"

    def __post_init__(self) -> None:
        if self.kind not in GRAMMAR_KINDS:
            raise GrammarError(f"{self.source}: unknown grammar kind {self.kind!r}")
        if self.kind == "gbnf" and not _LARK.search(self.text):
            n_rules = len(_GBNF_RULE.findall(self.text))
            if n_rules > GBNF_MAX_RULES or len(self.text) > GBNF_MAX_CHARS:
                raise GrammarError(
                    f"{self.source}: a GBNF grammar of {n_rules} rules and {len(self.text)}"
                    f" characters; at most {GBNF_MAX_RULES} and {GBNF_MAX_CHARS} are converted"
                    " (send it as Lark, which compiles directly)"
                )

    @classmethod
    def json_schema(cls, schema: Any, source: str = "json_schema") -> GrammarSpec:
        """A spec from a JSON Schema given as a dict, as JSON text, or as a pydantic model
        class (anything with ``model_json_schema()``).

        Raises:
            GrammarError: not JSON, not a JSON object, naming `source`.
        """
        if hasattr(schema, "model_json_schema"):
            schema = schema.model_json_schema()
        if isinstance(schema, str | bytes):
            try:
                schema = json.loads(schema)
            except ValueError as e:
                raise GrammarError(f"{source}: not valid JSON: {e}") from None
        if not isinstance(schema, Mapping):
            raise GrammarError(
                f"{source}: a JSON Schema must be a JSON object, got {type(schema).__name__}"
            )
        _check_schema(schema, source)
        # keys keep their order: a schema's property order is the order fields are generated
        text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
        return cls("json_schema", text, source)

    @property
    def schema(self) -> dict[str, Any] | None:
        """The JSON Schema of a ``json_schema`` or ``json_object`` spec (``{"type":
        "object"}``); None for a grammar or a regex."""
        if self.kind == "json_object":
            return {"type": "object"}
        return json.loads(self.text) if self.kind == "json_schema" else None

    @property
    def label(self) -> str:
        """One word for the output: the kind, e.g. ``json_schema``."""
        return self.kind


GBNF_MAX_RULES, GBNF_MAX_CHARS = 1000, 1 << 16
"""The largest GBNF grammar taken: llguidance converts GBNF to Lark in Python
(`gbnf_to_lark`), in time quadratic in the rules (1,000 in 0.4 s, 2,000 in 1.6 s, 20,000 in
186 s, holding the GIL: a server's other requests wait; 60,000 alternatives took 12 s).
llama.cpp's own grammars are a few KB. Lark has no such limit: llguidance reads it itself."""
_GBNF_RULE = re.compile(r"^\s*[\w.-]+\s*::=", re.MULTILINE)
_LARK = re.compile(r"^\s*(%llguidance\b|start\s*:)", re.MULTILINE)
"""llguidance's test for a Lark grammar (`gbnf_to_lark.is_lark_syntax`), which it takes
as it is."""


_MESSAGE_MAX = 300
"""Characters of llguidance's message kept in an error: its messages may quote the whole
grammar and dump the parser's state (a 500 KB grammar gave a 1.5 MB message, sent to the
client and written to the server's log)."""


def one_line(e: object) -> str:
    """llguidance's message on one line, without its ``<state>`` or ``<backtrace>`` dump, cut to
    `_MESSAGE_MAX` characters."""
    text = re.split("<state>|<backtrace>", str(e), maxsplit=1)[0]
    line = " ".join(text.split()) or type(e).__name__
    return line if len(line) <= _MESSAGE_MAX else line[: _MESSAGE_MAX - 1] + "…"


def _check_schema(schema: Any, source: str) -> None:
    """Refuse what the schema asks and llguidance would not keep: checked at every
    subschema (`_subschemas`), a near miss of a keyword (`_misspelt`) and a number range
    llguidance compiles wrong (`_unkept_bounds`).

    Raises:
        GrammarError: naming `source` and what was found.
    """
    for node in _subschemas(schema):
        problem = _misspelt(node) or _unkept_bounds(node)
        if problem is not None:
            raise GrammarError(f"{source}: {problem}")


#: keywords whose value is a schema, a list of schemas, or a map of names to schemas
#: (a draft-7 ``dependencies`` entry may be a list of names instead: not a mapping, skipped)
_ONE = ("items", "additionalProperties", "not", "contains", "propertyNames", "if", "then",
        "else", "additionalItems", "unevaluatedItems", "unevaluatedProperties",
        "contentSchema")  # fmt: skip
_MANY = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_NAMED = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas",
          "dependencies")  # fmt: skip


def _subschemas(schema: Any) -> Iterator[Mapping[str, Any]]:
    """`schema` and every schema inside it, at the keyword positions that hold schemas:
    never the values of ``enum``, ``const``, ``default`` or ``examples``, which are data."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, Mapping):
            continue
        yield node
        for key in _ONE:
            stack.append(node.get(key))
        for key in _MANY:
            if isinstance(node.get(key), list):
                stack.extend(node[key])
        for key in _NAMED:
            if isinstance(node.get(key), Mapping):
                stack.extend(node[key].values())


def _unkept_bounds(node: Mapping[str, Any]) -> str | None:
    """A number range llguidance (1.9) compiles wrong, said, or None: an exclusiveMinimum
    E that is a whole number >= 0, with an upper bound (maximum or exclusiveMaximum) below
    E + 1 and no minimum above E, lets E itself through (``{"exclusiveMinimum": 2,
    "maximum": 2.5}`` accepts ``2``; found on 2026-12-06; wider ranges, negative and
    fractional bounds are kept exactly)."""
    low, floor = node.get("exclusiveMinimum"), node.get("minimum")
    highs = [node.get(k) for k in ("maximum", "exclusiveMaximum")]
    high = min((h for h in highs if _number(h)), default=None)
    if not (_number(low) and _number(high)) or low < 0 or not float(low).is_integer():
        return None
    if high >= low + 1 or (_number(floor) and floor > low):
        return None
    return (
        f"exclusiveMinimum {low} with an upper bound of {high} is refused: the grammar"
        f" engine (llguidance) would let {low:g} itself through; give a minimum just above"
        f" {low:g} instead"
    )


#: keywords that constrain what a schema matches (JSON Schema 2020-12 and draft 7): a key
#: a letter or two from one of these is taken for a typo of it, not for an annotation
_CONSTRAINING = (
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
    "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems",
    "uniqueItems", "maxContains", "minContains", "maxProperties", "minProperties", "required",
    "dependentRequired", "properties", "patternProperties", "additionalProperties",
    "propertyNames", "items", "prefixItems", "additionalItems", "contains", "allOf", "anyOf",
    "oneOf", "not", "format", "$ref", "$defs", "definitions",
)  # fmt: skip
#: every keyword JSON Schema (2020-12, draft 7) and OpenAPI define, annotations included
_KNOWN = frozenset(_CONSTRAINING) | {
    "$schema", "$id", "$anchor", "$dynamicRef", "$dynamicAnchor", "$vocabulary", "$comment",
    "dependencies", "dependentSchemas", "unevaluatedItems", "unevaluatedProperties", "if",
    "then", "else", "contentEncoding", "contentMediaType", "contentSchema", "title",
    "description", "default", "deprecated", "readOnly", "writeOnly", "examples", "nullable",
    "discriminator", "example", "strict", "name",
}  # fmt: skip
_LOWER = [k.lower() for k in _CONSTRAINING]


def _misspelt(node: Mapping[str, Any]) -> str | None:
    """A key of `node` that is a near miss of a constraining keyword (``patern``,
    ``minLenght``, ``requried``), said, or None: JSON Schema ignores keywords it does not
    define, so a typo would silently constrain nothing. Known keywords, annotations and
    ``x-`` extensions are not typos (and names of properties or definitions are keys of
    their maps, never of a subschema)."""
    for key in node:
        if not isinstance(key, str) or key in _KNOWN or key.startswith("x-"):
            continue
        near = difflib.get_close_matches(key.lower(), _LOWER, 1, 0.8)
        if near:
            keyword = _CONSTRAINING[_LOWER.index(near[0])]
            return f"unknown keyword {key!r} (did you mean {keyword}?): it would constrain nothing"
    return None


def _number(x: Any) -> TypeGuard[float]:
    return isinstance(x, int | float) and not isinstance(x, bool)


def spec_of(
    grammar: str | None = None,
    grammar_file: Path | str | None = None,
    json_schema: Any = None,
    json_schema_file: Path | str | None = None,
) -> GrammarSpec | None:
    """The spec of llama-cli's flags (`specgen.flags.SamplingFlags`' four fields): --grammar
    TEXT and --grammar-file FILE (GBNF, or Lark), -j/--json-schema JSON (or a dict or a
    pydantic model class) and --json-schema-file FILE; None when none is given.

    Raises:
        ConfigError: a file that cannot be read. GrammarError: a schema that is not JSON.
    """
    if grammar is not None:
        return GrammarSpec("gbnf", grammar, "--grammar")
    if grammar_file is not None:
        return GrammarSpec(
            "gbnf", _read(grammar_file, "--grammar-file"), f"--grammar-file {grammar_file}"
        )
    if json_schema is not None:
        return GrammarSpec.json_schema(json_schema, "--json-schema")
    if json_schema_file is not None:
        text = _read(json_schema_file, "--json-schema-file")
        return GrammarSpec.json_schema(text, f"--json-schema-file {json_schema_file}")
    return None


def _read(path: Path | str, flag: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{flag}: cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{flag}: {path} is not UTF-8 text") from None
