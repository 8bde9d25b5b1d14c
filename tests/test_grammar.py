"""specgen.grammar: specs, compilation and its errors, the tokenizer cache, matchers (masks,
forced tokens, rollback) on a fake vocabulary, and on SmolLM2's real one."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fakes import TextEngine

from specgen.errors import GrammarError
from specgen.grammar import compile_grammar, tokenizer_for
from specgen.grammarrows import GrammarProcessor
from specgen.grammarspec import GrammarSpec

# "a" or "ab" or "abc", then "}" : alternatives sharing prefixes
LARK = 'start: ("a" | "ab" | "abc") "}"'


def B(c: str) -> int:
    """The byte token spelling the character c (TextEngine's ids 8..263)."""
    return 8 + ord(c)


def allowed(m) -> set[int]:
    return {int(t) for t in np.flatnonzero(m.allowed())}


def _grammar(spec: GrammarSpec, engine: TextEngine | None = None):
    return compile_grammar(spec, tokenizer_for(engine or TextEngine()))


def test_a_matcher_masks_consumes_and_rolls_back() -> None:
    m = _grammar(GrammarSpec("lark", LARK)).matcher()
    # start: "a" (1) or "ab" (3); "abc" too begins with those
    assert allowed(m) == {1, 3, B("a")}
    assert m.single() is None
    assert m.sync([1])
    assert allowed(m) == {2, 6, B("b"), B("}")}  # "b" or "}"
    assert m.sync([3])  # rolled back from [1], then "ab"
    assert m.tokens == [3]
    assert allowed(m) == {4, 6, B("c"), B("}")}
    assert m.sync([3, 4])
    # "}" is forced: llguidance's mask then allows its one canonical token
    assert m.n_allowed() == 1 and m.single() == 6 and m.forced() == [6]
    assert m.sync([3, 4, B("}")]) and m.stopped and m.accepting
    assert allowed(m) == {0}  # nothing but the end
    assert m.single() == 0
    assert not m.sync([7])  # "x" is never allowed: the matcher stays at the start
    assert m.tokens == []


def test_a_refused_rollback_is_an_error_not_a_silent_drift() -> None:
    m = _grammar(GrammarSpec("lark", LARK)).matcher()
    assert m.sync([3, 4])

    class Refusing:  # llguidance's matcher, but its rollback answers False (an error state)
        def __init__(self, inner) -> None:
            self.inner = inner

        def rollback(self, n: int) -> bool:
            return False

        def __getattr__(self, name: str):
            return getattr(self.inner, name)

    m._m = Refusing(m._m)
    with pytest.raises(GrammarError):
        m.sync([1])  # the matcher would stand after "abc" while the text is "a"


def test_mask_sets_disallowed_tokens_to_minus_infinity() -> None:
    m = _grammar(GrammarSpec("lark", LARK)).matcher()
    row = np.arange(8, dtype=np.float32)
    out = m.mask(row)
    assert out.dtype == np.float32 and row[0] == 0.0  # a copy
    assert np.isneginf(np.delete(out, [1, 3])).all()
    assert out[1] == 1.0 and out[3] == 3.0


def test_the_processor_masks_each_row_after_the_block_so_far() -> None:
    proc = GrammarProcessor(_grammar(GrammarSpec("lark", LARK)), n_prompt=2)
    logits = np.zeros((3, 264), dtype=np.float32)

    def finite(r: np.ndarray) -> set[int]:
        return {int(t) for t in np.flatnonzero(np.isfinite(r))}

    rows = proc.rows(logits, [7, 7], [1, 2])  # prompt "xx", block "a" "b"
    assert [finite(r) for r in rows] == [
        {1, 3, B("a")}, {2, 6, B("b"), B("}")}, {4, 6, B("c"), B("}")},
    ]  # fmt: skip
    one = proc.row(logits[0], [7, 7, 3], [4])  # committed "ab", drafted "c"
    assert finite(one) == {6}
    assert proc.single([7, 7, 3, 4], []) == 6
    assert proc.forced([7, 7, 3, 4], []) == [6]
    assert proc.stopped([7, 7, 3, 4, 6])
    # a block token the grammar forbids: its row and those after keep the state before it
    rows = proc.rows(logits, [7, 7], [7, 1])
    assert [finite(r) for r in rows] == [{1, 3, B("a")}] * 3


def test_forced_strings_are_spelled_by_compute_ff_tokens() -> None:
    # "abc" is forced: compute_ff_tokens spells it ("ab" "c"); the mask allows the canonical
    # first token only, but the text could be spelled otherwise ("a" "b" "c") and the
    # matcher takes such a spelling when it is consumed
    g = _grammar(GrammarSpec("lark", 'start: "ab" "c"'))
    m = g.matcher()
    assert m.forced() == [3, 4]
    assert m.single() == 3
    assert m.sync([3, 4]) and m.stopped
    m.sync([])
    assert not m.allowed()[1]  # the mask: canonical tokens only...
    assert m.sync([1, 2, 4]) and m.stopped  # ...the matcher: any spelling


def test_json_object_regex_and_gbnf_compile() -> None:
    eng = TextEngine()
    m = _grammar(GrammarSpec("json_object"), eng).matcher()
    assert m.allowed()[5]  # "{"
    m = _grammar(GrammarSpec("regex", "(ab)+c"), eng).matcher()
    assert m.sync([3, 1, 2, 4]) and m.accepting
    m = _grammar(GrammarSpec("gbnf", 'root ::= "ab" | "x"'), eng).matcher()
    assert allowed(m) == {1, 3, 7, B("a"), B("x")}


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (GrammarSpec("lark", 'start: "a" | foo', "grammar"), ["grammar", "foo"]),
        (GrammarSpec("gbnf", 'root ::= "yes | no', "grammar"), ["grammar", "GBNF"]),
        (GrammarSpec("regex", "(ab", "--grammar"), ["--grammar"]),
        (GrammarSpec.json_schema({"type": "strin"}, "json_schema"), ["json_schema", "strin"]),
    ],
)
def test_a_bad_grammar_is_a_grammar_error_naming_it(spec: GrammarSpec, words: list[str]) -> None:
    with pytest.raises(GrammarError) as e:
        _grammar(spec)
    assert all(w in str(e.value) for w in words), str(e.value)
    assert "\n" not in str(e.value)


