"""Structured output over real HTTP with the official `openai` client on the SmolLM2 pair
(`specgen serve`): `chat.completions.parse` with a pydantic model at temperature 0 and
0.8, JSON mode, llama-server's `json_schema` and GBNF `grammar` fields, bad schemas and
grammars answered 400 before any slot is taken (and the next request served), and a
constrained request beside an unconstrained one in the same batch, the greedy one equal to
itself served alone."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from typing import Literal

import httpx
import openai
import pydantic
import pytest
from support.serve import Server, start


class City(pydantic.BaseModel):
    name: str
    country: str
    population: int
    kind: Literal["capital", "port", "other"]


@pytest.fixture(scope="module")
def server(smol_pair) -> Iterator[Server]:
    s = start(smol_pair, "-np", "2", "--draft-max", "4", "--temp", "0")
    yield s
    assert s.stop() == 0


ASK = [{"role": "user", "content": "Describe Paris as JSON."}]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_parse_returns_a_valid_instance(server: Server, temperature: float) -> None:
    r = server.client().chat.completions.parse(
        model=server.model_id,
        messages=ASK,
        response_format=City,
        temperature=temperature,
        seed=3,
        max_tokens=120,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice
    assert isinstance(choice.message.parsed, City)
    spec = r.model_extra["speculative"]  # type: ignore[index]
    assert spec["num_draft_tokens"] > 0


def test_json_mode_and_llama_servers_fields(server: Server) -> None:
    c = server.client()
    r = c.chat.completions.create(
        model=server.model_id, messages=ASK, response_format={"type": "json_object"},
        temperature=0, max_tokens=80,
    )  # fmt: skip
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content or ""), dict)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    body = {"prompt": "Is water wet? Answer in JSON: ", "max_tokens": 30, "temperature": 0}
    j = httpx.post(
        server.url + "/v1/completions", json={**body, "json_schema": schema}, timeout=120
    )
    assert j.status_code == 200, j.text
    assert json.loads(j.json()["choices"][0]["text"])["ok"] in (True, False)
    g = httpx.post(
        server.url + "/v1/completions",
        json={**body, "grammar": 'root ::= "yes." | "no."'},
        timeout=120,
    )
    assert g.status_code == 200, g.text
    assert g.json()["choices"][0]["text"] in ("yes.", "no.")
    assert g.json()["choices"][0]["finish_reason"] == "stop"
    # OpenAI's response_format on /v1/completions too (as vLLM serves it), not ignored
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    t = c.completions.create(
        model=server.model_id, prompt=body["prompt"], max_tokens=30, temperature=0,
        extra_body={"response_format": fmt},
    )  # fmt: skip
    assert json.loads(t.choices[0].text)["ok"] in (True, False)


@pytest.mark.parametrize(
    ("field", "value", "param"),
    [
        ("json_schema", {"type": "strin"}, "json_schema"),
        ("grammar", 'root ::= "yes', "grammar"),
        ("grammar", "start: foo", "grammar"),
        # past the GBNF limit: its conversion is quadratic Python that holds the GIL
        ("grammar", "\n".join(f'r{i} ::= "x" r{i + 1}' for i in range(1001)), "grammar"),
        # compiles, but matches no text: llguidance allowed the end alone (an empty 200)
        ("json_schema", {"$ref": "#"}, "json_schema"),
    ],
)
def test_bad_schema_or_grammar_is_400_and_the_next_request_succeeds(
    server: Server, field: str, value: object, param: str
) -> None:
    body = {"prompt": "Hi", "max_tokens": 4, "temperature": 0}
    r = httpx.post(server.url + "/v1/completions", json={**body, field: value}, timeout=120)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and param in err["message"], err
    ok = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
    assert ok.status_code == 200


def test_a_bad_response_format_schema_through_the_client_is_a_400(server: Server) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        server.client().chat.completions.create(
            model=server.model_id, messages=ASK, max_tokens=4,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object", "properties": 3}},
            },
        )  # fmt: skip
    assert "response_format.json_schema.schema" in str(e.value)
    both = httpx.post(
        server.url + "/v1/completions",
        json={"prompt": "Hi", "grammar": 'root ::= "a"', "json_schema": {"type": "object"}},
        timeout=120,
    )
    assert both.status_code == 400 and "give one" in both.json()["error"]["message"]


def test_constrained_and_unconstrained_requests_share_a_batch(server: Server) -> None:
    """A greedy schema request beside a sampled free-text one: the greedy one's answer is
    the same as served alone."""
    c = server.client()

    def constrained() -> str:
        r = c.chat.completions.create(
            model=server.model_id, messages=ASK, temperature=0, max_tokens=60,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "city", "schema": City.model_json_schema()}},
        )  # fmt: skip
        return r.choices[0].message.content or ""

    alone = constrained()
    out: dict[str, str] = {}

    def free() -> None:
        r = c.chat.completions.create(
            model=server.model_id, messages=[{"role": "user", "content": "Tell me a story."}],
            temperature=0.8, max_tokens=60, seed=1,
        )  # fmt: skip
        out["free"] = r.choices[0].message.content or ""

    t = threading.Thread(target=free)
    t.start()
    together = constrained()
    t.join()
    assert together == alone
    assert out["free"]


def test_a_regex_the_lexer_gives_up_on_fails_its_own_request_only(server: Server) -> None:
    """A regex llguidance's lexer gives up on (``b(a{1000}){1000}``), sent again and again
    beside other requests: each of its requests gets a 400 invalid_grammar in one short
    line (now at admission, `specgen.grammar._probe_patterns`), and the requests beside it
    are served whole. Before, it failed mid-generation and the failure escaped the step:
    every request in flight got a 500 carrying its grammar and llguidance's state dump.
    (A failure that still comes mid-generation fails its request alone:
    test_scheduler's test_one_requests_drafting_failure_fails_it_alone.)"""
    bad = {"prompt": "hi", "max_tokens": 4, "guided_regex": "b(a{1000}){1000}"}
    done = threading.Event()
    refused: list[httpx.Response] = []

    def attacker() -> None:
        while not done.is_set():
            refused.append(httpx.post(server.url + "/v1/completions", json=bad, timeout=120))

    t = threading.Thread(target=attacker)
    t.start()
    try:
        served = [
            httpx.post(
                server.url + "/v1/completions",
                timeout=120,
                json={
                    "prompt": "Once upon a time",
                    "max_tokens": 32,
                    "temperature": 0.8,
                    "seed": i,
                },
            )  # fmt: skip
            for i in range(3)
        ]
    finally:
        done.set()
        t.join()
    assert [r.status_code for r in served] == [200] * 3, served[0].text
    assert all(r.json()["choices"][0]["finish_reason"] == "length" for r in served)
    assert refused and {r.status_code for r in refused} == {400}
    err = refused[0].json()["error"]
    assert err["code"] == "invalid_grammar" and "<state>" not in err["message"]
    assert len(err["message"]) < 400 and "\n" not in err["message"]


# -- tool calls ----------------------------------------------------------------------------

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
WHAT = [{"role": "user", "content": "What is the weather in Paris?"}]


def check_call(call) -> dict:
    assert call.type == "function" and call.id and call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert isinstance(args["city"], str) and args["unit"] in ("celsius", "fahrenheit")
    return args


def test_a_named_tool_choice_returns_a_valid_call(server: Server) -> None:
    r = server.client().chat.completions.create(
        model=server.model_id, messages=WHAT, tools=[WEATHER, TIME], tool_choice=NAMED,
        temperature=0, max_tokens=80,
    )  # fmt: skip
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None and len(choice.message.tool_calls or []) == 1
    check_call(choice.message.tool_calls[0])  # type: ignore[index]


def test_a_named_tool_choice_streams_delta_tool_calls(server: Server) -> None:
    stream = server.client().chat.completions.create(
        model=server.model_id, messages=WHAT, tools=[WEATHER], tool_choice=NAMED,
        temperature=0.8, seed=2, max_tokens=80, stream=True,
    )  # fmt: skip
    calls, finish = [], None
    for chunk in stream:
        for c in chunk.choices:
            calls += c.delta.tool_calls or []
            finish = c.finish_reason or finish
    assert finish == "tool_calls" and len(calls) == 1
    check_call(calls[0])


def test_required_returns_a_valid_call(server: Server) -> None:
    # (a tool result sent back through the template: tests/test_tools_server.py)
    c = server.client()
    r = c.chat.completions.create(
        model=server.model_id, messages=WHAT, tools=[WEATHER], tool_choice="required",
        temperature=0, max_tokens=80,
    )  # fmt: skip
    check_call(r.choices[0].message.tool_calls[0])  # type: ignore[index]


def test_tool_choice_auto_and_unknown_names_are_400(server: Server) -> None:
    """SmolLM2's own template (ChatML) renders no tools and has no known call syntax:
    auto, the default with tools, is a 400 that says what to send, and the next request
    is served."""
    c = server.client()
    with pytest.raises(openai.BadRequestError, match="Hermes/Qwen.*required"):
        c.chat.completions.create(model=server.model_id, messages=WHAT, tools=[WEATHER])
    ok = c.chat.completions.create(
        model=server.model_id, messages=WHAT, tools=[WEATHER], tool_choice="none", max_tokens=4
    )
    assert ok.choices[0].message.content is not None
    with pytest.raises(openai.BadRequestError, match="not among the tools"):
        c.chat.completions.create(
            model=server.model_id, messages=WHAT, tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )  # fmt: skip


def test_vllm_s_structured_output_fields_constrain_the_output(server: Server) -> None:
    """Clients written for vLLM send guided_json, guided_regex, guided_choice,
    guided_grammar or structured_outputs in extra_body: each constrains the output (they
    were accepted and ignored), and a second constraint beside one is a 400."""
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    choices = ["yes (sure)", "no.", "a+b"]  # regex meta characters are literal
    c = server.client()

    def text(extra: dict) -> str:
        r = c.completions.create(
            model=server.model_id, prompt="Is water wet? Answer: ", max_tokens=24,
            temperature=0.8, seed=3, extra_body=extra,
        )  # fmt: skip
        return r.choices[0].text

    assert json.loads(text({"guided_json": schema}))["ok"] in (True, False)
    assert json.loads(text({"structured_outputs": {"json": schema}}))["ok"] in (True, False)
    assert text({"guided_choice": choices}) in choices
    assert text({"structured_outputs": {"choice": choices}}) in choices
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", text({"guided_regex": "[0-9]{3}-[a-z]{2}"}))
    assert text({"guided_grammar": 'root ::= "up" | "down"'}) in ("up", "down")
    chat = c.chat.completions.create(
        model=server.model_id, messages=ASK, max_tokens=24, temperature=0,
        extra_body={"guided_choice": choices},
    )  # fmt: skip
    assert chat.choices[0].message.content in choices
    for body in (
        {"guided_choice": ["a"], "grammar": 'root ::= "a"'},
        {"structured_outputs": {"regex": "a", "whitespace_pattern": " "}},  # not served
        {"guided_whitespace_pattern": " "},
        {"guided_choice": []},
    ):
        r = httpx.post(
            server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 4, **body},
            timeout=120,
        )  # fmt: skip
        assert r.status_code == 400, (body, r.text)


