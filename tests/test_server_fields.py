"""No request field silently ignored: the table of `specgen.server.fields` against OpenAI's
request types and the pydantic request models, and every refused field's 400 over real
HTTP through the official `openai` client (the scripted scheduler of `fake_server` behind
the real routes)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import fake_server as fake
import openai
import pytest
from openai.types import completion_create_params as text_params
from openai.types.chat import completion_create_params as chat_params
from support.served import USER, Served, serving

from specgen.server.fields import FIELDS, Status, refusal
from specgen.server.schemas import ChatCompletionRequest, CompletionRequest, _Generation

OPENAI = {
    "chat": set(chat_params.CompletionCreateParamsBase.__annotations__) | {"stream"},
    "completions": set(text_params.CompletionCreateParamsBase.__annotations__) | {"stream"},
}
MODELS: dict[str, type[_Generation]] = {
    "chat": ChatCompletionRequest,
    "completions": CompletionRequest,
}


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_every_openai_field_has_an_entry_for_its_route(route: str) -> None:
    missing = sorted(f for f in OPENAI[route] if f not in FIELDS or route not in FIELDS[f].routes)
    assert missing == [], f"OpenAI's {route} fields with no entry in specgen.server.fields"


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_the_honoured_entries_are_exactly_the_request_models_fields(route: str) -> None:
    honoured = {
        name for name, f in FIELDS.items() if f.status is Status.HONOURED and route in f.routes
    }
    assert honoured == set(MODELS[route].model_fields)


def test_refused_fields_are_no_model_fields_and_openai_ones_are_named_by_openai() -> None:
    every_openai = OPENAI["chat"] | OPENAI["completions"]
    for name, f in FIELDS.items():
        if f.status is not Status.HONOURED:
            assert all(name not in m.model_fields for m in MODELS.values()), name
        if f.origin == "openai":
            assert name in every_openai, f"{name} is no OpenAI field: origin llama-server?"
        assert None in f.inert, f"{name}: null must always mean 'not asked'"


def test_inert_values_compare_by_type_as_well() -> None:
    assert refusal({"post_sampling_probs": False}, "chat") is None
    found = refusal({"post_sampling_probs": 0}, "completions")  # 0 is no boolean
    assert found is not None and found[0] == "post_sampling_probs"
    assert refusal({"response_format": {"type": "text"}}, "chat") is None
    assert refusal({"echo": True}, "chat") is not None  # a completions field: refused, not ignored
    assert refusal(["not", "a", "dict"], "chat") is None


def test_an_unknown_field_near_one_that_changes_the_output_is_refused_naming_both() -> None:
    for name, near in [("temprature", "temperature"), ("maxtokens", "max_tokens"),
                       ("streaming", "stream"), ("top_pp", "top_p")]:  # fmt: skip
        found = refusal({"user": "u", name: 1}, "chat")
        assert found is not None and found[0] == name, name
        assert f"unknown field {name}: did you mean {near}?" in found[1]
    # far from every field, or near one that changes nothing: a client's extra, ignored
    assert refusal({"a_field_nobody_defined": 1, "metadata2": {}}, "completions") is None
    # llama-server's parse_tool_calls is a field of its own, not a misspelt parallel_tool_calls
    assert refusal({"parse_tool_calls": True}, "chat") is None


def test_other_apis_names_point_to_the_field_served() -> None:
    # Anthropic's stop_sequences was ignored (a name near none this server knew), and
    # llama.cpp's penalty_last_n was taken for a misspelt dry_penalty_last_n
    found = refusal({"stop_sequences": ["there"]}, "completions")
    assert found is not None and found[0] == "stop_sequences" and "send stop" in found[1]
    assert refusal({"stop_sequences": ["there"], "stop": ["there"]}, "completions") is None
    found = refusal({"penalty_last_n": 8}, "completions")
    assert found is not None and "send repeat_last_n" in found[1], found
    found = refusal({"max_tokens_to_sample": 9, "max_tokens": 8}, "chat")
    assert found is not None and found[0] == "max_tokens_to_sample"


# realistic values for the fields clients send most; the others get a bare 7
ACTIVE: dict[str, Any] = {
    "logit_bias": {"7042": -100},
    "frequency_penalty": 0.5,
    "presence_penalty": 0.5,
    "repeat_penalty": 1.1,
    "logprobs": True,
    "top_logprobs": 3,
    "response_format": {"type": "json_object"},
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
    "tool_choice": "auto",
    "audio": {"voice": "alloy", "format": "wav"},
    "modalities": ["text", "audio"],
    "prediction": {"type": "content", "content": "hello"},
    "grammar": 'root ::= "yes"',
    "json_schema": {"type": "object"},
    "options": {"temperature": 0.2},  # Ollama's, which had been ignored
}

REFUSED = sorted(
    (route, name) for name, f in FIELDS.items() if f.status is Status.REFUSED for route in f.routes
)


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with serving() as s:
        yield s


def _create(client: openai.OpenAI, route: str, extra: dict[str, Any]) -> Any:
    if route == "chat":
        return client.chat.completions.create(
            model="m",
            messages=USER,  # type: ignore[arg-type]
            max_tokens=4,
            extra_body=extra,
        )
    return client.completions.create(model="m", prompt="Hi", max_tokens=4, extra_body=extra)


@pytest.mark.parametrize(("route", "name"), REFUSED, ids=[f"{r}-{n}" for r, n in REFUSED])
def test_each_refused_field_gets_400_naming_it_and_the_next_request_succeeds(
    served: Served, route: str, name: str
) -> None:
    value = ACTIVE.get(name, 7)
    if route == "completions" and name == "logprobs":
        value = 2  # the completions route's logprobs is a count
    # the fields its inert rules read, each asking for something other than it repeats:
    # a sampler's switch on, a field it could be an alias of given another value
    extra = {name: value, **{o: 8 for w in FIELDS[name].inert_when for o in w.reads}}
    client = served.client()
    with pytest.raises(openai.BadRequestError) as caught:
        _create(client, route, extra)
    err = caught.value.body
    assert isinstance(err, dict)
    assert err["param"] == name and err["type"] == "invalid_request_error"
    assert err["message"].startswith(f"{name} is not supported by this server: ")
    assert "values accepted: null" in err["message"]
    assert _create(client, route, {}).choices[0].finish_reason is not None


IGNORED = [name for name, f in FIELDS.items() if f.status is Status.IGNORED]


def test_fields_that_change_nothing_unknown_ones_and_inert_values_are_accepted(
    served: Served,
) -> None:
    chat: dict[str, Any] = {n: "x" for n in IGNORED if "chat" in FIELDS[n].routes}
    chat |= {"metadata": {"k": "v"}, "store": False, "parallel_tool_calls": True}
    chat |= {"a_field_nobody_defined": [1, 2], "tools": [], "response_format": {"type": "text"}}
    chat |= {"logprobs": False, "logit_bias": {}, "presence_penalty": 0.0, "n_probs": 0}
    chat |= {"chat_template_kwargs": {}}  # Open WebUI sends it empty
    client = served.client()
    assert _create(client, "chat", chat).choices[0].message.content
    text: dict[str, Any] = {n: "x" for n in IGNORED if "completions" in FIELDS[n].routes}
    text |= {"echo": False, "suffix": "", "best_of": 1, "repeat_penalty": 1.0}
    assert _create(client, "completions", text).choices[0].text


#: fields of one route sent to the other, with values that ask for something
CROSS = [
    ("completions", "tools", [{"type": "function", "function": {"name": "f"}}]),
    ("completions", "messages", USER),
    ("completions", "top_logprobs", 2),
    ("chat", "prompt", "Hi"),
    ("chat", "echo", True),
]


@pytest.mark.parametrize(("route", "name", "value"), CROSS, ids=[f"{r}-{n}" for r, n, _ in CROSS])
def test_a_field_of_the_other_route_is_refused_not_ignored(
    served: Served, route: str, name: str, value: Any
) -> None:
    client = served.client()
    with pytest.raises(openai.BadRequestError) as caught:
        _create(client, route, {name: value})
    err = caught.value.body
    assert isinstance(err, dict) and err["param"] == name
    assert "not of this route" in err["message"]
    # inert values and fields that change nothing stay accepted on either route
    assert refusal({name: None}, route) is None  # type: ignore[arg-type]
    assert refusal({"user": "u"}, route) is None  # type: ignore[arg-type]
    assert _create(client, route, {}).choices[0].finish_reason is not None


def test_a_misspelt_setting_is_a_400_over_http(served: Served) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        _create(served.client(), "chat", {"temprature": 0})
    err = caught.value.body
    assert isinstance(err, dict) and err["param"] == "temprature"
    assert "did you mean temperature?" in err["message"]


@pytest.mark.parametrize(
    ("body", "param", "near"),
    [
        ({"messages": [{"role": "user", "contnt": "x"}]}, "messages[0]", "content"),
        (
            {"messages": [{"role": "user", "content": "x"}], "tools": [
                {"type": "function", "function": {"name": "f", "paramters": {}}}]},
            "tools[0].function",
            "parameters",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "response_format": {
                "type": "json_schema", "json_schema": {"name": "s", "shema": {}}}},
            "response_format.json_schema",
            "schema",
        ),
    ],
)  # fmt: skip
def test_a_misspelt_key_inside_the_body_is_a_400_naming_both(
    served: Served, body: dict, param: str, near: str
) -> None:
    """A nested key near one the server reads: a tool whose ``paramters`` were ignored
    took no arguments, a format whose ``shema`` was ignored constrained to any object."""
    r = served.post("/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and f"did you mean {near!r}?" in err["message"]
    keys = {"reasoning_content": "r", "refusal": None, "annotations": []}  # far from any
    fine = {"messages": [{"role": "user", "content": "x", **keys}]}
    assert served.post("/v1/chat/completions", fine).status_code == 200


def test_a_tool_call_answer_says_content_null_as_openai_does() -> None:
    """Strict clients (JS, Rust) read `message.content` as a key that is always there: null
    beside tool calls, not absent, while other fields left None stay out of the JSON."""
    from specgen.server.schemas import AssistantMessage, ChatChoice, ChatCompletion

    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    message = AssistantMessage(content=None, tool_calls=[call])
    body = ChatCompletion(
        id="x",
        created=0,
        model="m",
        choices=[ChatChoice(message=message, finish_reason="tool_calls")],
    ).wire()
    assert body["choices"][0]["message"] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [call],
    }
    assert "usage" not in body and "error" not in body


def test_chat_template_kwargs_reach_the_template_as_llama_servers_do(served: Served) -> None:
    """llama-server's `chat_template_kwargs` are more variables for the chat template (Qwen 3's
    `enable_thinking`, which Open WebUI sends); the ones the server sets itself are a 400."""
    ok = served.post(
        "/v1/chat/completions",
        {"messages": USER, "chat_template_kwargs": {"enable_thinking": False}},
    )
    assert ok.status_code == 200
    assert served.sched.submitted[-1].prompt == fake.tokenize(
        "<enable_thinking=False><user>Hi there\n<assistant>"
    )
    bad = served.post(
        "/v1/chat/completions", {"messages": USER, "chat_template_kwargs": {"messages": []}}
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "chat_template_kwargs"
    assert "messages: set by the server" in bad.json()["error"]["message"]


def test_two_tools_of_one_name_are_refused(served: Served) -> None:
    # a call names its tool: with two of a name the client could not tell which was meant
    tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
    other = {"type": "function", "function": {"name": "g", "parameters": {}}}
    body = {"messages": USER, "tools": [tool, other, tool], "tool_choice": "required"}
    bad = served.post("/v1/chat/completions", body)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tools"
    assert "f given twice" in bad.json()["error"]["message"]
    assert ChatCompletionRequest.model_validate(body | {"tools": [tool, other]}).tools


def test_a_real_template_reads_the_variables_given() -> None:
    from specgen.llamacpp.templates import compile_chat_template

    render = compile_chat_template(
        "{% if enable_thinking is defined and not enable_thinking %}/no_think {% endif %}"
        "{{ messages[0]['content'] }}",
        "<s>",
        "</s>",
    )
    said = [{"role": "user", "content": "hi"}]
    assert render(said) == "hi"
    assert render(said, None, {"enable_thinking": False}) == "/no_think hi"


def test_usage_in_every_chunk_is_refused_and_usage_once_is_served(served: Served) -> None:
    """vLLM's ``stream_options.continuous_usage_stats`` asks for a usage in every chunk;
    the server sends it once, last, so the request is refused rather than answered
    without it."""
    body: dict[str, Any] = {"messages": USER, "stream": True, "max_tokens": 4}
    every = {"include_usage": True, "continuous_usage_stats": True}
    r = served.post("/v1/chat/completions", {**body, "stream_options": every})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "stream_options" and "continuous_usage_stats" in err["message"]
    once = {"include_usage": True, "continuous_usage_stats": False}
    unstreamed = {**body, "stream": False, "stream_options": once}  # OpenAI's 400 too
    r = served.post("/v1/chat/completions", unstreamed)
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options", r.text
    r = served.post("/v1/chat/completions", {**body, "stream_options": once})
    assert r.status_code == 200
    data = [
        line[len("data:") :].strip() for line in r.text.splitlines() if line.startswith("data:")
    ]
    chunks = [json.loads(d) for d in data if d != "[DONE]"]
    assert [c["usage"] is not None for c in chunks if "usage" in c][-1:] == [True]


@pytest.mark.parametrize(
    ("tool_choice", "said", "param"),
    [
        ({"function": {"name": "f"}}, "tool_choice.type is required", "tool_choice.type"),
        ({"type": "function"}, "tool_choice.function is required", "tool_choice.function"),
        (
            {"type": "function", "function": {"name": 3}},
            "tool_choice.function.name: Input should be a valid string",
            "tool_choice.function.name",
        ),
        ("sometimes", "tool_choice: Input should be 'none', 'auto' or 'required'", "tool_choice"),
    ],
)
def test_an_object_in_a_union_is_refused_for_what_is_wrong_inside_it(
    tool_choice, said, param
) -> None:
    """A `tool_choice` object was refused with the message of the union's strings
    ("should be 'none', 'auto' or 'required'"), naming neither the object form nor the
    field it lacked."""
    from pydantic import ValidationError

    from specgen.server.invalid import validation_error
    from specgen.server.schemas import ChatCompletionRequest

    body = {"messages": USER, "tools": [{"type": "function", "function": {"name": "f"}}]}
    with pytest.raises(ValidationError) as e:
        ChatCompletionRequest.model_validate({**body, "tool_choice": tool_choice})
    assert validation_error(e.value) == (said, param)