def test_schema_specs_are_canonical_and_take_pydantic_classes() -> None:
    a = GrammarSpec.json_schema('{"type": "object", "required": []}')
    b = GrammarSpec.json_schema({"type": "object", "required": []})
    assert a == b and hash(a) == hash(b)
    # keys keep their order: properties are generated in it
    assert GrammarSpec.json_schema({"required": [], "type": "object"}) != a

    class Model:  # duck-typed as pydantic: no pydantic import outside the server
        @staticmethod
        def model_json_schema() -> dict[str, object]:
            return {"type": "object", "required": []}

    assert GrammarSpec.json_schema(Model) == a
    with pytest.raises(GrammarError, match="not valid JSON"):
        GrammarSpec.json_schema("{")
    with pytest.raises(GrammarError, match="must be a JSON object"):
        GrammarSpec.json_schema("[1]")


def test_compilation_and_tokenizers_are_cached() -> None:
    eng = TextEngine()
    spec = GrammarSpec("lark", LARK)
    assert tokenizer_for(eng) is tokenizer_for(eng)
    assert compile_grammar(spec, tokenizer_for(eng)) is compile_grammar(spec, tokenizer_for(eng))


def test_on_smollm2s_vocabulary_fixed_separators_force_the_scaffolding(smol_pair) -> None:
    """A real BPE vocabulary (llama.cpp's, through llguidance's own builder): the JSON
    default's fixed separators force `{"name": ` and the key after `, `, and the complete
    object stops the grammar."""
    from specgen.llamacpp import EngineConfig, LlamaEngine

    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    with LlamaEngine(smol_pair[1], EngineConfig(n_ctx=256)) as eng:
        tok = tokenizer_for(eng)
        assert tok is tokenizer_for(eng.sequence(0))
        assert set(tok.eog) >= {eng.vocab.eos}
        m = compile_grammar(GrammarSpec.json_schema(schema), tok).matcher()
        ids = eng.tokenize(b'{"name": "Ana", "age": 31}', add_special=False)
        singles = 0
        for t in ids:
            assert m.allowed()[t]
            singles += m.single() is not None
            assert m.sync([*m.tokens, t])
        assert m.stopped
        assert singles >= 5
        assert set(np.flatnonzero(m.allowed())) == set(tok.eog)


