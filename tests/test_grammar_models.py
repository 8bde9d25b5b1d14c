"""Grammars on real models: greedy speculative output under a JSON schema equals ordinary
constrained decoding (`--draft none`) on the tiny pair (CLI, a real process) and on the
SmolLM2 pair (Python API, a pydantic model class), the flags' refusals, and forced tokens
counted as their own source."""

from __future__ import annotations

import json
from pathlib import Path

import pydantic
import pytest
from support.cli import run_json, specgen

import specgen as sg
from specgen.errors import ConfigError, GrammarError

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "kind": {"enum": ["cat", "mat", "the"]},
        "n": {"type": "integer"},
    },
    "required": ["name", "kind", "n"],
    "additionalProperties": False,
}


def test_run_json_schema_greedy_equals_draft_none(tiny_target: Path, tiny_draft: Path):
    args = ["-n", "40", "--temp", "0", "-c", "256", "--json-schema", json.dumps(SCHEMA), "the"]
    spec = run_json("-m", str(tiny_target), "-md", str(tiny_draft), "--draft-max", "4", *args)
    base = run_json("-m", str(tiny_target), "-md", "none", *args)
    assert spec["tokens"] == base["tokens"]
    text = base["text"]
    assert text.startswith('{"name": "')
    if base["finish_reason"] == "stop":
        assert json.loads(text)["kind"] in ("cat", "mat", "the")
    assert spec["stats"]["n_drafted_by"].get("grammar", 0) > 0  # forced scaffolding


def test_run_grammar_file_and_the_flags_refusals(tiny_target: Path, tmp_path: Path):
    g = tmp_path / "yn.gbnf"
    g.write_text('root ::= "yes." | "no."\n')
    out = run_json(
        "-m", str(tiny_target), "-md", "none", "-c", "256", "--grammar-file", str(g), "hi"
    )
    assert out["text"] in ("yes.", "no.") and out["finish_reason"] == "stop"
    r = specgen("run", "-m", str(tiny_target), "--grammar", "x", "-j", "{}", "hi")
    assert r.returncode != 0 and b"give one" in r.stderr
    r = specgen("run", "-m", str(tiny_target), "-md", "none", "--grammar", 'root ::= "a', "hi")
    assert r.returncode != 0 and b"--grammar" in r.stderr and len(r.stderr.splitlines()) == 1


def test_a_constrained_output_cut_by_n_is_said_on_stderr(tiny_target: Path, tmp_path: Path):
    # plain output names no finish reason: a schema's JSON cut by -n looked complete enough
    # to parse, and failed (a sampled integer ran on until -n, 2026-12-07)
    args = ["run", "-m", str(tiny_target), "-md", "none", "-c", "256", "--temp", "0"]
    cut = specgen(*args, "-n", "3", "--json-schema", json.dumps(SCHEMA), "the")
    assert cut.returncode == 0 and cut.stdout.startswith(b'{"'), cut.stderr
    assert b"-n 3 ended the output before the grammar's end" in cut.stderr, cut.stderr
    assert b"maxLength" in cut.stderr  # a schema's advice
    whole = specgen(*args, "-n", "16", "--grammar", 'root ::= "yes." | "no."', "hi")
    assert whole.stdout in (b"yes.", b"no.") and b"grammar's end" not in whole.stderr
    free = specgen(*args, "-n", "3", "the")  # no constraint: -n is the asked-for end
    assert free.returncode == 0 and b"grammar's end" not in free.stderr
    # cut where the grammar could end too: complete under it, said as a note (the warning
    # said "does not complete it" of a text that did); no schema, no schema's advice
    digits = specgen(*args, "-n", "3", "--grammar", "root ::= [0-9]+", "hi")  # "180"
    assert b"warning" not in digits.stderr, digits.stderr
    assert b"the text is complete under it" in digits.stderr, digits.stderr
    words = specgen(*args, "-n", "3", "--grammar", 'root ::= ("the " | "cat " | "mat ")+', "the")
    assert b"before the grammar's end" in words.stderr, words.stderr  # "the", no space yet
    assert b"maxLength" not in words.stderr


class Person(pydantic.BaseModel):
    name: str
    age: int
    city: str


def test_smollm2_greedy_schema_speculative_equals_ordinary(smol_pair):
    target, draft = smol_pair
    prompt = (
        "<|im_start|>user\nGive a person as JSON with name, age and city.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    with (
        sg.load(target, draft, ctx_size=512) as spec,
        sg.load(target, "none", ctx_size=512) as plain,
    ):
        a = spec.generate(prompt, json_schema=Person, temperature=0, max_tokens=60, draft_max=6)
        b = plain.generate(prompt, json_schema=Person, temperature=0, max_tokens=60)
        assert a.tokens == b.tokens
        assert a.finish in ("stop", "eos")  # complete, or EOS drawn in the same round
        Person.model_validate_json(a.text)
        assert a.stats.n_drafted_by.get("grammar", 0) > 0
        with pytest.raises(GrammarError, match="json_schema"):
            plain.generate(prompt, json_schema={"type": "strin"}, max_tokens=4)
        with pytest.raises(ConfigError, match="give one"):
            plain.generate(prompt, json_schema={}, grammar="root ::= 'a'", max_tokens=4)


def test_a_forced_end_is_the_grammars_stop_and_a_chosen_one_the_models_eos(
    tiny_target: Path, tiny_draft: Path
) -> None:
    """An end-of-generation token the grammar forces (the only token it allows) ends with
    "stop", as a grammar complete after its last token does, speculative or not; one the
    model draws where the grammar could go on ends with "eos". A grammar of the empty text
    is forced from the start (llguidance does not report it stopped before a token)."""
    for draft in ("none", str(tiny_draft)):
        with sg.load(tiny_target, draft, ctx_size=256) as pair:
            for temp in (0, 1.5):
                for grammar in ("root ::= ", 'root ::= "yes" | "no"', 'root ::= "a" | ""'):
                    r = pair.generate("the cat", grammar=grammar, max_tokens=8,
                                      temperature=temp, seed=3)  # fmt: skip
                    assert r.text in ("", "yes", "no", "a"), r
                    # "" under the last grammar could go on ("a"): the model's end
                    chosen = grammar.endswith('| ""') and r.text == ""
                    assert r.finish == ("eos" if chosen else "stop"), (grammar, draft, temp)


def test_the_empty_grammar_stops_where_the_model_has_several_end_tokens(smol_pair) -> None:
    """SmolLM2 ends with <|endoftext|> or <|im_end|>: the empty text's grammar allows both,
    so no single token is forced, yet the end is the grammar's ("stop"; it said "eos")."""
    with sg.load(*smol_pair, ctx_size=256) as pair:
        for draft_max in (0, 4):
            how = {"ordinary": True} if draft_max == 0 else {"draft_max": draft_max}
            r = pair.generate("Hi", grammar="root ::= ", max_tokens=4, temperature=0, **how)
            assert (r.text, r.finish) == ("", "stop"), (draft_max, r)
