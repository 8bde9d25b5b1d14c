"""OpenAI's Responses API (``POST /v1/responses``) over real HTTP with the official `openai`
client, on the scripted scheduler of `fake_server`: a response is the chat answer to the
same request (its text, usage and statistics), streamed as ``response.*`` events that add
up to the whole response; every field of the installed client's ``ResponseCreateParams``
has a rule, and what is not honoured is refused naming the field. The translation of the
input into chat messages is checked exactly. On real models: test_responses_models.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import fake_server as fake
import httpx
import openai
import pydantic
import pytest
from openai.types.responses import (
    Response,
    ResponseStreamEvent,
    easy_input_message_param,
    function_tool_param,
    response_create_params,
    response_function_tool_call_param,
    response_input_item_param,
    response_output_message_param,
)
from support.served import Served, serving

from specgen.server.respbody import Built
from specgen.server.resprequest import (
    CHAT_NAMES,
    RULES,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    MessageItem,
    ResponsesRequest,
    renamed,
)

EVENT: pydantic.TypeAdapter = pydantic.TypeAdapter(ResponseStreamEvent)


@pytest.fixture
def served() -> Iterator[Served]:
    with serving() as s:
        yield s


def refusal(served: Served, body: dict, status: int = 400) -> dict:
    r = served.post("/v1/responses", body)
    assert r.status_code == status, r.text
    return r.json()["error"]


def events_of(served: Served, body: dict) -> list[dict]:
    with httpx.stream("POST", served.url + "/v1/responses", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        lines = list(r.iter_lines())
    kinds = [x.removeprefix("event: ") for x in lines if x.startswith("event: ")]
    events = [json.loads(x.removeprefix("data: ")) for x in lines if x.startswith("data: ")]
    assert kinds == [e["type"] for e in events]  # each event named as its type
    return events


def test_every_field_of_the_clients_request_type_has_a_rule() -> None:
    fields = set(response_create_params.ResponseCreateParamsBase.__annotations__) | {"stream"}
    assert fields == set(RULES)


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (FunctionTool, function_tool_param.FunctionToolParam),
        (MessageItem, easy_input_message_param.EasyInputMessageParam),
        (MessageItem, response_input_item_param.Message),
        (MessageItem, response_output_message_param.ResponseOutputMessageParam),
        (FunctionCallItem, response_function_tool_call_param.ResponseFunctionToolCallParam),
        (FunctionCallOutputItem, response_input_item_param.FunctionCallOutput),
    ],
    ids=lambda x: x.__name__,
)
def test_every_field_of_the_clients_tools_and_items_is_read_or_ignored(ours, theirs) -> None:
    """Each key the client's own types may send is read (and refused where not served) or
    listed as changing nothing generated, so a new one is a decision, not a silent drop."""
    read = {f.alias or name for name, f in ours.model_fields.items()}
    assert set(theirs.__annotations__) - read - ours.ignored == set()


def test_a_response_is_the_chat_answer_to_the_same_request(served: Served) -> None:
    c = served.client()
    r = c.responses.create(model="m", input="Hi there", instructions="Be brief")
    chat = c.chat.completions.create(
        model="m",
        messages=[
            {"role": "system", "content": "Be brief"},
            {"role": "user", "content": "Hi there"},
        ],
    )
    assert r.status == "completed" and r.error is None and r.incomplete_details is None
    assert r.output_text == fake.REPLY == chat.choices[0].message.content
    assert r.id.startswith("resp_") and r.output[0].id.startswith("msg_")
    assert r.model == "fake-model" and r.instructions == "Be brief"
    assert chat.usage is not None and r.usage is not None
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens
    assert r.usage.total_tokens == chat.usage.total_tokens
    extra = r.model_extra or {}
    assert extra["speculative"]["finish"] == "eos"  # specgen's statistics ride along


def test_max_output_tokens_makes_an_incomplete_response(served: Served) -> None:
    r = served.client().responses.create(model="m", input="Hi", max_output_tokens=5)
    assert r.status == "incomplete"
    assert r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.output_text == fake.REPLY[:5] and r.usage is not None
    assert r.usage.output_tokens == 5 and r.max_output_tokens == 5


@pytest.mark.parametrize("limit", [None, 9], ids=["whole", "cut"])
def test_the_stream_adds_up_to_the_whole_response(served: Served, limit: int | None) -> None:
    body = {"input": "Hi", "metadata": {"a": "b"}, "max_output_tokens": limit}
    whole = served.post("/v1/responses", body).json()
    events = events_of(served, body)
    end = "response.completed" if limit is None else "response.incomplete"
    kinds = [e["type"] for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        end,
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    Response.model_validate(whole)  # the client's own types: every field they require
    for e in events:
        EVENT.validate_python(e)
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == fake.REPLY[:limit]
    status = "completed" if limit is None else "incomplete"  # the message the limit cut
    assert whole["status"] == whole["output"][0]["status"] == status
    assert events[0]["response"]["status"] == "in_progress"
    assert events[0]["response"]["output"] == []
    final = events[-1]["response"]
    for r in (final, whole):  # two requests: their ids, times and timings differ
        for key in ("id", "created_at", "timings"):
            r.pop(key)
        for item in r["output"]:
            item.pop("id")
    assert final == whole


def test_the_sdks_stream_helper_reads_the_events(served: Served) -> None:
    c = served.client()
    with c.responses.stream(model="m", input=[{"role": "user", "content": "Hi"}]) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert text == final.output_text == fake.REPLY and final.status == "completed"


def test_a_failure_inside_a_round_fails_the_response(served: Served) -> None:
    events = events_of(served, {"input": "FAIL"})
    final = events[-1]
    EVENT.validate_python(final)  # an error code of OpenAI's
    assert final["type"] == "response.failed"
    assert final["response"]["status"] == "failed"
    assert "planted" in final["response"]["error"]["message"]
    err = refusal(served, {"input": "FAIL"}, 500)
    assert err["code"] == "engine"


def test_a_client_leaving_a_stream_frees_its_slot(served: Served) -> None:
    body = {"input": "HOLD the slot", "stream": True}
    with httpx.stream("POST", served.url + "/v1/responses", json=body) as r:
        lines = r.iter_lines()  # kept: a line iterator collected closes the connection
        assert next(lines).startswith("event: response.created")
        served.sched.wait(lambda f: f.held() == 1)
    served.sched.wait(lambda f: len(f.cancelled) == 1 and f.slots_busy == 0)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("previous_response_id", "resp_1"),
        ("conversation", "conv_1"),
        ("prompt", {"id": "pmpt_1"}),
        ("reasoning", {"effort": "high"}),
        ("background", True),
        ("truncation", "auto"),
        ("context_management", [{"type": "compaction"}]),
        ("moderation", {"mode": "block"}),
    ],
)
def test_a_field_not_honoured_is_refused_by_name(served: Served, name: str, value) -> None:
    assert RULES[name].status == "refused"
    err = refusal(served, {"input": "Hi", name: value})
    assert err["param"] == name and RULES[name].note in err["message"]


def test_inert_values_of_refused_fields_are_served(served: Served) -> None:
    body = {"input": "Hi", "truncation": "disabled", "background": False, "reasoning": {}}
    r = served.post("/v1/responses", {**body, "store": True, "include": [], "n": 1})
    assert r.status_code == 200 and r.json()["output"][0]["content"][0]["text"] == fake.REPLY
    # a response's own reasoning object, sent back with the rest of it
    again = {"input": "Hi", "reasoning": r.json()["reasoning"], "logprobs": False}
    assert served.post("/v1/responses", again).status_code == 200
    # what Codex and the Agents SDK send: no reasoning is generated, no tool is listed
    codex = {"input": "Hi", "include": ["reasoning.encrypted_content"], "tool_choice": "auto"}
    assert served.post("/v1/responses", codex).status_code == 200


@pytest.mark.parametrize("name", sorted(CHAT_NAMES))
def test_chat_fields_are_refused_with_what_to_send(served: Served, name: str) -> None:
    asks = {"messages": [], "response_format": {"type": "text"}, "n": 2, "logprobs": True}
    value = asks.get(name, 1)
    err = refusal(served, {"input": "Hi", name: value})
    assert err["param"] == name and CHAT_NAMES[name] in err["message"]


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0]", "'reasoning'"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0]", "'item_reference'"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            "input[0].content[0]",
            "only text parts",
        ),
        ({"input": "Hi", "tools": [{"type": "web_search"}]}, "tools[0]", "only function"),
        ({"input": "Hi", "tool_choice": {"type": "mcp"}}, "tool_choice", "'mcp'"),
        ({"input": "Hi", "text": {"verbosity": "low"}}, "text.verbosity", "not steered"),
        ({"input": "Hi", "include": ["file_search_call.results"]}, "include[0]", "only"),
        ({"input": [{"role": "bot", "content": "x"}]}, "input[0].role", "'user'"),
        ({"input": 3}, "input", "a string or a list"),
        ({"input": "Hi", "max_output_tokn": 3}, "max_output_tokn", "max_output_tokens"),
        ({"input": "Hi", "top_logprobs": 2}, "top_logprobs", "include"),
        ({"instructions": "x"}, "input", "required"),
        (
            {"input": "Hi", "tools": [{"type": "function", "name": "f", "paramters": {}}]},
            "tools[0]",
            "did you mean 'parameters'?",
        ),
        ({"input": "Hi", "text": {"fromat": {"type": "text"}}}, "text", "'format'?"),
        (
            {
                "input": "Hi",
                "text": {"format": {"type": "json_schema", "name": "x", "json_schema": {}}},
            },
            "text.format",
            "schema is required",
        ),
        ({"input": [{"role": "user", "contnt": "x"}]}, "input[0]", "'content'?"),
        (
            {"input": "Hi", "tools": [{"type": "function", "name": "f", "defer_loading": True}]},
            "tools[0].defer_loading",
            "tool search",
        ),
        (
            {"input": "Hi", "tools": [{"type": "function", "name": "f", "async": True}]},
            "tools[0].async",
            "awaited",
        ),
        ({"input": "Hi", "tools": {"type": "function"}}, "tools", "a list"),
        (
            {"input": "Hi", "tools": [{"type": "function", "function": {"name": "f"}}]},
            "tools[0]",
            "is flat",
        ),
        (
            {"input": [{"type": "function_call_output", "call_id": "c", "output": {"a": 1}}]},
            "input[0].output",
            "string",
        ),
    ],
)
def test_what_cannot_be_read_is_refused_naming_it(
    served: Served, body: dict, param: str, says: str
) -> None:
    err = refusal(served, body)
    assert err["param"] == param and says in err["message"]


def test_the_chat_routes_errors_name_the_responses_fields(served: Served) -> None:
    err = refusal(served, {"input": "Hi", "max_output_tokens": 10**6})
    assert err["param"] == "max_output_tokens" and "max_completion_tokens" not in err["message"]
    assert renamed("response_format.json_schema.schema") == "text.format.schema"
    assert renamed("messages[3].content") == "input.content"
    assert renamed("tools[2].function.parameters") == "tools[2].parameters"
    assert renamed("min_tokens 9 is over the limit (its max_tokens)") == (
        "min_tokens 9 is over the limit (its max_output_tokens)"
    )


def test_input_items_become_the_chat_messages_they_stand_for() -> None:
    body = {
        "instructions": "Be brief",
        "input": [
            {"role": "user", "content": "Weather?"},
            {"type": "message", "role": "assistant", "content": [
                {"type": "output_text", "text": "Let me ", "annotations": []},
                {"type": "output_text", "text": "look."},
            ]},
            {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "v", "arguments": "{\"a\":1}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "c2",
             "output": [{"type": "input_text", "text": "warm"}]},
            {"type": "function_call", "call_id": "c3", "name": "w", "arguments": "{}"},
        ],
        "tools": [{"type": "function", "name": "w", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "w"},
        "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}}},
        "include": ["message.output_text.logprobs"],
        "top_logprobs": 2,
        "max_output_tokens": 7,
        "top_k": 5,
        "store": False,
    }  # fmt: skip
    chat = ResponsesRequest.of(json.dumps(body).encode()).chat

    def call(i: str, name: str, args: str) -> dict:
        return {"id": i, "type": "function", "function": {"name": name, "arguments": args}}

    assert chat == {
        "messages": [
            {"role": "system", "content": "Be brief"},
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "Let me look.", "tool_calls": [
                call("c1", "w", "{}"), call("c2", "v", "{\"a\":1}"),
            ]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "c2", "content": "warm"},
            {"role": "assistant", "content": None, "tool_calls": [call("c3", "w", "{}")]},
        ],
        "tools": [{"type": "function",
                   "function": {"name": "w", "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "w"}},
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "s", "schema": {"type": "object"}}},
        "logprobs": True,
        "top_logprobs": 2,
        "max_completion_tokens": 7,
        "top_k": 5,
    }  # fmt: skip


def test_every_field_has_its_row_in_the_http_reference() -> None:
    page = (Path(__file__).resolve().parent.parent / "docs/reference/http.md").read_text()
    section = page[page.index("## The Responses API") : page.index("## Errors")]
    missing = [
        name
        for name, rule in RULES.items()
        if f"| `{name}` | {rule.status} | {rule.note} |" not in section
    ]
    assert not missing, f"Responses fields without their row in docs/reference/http.md: {missing}"


def _lp(token: str, raw: bytes | None = None) -> dict:
    raw = token.encode() if raw is None else raw
    return {"token": token, "logprob": -0.5, "bytes": list(raw), "top_logprobs": []}


E1, E2 = _lp("\\xc3", b"\xc3"), _lp("\\xa9", b"\xa9")  # the two bytes of "é"
CALL_LPS = [_lp("<tool_call>"), _lp('{"name"')]


def test_a_streamed_text_and_call_make_the_whole_responses_items() -> None:
    """Text with its logprobs, a round that released no text (a character's first byte),
    then the rest of the text with a call: the events open, fill and close the message
    before the call, the text's logprobs are its tokens' only (not the call's), and the
    last event's response is the one the whole chat answer makes."""
    asked = ResponsesRequest.of(b'{"input": "Hi", "include": ["message.output_text.logprobs"]}')
    call = {"id": "call_1", "type": "function", "function": {"name": "w", "arguments": "{}"}}
    usage = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}

    def chunk(delta: dict, lps: list | None = None, finish: str | None = None) -> dict:
        logprobs = {"content": lps} if lps is not None else None
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return {"id": "chatcmpl-abc", "choices": [choice]}

    built = Built(asked, "chatcmpl-abc", 5, "m")
    events = built.start()
    for c in (
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Caf"}, [_lp("Caf")]),
        chunk({"content": ""}, [E1]),  # "é"'s first byte: no text yet
        chunk({"content": "é"}, [E2]),
        chunk({"content": "!", "tool_calls": [{"index": 0, **call}]}, [_lp("!"), *CALL_LPS]),
        chunk({}, None, "tool_calls"),
        {"id": "chatcmpl-abc", "choices": [], "usage": usage},
    ):
        events += built.feed(c)
    events += built.close()
    assert [e["type"].removeprefix("response.") for e in events] == [
        "created", "in_progress", "output_item.added", "content_part.added",
        "output_text.delta", "output_text.delta", "output_text.delta", "output_text.done",
        "content_part.done", "output_item.done", "output_item.added",
        "function_call_arguments.delta", "function_call_arguments.done",
        "output_item.done", "completed",
    ]  # fmt: skip
    assert events[3]["part"]["logprobs"] == [] and events[3]["part"]["text"] == ""
    assert [e["logprobs"] for e in events[4:7]] == [[_lp("Caf")], [E1, E2], [_lp("!")]]
    text_lps = [_lp("Caf"), E1, E2, _lp("!")]
    assert events[7]["text"] == "Café!" and events[7]["logprobs"] == text_lps
    assert events[11]["delta"] == "{}" and events[12]["name"] == "w"
    message = {"role": "assistant", "content": "Café!", "tool_calls": [call]}
    choice = {"message": message, "logprobs": {"content": [*text_lps, *CALL_LPS]},
              "finish_reason": "tool_calls"}  # fmt: skip
    whole = Built(asked, "chatcmpl-abc", 5, "m").whole(
        {"id": "chatcmpl-abc", "choices": [choice], "usage": usage}
    )
    assert events[-1]["response"] == whole
    assert whole["output"][1]["call_id"] == "call_1" and whole["usage"]["total_tokens"] == 7


def test_a_stored_response_is_not_found_saying_why(served: Served) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        served.client().responses.retrieve("resp_1")
    assert (
        isinstance(caught.value.body, dict) and "stores no response" in caught.value.body["message"]
    )


def test_a_response_is_counted_and_logged_under_its_own_route(served: Served) -> None:
    served.client().responses.create(model="m", input="Hi", max_output_tokens=3)
    text = httpx.get(served.url + "/metrics", timeout=10).text
    assert 'specgen_requests_total{finish="length",route="responses"} 1.0' in text
    assert any(" responses: prompt " in line for line in served.log), served.log