def test_a_choice_is_a_regex_of_literals() -> None:
    """vLLM's guided_choice: every Rust-regex meta character is escaped, so a choice
    matches itself only (checked with Python's re, whose escapes agree on these)."""
    import re

    from specgen.server.structured import choice_spec, literal_regex

    odd = r"a.b*c+(d)|[e]{f}^$#&-~\g?"
    assert re.fullmatch(literal_regex(odd), odd) and not re.fullmatch(literal_regex(odd), "axb")
    spec = choice_spec(["yes", "no."], "guided_choice")
    assert (
        spec.kind == "regex"
        and re.fullmatch(spec.text, "no.")
        and not re.fullmatch(spec.text, "no!")
    )
    with pytest.raises(GrammarError, match="guided_choice"):
        choice_spec([], "guided_choice")


@pytest.mark.parametrize(
    ("bounds", "refused"),
    [
        ({"exclusiveMinimum": 2, "maximum": 2.5}, True),  # llguidance 1.9 lets 2 through
        ({"exclusiveMinimum": 2.0, "exclusiveMaximum": 2.5}, True),
        ({"exclusiveMinimum": 0, "maximum": 0.5}, True),
        ({"exclusiveMinimum": 2, "maximum": 3}, False),  # kept exactly: wider
        ({"exclusiveMinimum": -3, "maximum": -2.5}, False),  # negative: kept
        ({"exclusiveMinimum": 1.5, "maximum": 1.75}, False),  # fractional: kept
        ({"exclusiveMinimum": 5, "minimum": 5.1, "maximum": 5.99}, False),  # 5 out anyway
    ],
)
def test_number_ranges_llguidance_would_not_keep_are_refused(bounds, refused) -> None:
    """The refused ones are exactly those whose grammar accepts the excluded bound (a
    helper found {"b": 2} under exclusiveMinimum 2, maximum 2.5): the check below compiles
    the same bounds with the guard bypassed and asks the matcher."""
    nested = {"type": "object", "properties": {"b": {"type": "number", **bounds}}}
    if refused:
        with pytest.raises(GrammarError, match="exclusiveMinimum .* is refused"):
            GrammarSpec.json_schema(nested, "response_format")
    else:
        GrammarSpec.json_schema(nested, "response_format")
    # the guard is right: with it off, the bound itself is accepted exactly when refused
    low = bounds["exclusiveMinimum"]
    text = json.dumps({"b": int(low) if float(low).is_integer() else low}, separators=(", ", ": "))
    spec = GrammarSpec("json_schema", json.dumps(nested), "x")  # built without the guard
    m = _grammar(spec).matcher()
    assert (m.sync([B(c) for c in text]) and m.accepting) == refused


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"type": "string", "patern": "^a$"}, "pattern"),  # a helper's: it constrained nothing
        ({"type": "string", "minLenght": 3}, "minLength"),
        ({"type": "object", "requried": ["a"]}, "required"),
        ({"type": "integer", "maximun": 3}, "maximum"),
        ({"anyOf": [{"type": "string", "maxlength": 3}]}, "maxLength"),  # nested, any case
        ({"type": "object", "properties": {"a": {"typ": "string"}}}, "type"),
        ({"type": "array", "items": {"type": "string", "pattren": "a"}}, "pattern"),
    ],
)
def test_a_misspelt_constraining_keyword_is_refused(schema, keyword) -> None:
    with pytest.raises(GrammarError, match=f"did you mean {keyword}\\?"):
        GrammarSpec.json_schema(schema, "response_format")