def test_a_tool_whose_parameters_match_no_text_is_a_400(server: Server) -> None:
    """Parameters defined only by themselves (``{"$ref": "#"}``, rebased into the
    parameters) match no arguments: a 400, not an empty or failed call, naming the tool
    where one may be called (``tools[1]``: the named one), all of them where several may.
    A schema llguidance refuses to compile is said in its own words and names its tool
    among several (the message had listed the calls' grammar, and named them all)."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"$ref": "#"}}}
    other = {"type": "function", "function": {"name": "g", "parameters": {"type": "object"}}}
    for tools, choice, param in (
        ([other, tool], {"type": "function", "function": {"name": "f"}}, "tools[1]"),
        ([tool], "required", "tools[0]"),
        ([tool, other], "required", "tools[]"),
    ):
        with pytest.raises(openai.BadRequestError, match="allows no text") as e:
            server.client().chat.completions.create(
                model=server.model_id, messages=WHAT, tools=tools, tool_choice=choice,
                max_tokens=20,
            )  # fmt: skip
        assert e.value.status_code == 400
        assert isinstance(e.value.body, dict)
        assert e.value.body["param"] == f"{param}.function.parameters", e.value.body
    bogus = {"type": "object", "properties": {"d": {"type": "string", "format": "bogus"}}}
    bad = {"type": "function", "function": {"name": "h", "parameters": bogus}}
    with pytest.raises(openai.BadRequestError, match="Unknown format: bogus") as e:
        server.client().chat.completions.create(
            model=server.model_id, messages=WHAT, tools=[other, bad], tool_choice="required",
            max_tokens=20,
        )  # fmt: skip
    assert isinstance(e.value.body, dict)
    assert e.value.body["param"] == "tools[1].function.parameters", e.value.body
    assert "start: calls" not in e.value.body["message"], e.value.body
