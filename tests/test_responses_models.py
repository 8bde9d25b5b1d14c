"""OpenAI's Responses API on the SmolLM2 pair over real HTTP with the official `openai`
client (served with the Qwen 2.5 chat template, as test_tools_server): a response is the
chat answer to the same request token for token (greedy and seeded sampling, its
log-probabilities too), whether streamed or whole; a forced function call and its output
round-trip as items; ``text.format``'s JSON Schema holds the answer (the SDK's
``responses.parse``)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pydantic
import pytest
from support.serve import Server, start
from support.weather import TAG_BIAS, TEMPLATE, WEATHER_FUNCTION

WEATHER = {"type": "function", **WEATHER_FUNCTION}
ASK = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def server(smol_pair) -> Iterator[Server]:
    s = start(
        smol_pair, "-np", "2", "--draft-max", "4", "-c", "1024", "--chat-template", str(TEMPLATE)
    )
    yield s
    assert s.stop() == 0


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_response_is_the_chat_answer_token_for_token(server: Server, temperature: float) -> None:
    c = server.client()
    common = {"temperature": temperature, "seed": 7}
    include = ["message.output_text.logprobs"]
    r = c.responses.create(
        model=server.model_id, input=ASK, instructions="Answer in one sentence.", max_output_tokens=40,
        include=include, top_logprobs=2, extra_body=common,
    )  # fmt: skip
    chat = c.chat.completions.create(
        model=server.model_id, messages=[
            {"role": "system", "content": "Answer in one sentence."},
            {"role": "user", "content": ASK},
        ],
        max_tokens=40, logprobs=True, top_logprobs=2, **common,  # type: ignore[arg-type]
    )  # fmt: skip
    answer = chat.choices[0]
    assert r.output_text and r.output_text == answer.message.content
    assert (r.status == "incomplete") == (answer.finish_reason == "length")
    part = r.output[0].content[0]  # type: ignore[union-attr]
    assert answer.logprobs is not None and answer.logprobs.content is not None
    # the same tokens; their values to float noise (a prompt served from the cache is
    # evaluated in other batches than the same prompt evaluated afresh)
    got, want = part.logprobs or [], answer.logprobs.content
    assert [x.token for x in got] == [x.token for x in want]
    assert all(abs(a.logprob - b.logprob) < 0.05 for a, b in zip(got, want, strict=True))
    assert len(part.logprobs[0].top_logprobs) == 2  # type: ignore[index]
    with c.responses.stream(
        model=server.model_id, input=ASK, instructions="Answer in one sentence.", max_output_tokens=40,
        extra_body=common,
    ) as stream:  # fmt: skip
        events = list(stream)
    # the SDK's get_final_response reads response.completed only: the last event here
    # may be response.incomplete (max_output_tokens), as OpenAI's
    assert events[-1].type == f"response.{r.status}"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == events[-1].response.output_text == r.output_text  # type: ignore[union-attr]


def test_a_forced_call_and_its_output_round_trip_as_items(server: Server) -> None:
    c = server.client()
    first = c.responses.create(
        model=server.model_id, input=ASK, tools=[WEATHER], tool_choice="required",  # type: ignore[list-item]
        parallel_tool_calls=False, temperature=0, max_output_tokens=40,
    )  # fmt: skip
    assert first.status == "completed"
    calls = [x for x in first.output if x.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id
    assert json.loads(calls[0].arguments)["city"] in ("Paris", "London")
    result = {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny"}
    then = c.responses.create(
        model=server.model_id, tools=[WEATHER], tool_choice="none", temperature=0,  # type: ignore[list-item]
        input=[{"role": "user", "content": ASK}, *first.output, result],  # type: ignore[list-item]
        max_output_tokens=30,
    )  # fmt: skip
    assert then.output_text and all(x.type == "message" for x in then.output)
    assert (then.usage and first.usage) and then.usage.input_tokens > first.usage.input_tokens


class City(pydantic.BaseModel):
    name: str
    country: str


def test_a_json_schema_format_holds_the_answer(server: Server) -> None:
    r = server.client().responses.parse(
        model=server.model_id, input="Name a city in France as JSON.", text_format=City,
        temperature=0.8, max_output_tokens=60,
        extra_body={"seed": 3},
    )  # fmt: skip
    assert r.status == "completed", r.output_text
    assert isinstance(r.output_parsed, City)
    assert City.model_validate_json(r.output_text) == r.output_parsed


@pytest.mark.parametrize("answer", ["call", "json"])
def test_tools_beside_a_json_format_answer_json_or_a_call(server: Server, answer: str) -> None:
    """An agent's usual request (tools, and an output type as text.format) under auto: the
    answer is a valid call, or JSON of the format. A bias on the tokens of <tool_call>
    makes the model call; one against "<" (SmolLM2's token 44) leaves it the JSON alone."""
    bias = TAG_BIAS if answer == "call" else {"44": -100}
    r = server.client().responses.parse(
        model=server.model_id, input=ASK, tools=[WEATHER], text_format=City,  # type: ignore[list-item]
        parallel_tool_calls=False, temperature=0, max_output_tokens=60,
        extra_body={"logit_bias": bias},
    )  # fmt: skip
    assert r.status == "completed", r.output
    calls = [x for x in r.output if x.type == "function_call"]
    if answer == "call":
        assert len(calls) == 1 and json.loads(calls[0].arguments)["city"] in ("Paris", "London")
        assert r.output == calls  # no text beside the call
    else:
        assert not calls and isinstance(r.output_parsed, City)