@pytest.mark.parametrize(
    "schema",
    [
        # names are not keywords: a property or a definition may be called anything
        {"type": "object", "properties": {"patern": {"type": "string"}, "requried": {}}},
        {"$defs": {"typ": {"type": "string"}}, "$ref": "#/$defs/typ"},
        # values are not keywords, nor are annotations and extensions
        {"enum": [{"patern": 1}], "examples": [{"typ": 2}], "default": {"maximun": 3}},
        {"type": "string", "title": "t", "description": "d", "$comment": "c", "units": "cm"},
        {"type": "string", "x-guidance": {"whitespace_flexible": True}, "nullable": True},
    ],
)
def test_names_values_annotations_and_extensions_are_not_taken_for_typos(schema) -> None:
    assert GrammarSpec.json_schema(schema, "response_format").kind == "json_schema"


def test_a_state_that_allows_no_token_is_a_grammar_error_not_a_row_of_minus_inf() -> None:
    """A matcher state with nothing allowed, not even the end, would leave a row of -inf,
    which has no law to draw from (a numpy error deep in the sampler, a 500): it is the
    request's GrammarError instead (llguidance itself answers an empty language with the
    end alone, so the state is planted here)."""
    eng = TextEngine()
    m = compile_grammar(GrammarSpec("regex", "ab", "guided_regex"), tokenizer_for(eng)).matcher()
    row = np.zeros(eng.n_vocab, dtype=np.float32)
    assert np.isfinite(m.mask(row)).sum() == 1  # "a" alone
    m.allowed = lambda: np.zeros(eng.n_vocab, dtype=bool)  # type: ignore[method-assign]
    with pytest.raises(GrammarError, match="guided_regex: the grammar allows no token"):
        m.mask(row)


@pytest.mark.parametrize(
    "spec",
    [
        GrammarSpec.json_schema({"$ref": "#"}, "response_format"),
        GrammarSpec.json_schema({"anyOf": [{"$ref": "#"}]}, "response_format"),
        GrammarSpec.json_schema({"$defs": {"x": {"$ref": "#/$defs/x"}}, "$ref": "#/$defs/x"}),
        GrammarSpec("lark", 'start: a\na: a "x"', "grammar"),
    ],
)
def test_a_grammar_that_matches_no_text_is_refused_at_compile_time(spec) -> None:
    """llguidance compiles a language with no string in it and then allows the end alone:
    drawn, it ended the generation at once, an empty 200 whose text the schema does not
    match. It is the call's GrammarError instead, before any generation."""
    with pytest.raises(GrammarError, match=f"{spec.source}: the grammar allows no text"):
        _grammar(spec)


@pytest.mark.parametrize(
    "spec",
    [
        GrammarSpec.json_schema({"type": "object", "properties": {"a": {"$ref": "#"}}}),
        GrammarSpec("regex", ""),  # the empty string is a text: an empty language is not
        GrammarSpec("lark", 'start: ""'),
    ],
)
def test_recursive_schemas_and_the_empty_string_still_compile(spec) -> None:
    m = _grammar(spec).matcher()
    assert m.n_allowed() >= 1


def test_a_pattern_too_complex_for_the_lexer_is_refused_not_dropped() -> None:
    """llguidance gives up on ``(a{1000}){1000}``: alone it failed at the first token (a
    400 mid-generation), and as a JSON Schema's ``pattern`` it was dropped without a word
    (the server returned ``{"a": "528.0.0..."}``). Both are refused at compile time, naming
    the pattern; ordinary patterns, large character classes included, still compile."""
    tok = tokenizer_for(TextEngine())
    bad = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(a{1000}){1000}"}}}
    for spec in (
        GrammarSpec.json_schema(bad, "response_format"),
        GrammarSpec("regex", "(a{1000}){1000}", "guided_regex"),
    ):
        with pytest.raises(
            GrammarError, match=r"the pattern '\(a\{1000\}\)\{1000\}' is too complex"
        ):
            compile_grammar(spec, tok)
    fine = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^b{5}$"}}}
    for spec in (
        GrammarSpec.json_schema(fine, "ok"),
        GrammarSpec("regex", "[a-z]{1,60000}", "big"),
        GrammarSpec("regex", "(a+)+$", "nested"),
        GrammarSpec.json_schema({"properties": {"pattern": {"type": "string"}}}, "a key"),
    ):
        compile_grammar(spec, tok)


_DEEP = """
import json, sys
from fakes import TextEngine
from specgen.grammar import compile_grammar, tokenizer_for
from specgen.grammarspec import GrammarSpec
n = 4000
lark = "\\n".join(["start: r0", *(f'r{i}: "x" r{i + 1}' for i in range(n)), f'r{n}: "y"'])
defs = {f"d{i}": {"type": "array", "items": {"$ref": f"#/$defs/d{i + 1}"}} for i in range(n)}
defs[f"d{n}"] = {"type": "integer"}
tok = tokenizer_for(TextEngine())
for spec in (GrammarSpec("lark", lark), GrammarSpec.json_schema({"$defs": defs, "$ref": "#/$defs/d0"})):
    m = compile_grammar(spec, tok).matcher()
    print(m.n_allowed() > 0, flush=True)
n = 45000  # past llguidance's 65,535 symbols: its panic, said as such
lark = "\\n".join(["start: r0", *(f'r{i}: "x" r{i + 1}' for i in range(n)), f'r{n}: "y"'])
try:
    compile_grammar(GrammarSpec("lark", lark), tok)
except Exception as e:
    print(type(e).__name__, str(e)[:26].replace(" ", "_"), "<backtrace>" in str(e))
"""


def test_a_chain_of_thousands_of_rules_compiles_instead_of_killing_the_process() -> None:
    """A grammar whose rules chain 3,000 deep recursed past a thread's 8 MiB stack in
    llguidance's compile: SIGSEGV, a server with every request in it (2026-12-07). It is
    compiled on `specgen.deepstack`'s thread; in a child process, so that the old crash
    fails this test alone."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    tests = str(Path(__file__).parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", _DEEP], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done
    assert done.stdout.split() == [
        "True",
        "True",
        "GrammarError",
        "grammar:_too_large_(panic:",
        "False",
    ]


def test_a_gbnf_grammar_past_the_limits_is_refused_before_its_conversion() -> None:
    from specgen.grammarspec import GBNF_MAX_CHARS, GBNF_MAX_RULES

    rules = [f'r{i} ::= "x" r{i + 1}' for i in range(GBNF_MAX_RULES)]
    GrammarSpec("gbnf", "\n".join(rules))  # at the limit: taken
    with pytest.raises(GrammarError, match=f"{GBNF_MAX_RULES + 1} rules.*at most"):
        GrammarSpec("gbnf", "\n".join([*rules, 'root ::= "y"']), "grammar")
    with pytest.raises(GrammarError, match="at most"):
        GrammarSpec("gbnf", 'root ::= "' + "x" * GBNF_MAX_CHARS + '"')
    # Lark of any size is llguidance's own to read (no conversion)
    lark = "\n".join(["start: r0", *(f'r{i}: "x" r{i + 1}' for i in range(2000)), 'r2000: "y"'])
    assert compile_grammar(GrammarSpec("gbnf", lark), tokenizer_for(TextEngine())) is not None


def test_the_deep_stack_hands_back_results_and_errors_and_runs_nested_calls_at_once() -> None:
    from specgen.deepstack import on_deep_stack

    assert on_deep_stack(lambda: 6 * 7) == 42
    with pytest.raises(GrammarError, match="inside"):
        on_deep_stack(lambda: (_ for _ in ()).throw(GrammarError("inside")))
    assert on_deep_stack(lambda: on_deep_stack(lambda: "nested")) == "nested"
