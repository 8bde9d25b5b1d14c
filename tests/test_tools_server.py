"""Tool calls over real HTTP with the official `openai` client, on the SmolLM2 pair served
with a Qwen 2.5 chat template (`--chat-template`: ChatML like SmolLM2's own, plus tools and
the Hermes ``<tool_call>`` syntax): ``tool_choice: "auto"`` answers text or a call, a call
forced deterministically (a logit bias on the tokens of ``<tool_call>``: the model writes
the tag freely, the grammar then holds the rest to the call, whose one argument is an
enum), non-streaming and streaming, and a tool-result round trip through the template.
The 400 for auto on a template without a known syntax is in test_grammar_server (SmolLM2's
own template)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from support.serve import Server, start
from support.weather import TAG_BIAS, TEMPLATE, WEATHER_FUNCTION

WEATHER = {"type": "function", "function": WEATHER_FUNCTION}
WHAT = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(smol_pair) -> Iterator[Server]:
    s = start(
        smol_pair, "-np", "2", "--draft-max", "4", "--temp", "0", "-c", "1024",
        "--chat-template", str(TEMPLATE),
    )  # fmt: skip
    yield s
    assert s.stop() == 0


def test_auto_answers_text_or_a_valid_call(server: Server) -> None:
    r = server.client().chat.completions.create(
        model=server.model_id, messages=WHAT, tools=[WEATHER], temperature=0, max_tokens=24,
    )  # fmt: skip
    choice = r.choices[0]
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls"
        assert json.loads(choice.message.tool_calls[0].function.arguments)["city"] in (
            "Paris", "London",
        )  # fmt: skip
    else:
        assert choice.finish_reason in ("stop", "length") and choice.message.content
        assert "<tool_call>" not in choice.message.content


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_auto_after_the_tag_is_a_valid_call(server: Server, temperature: float) -> None:
    """The bias makes the model write <tool_call> (and would garble anything it may
    write after it): the call is whole and valid because the grammar took over at the tag."""
    r = server.client().chat.completions.create(
        model=server.model_id, messages=WHAT, tools=[WEATHER], tool_choice="auto",
        temperature=temperature, seed=1, max_tokens=60, logit_bias=TAG_BIAS,
        parallel_tool_calls=False,
    )  # fmt: skip
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None and len(choice.message.tool_calls or []) == 1
    call = choice.message.tool_calls[0]  # type: ignore[index]
    assert call.type == "function" and call.id and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"} or temperature > 0
    assert json.loads(call.function.arguments)["city"] in ("Paris", "London")


def test_auto_streams_delta_tool_calls(server: Server) -> None:
    stream = server.client().chat.completions.create(
        model=server.model_id, messages=WHAT, tools=[WEATHER], temperature=0,
        max_tokens=60, logit_bias=TAG_BIAS, parallel_tool_calls=False, stream=True,
    )  # fmt: skip
    calls, content, finish = [], "", None
    for chunk in stream:
        for c in chunk.choices:
            calls += c.delta.tool_calls or []
            content += c.delta.content or ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls" and content == "" and len(calls) == 1
    assert calls[0].index == 0 and calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments or "") == {"city": "Paris"}


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}],
    ids=["required", "named"],
)  # fmt: skip
def test_a_forced_call_streams_the_message_it_answers(server: Server, choice: object) -> None:
    """A stream whose answer is all calls opens with null content, as the whole answer's
    message has (it opened with "", so the SDK's accumulated message differed)."""
    kwargs: dict = {
        "model": server.model_id, "messages": WHAT, "tools": [WEATHER], "tool_choice": choice,
        "temperature": 0, "max_tokens": 40, "parallel_tool_calls": False,
    }  # fmt: skip
    client = server.client()
    whole = client.chat.completions.create(**kwargs).choices[0].message
    first = next(iter(client.chat.completions.create(**kwargs, stream=True)))
    assert first.choices[0].delta.role == "assistant"
    assert first.choices[0].delta.content is None
    with client.chat.completions.stream(**kwargs) as stream:
        done = [e.name for e in stream if e.type == "tool_calls.function.arguments.done"]
        streamed = stream.get_final_completion().choices[0].message
    assert done == [c.function.name for c in streamed.tool_calls or []]  # the SDK's event
    assert whole.content is None and streamed.content is None
    assert [(c.function.name, c.function.arguments) for c in streamed.tool_calls or []] == [
        (c.function.name, c.function.arguments) for c in whole.tool_calls or []
    ]
    assert whole.tool_calls and whole.tool_calls[0].function.name == "get_weather"


def test_a_function_without_parameters_is_called_with_none(server: Server) -> None:
    """OpenAI: no ``parameters``, an empty parameter list (the model had made up a city)."""
    r = server.client().chat.completions.create(
        model=server.model_id, messages=WHAT, tools=[{"type": "function", "function": {
            "name": "ping"}}], tool_choice="required", parallel_tool_calls=False,
        temperature=0, max_tokens=40,
    )  # fmt: skip
    calls = r.choices[0].message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [("ping", {})]


def test_a_tool_result_round_trip_through_the_template(server: Server) -> None:
    """The call goes back as the assistant's tool_calls and the result as a tool message;
    the template renders both (the prompt grows by them), and the next answer is text
    (tool_choice none; the tools are still rendered)."""
    c = server.client()
    first = c.chat.completions.create(
        model=server.model_id, messages=WHAT, tools=[WEATHER], temperature=0,
        max_tokens=60, logit_bias=TAG_BIAS, parallel_tool_calls=False,
    )  # fmt: skip
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    history = [
        *WHAT,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 21, "sky": "clear"}'},
    ]
    after = c.chat.completions.create(
        model=server.model_id, messages=history, tools=[WEATHER], tool_choice="none",
        temperature=0, max_tokens=16,
    )  # fmt: skip
    assert after.choices[0].finish_reason in ("stop", "length")
    assert after.choices[0].message.content and not after.choices[0].message.tool_calls
    assert first.usage is not None and after.usage is not None
    # the call (about 20 tokens) and the result (about 15) in the prompt
    assert after.usage.prompt_tokens >= first.usage.prompt_tokens + 30
    bare = c.chat.completions.create(model=server.model_id, messages=WHAT, max_tokens=1)
    assert bare.usage is not None  # without tools: no tools block in the system turn
    assert first.usage.prompt_tokens > bare.usage.prompt_tokens + 50


@pytest.mark.parametrize("stream", [False, True])
def test_calls_cut_by_max_tokens_keep_the_complete_ones(server: Server, stream: bool) -> None:
    """With parallel calls the bias makes the model write call after call until max_tokens
    cuts one: the complete calls before it are returned, finish_reason length (a call may
    be missing), no markup in the content."""
    r = server.client().chat.completions.create(
        model=server.model_id, messages=WHAT, tools=[WEATHER], tool_choice="required",
        temperature=0, max_tokens=60, logit_bias=TAG_BIAS, stream=stream,
    )  # fmt: skip
    if stream:
        calls, content, finish = [], "", None
        for chunk in r:  # type: ignore[union-attr]
            for c in chunk.choices:
                calls += c.delta.tool_calls or []
                content += c.delta.content or ""
                finish = c.finish_reason or finish
        assert [c.index for c in calls] == list(range(len(calls)))
    else:
        choice = r.choices[0]  # type: ignore[union-attr]
        calls, content, finish = (
            choice.message.tool_calls or [],
            choice.message.content,
            choice.finish_reason,
        )
    assert finish == "length" and not content and len(calls) >= 1
    for call in calls:
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments or "") == {"city": "Paris"}


def test_a_named_function_with_defs_is_called_once_as_instructor_asks(server: Server) -> None:
    """instructor's TOOLS mode: a pydantic model with a nested one (``$defs``) as the
    function, named in tool_choice, parallel calls not said: one call (it was two, or a
    400 "Pointer '/$defs/Addr' does not exist"), whose arguments follow the nested model."""
    person = {"type": "function", "function": {"name": "Person", "parameters": {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12},
                       "address": {"$ref": "#/$defs/Addr"}},
        "required": ["name", "address"], "additionalProperties": False,
        "$defs": {"Addr": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
                           "required": ["city"], "additionalProperties": False}},
    }}}  # fmt: skip
    r = server.client().chat.completions.create(
        model=server.model_id,
        messages=[{"role": "user", "content": "John lives in Paris. Extract the person."}],
        tools=[person],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "Person"}},
        temperature=0,
        max_tokens=120,
    )
    calls = r.choices[0].message.tool_calls
    assert calls is not None and len(calls) == 1 and r.choices[0].finish_reason == "tool_calls"
    args = json.loads(calls[0].function.arguments)
    assert set(args) == {"name", "address"} and args["address"]["city"] in ("Paris", "Rome")


@pytest.mark.parametrize("bias", [False, True], ids=["as-it-comes", "a-call"])
def test_a_stream_lists_the_logprobs_the_whole_answer_lists(server: Server, bias: bool) -> None:
    """Under tool_choice auto the stream's content passes a gate that holds back what may
    start ``<tool_call>`` (all of it, once a call is written): the held rounds' tokens go
    out with the chunk that releases their text, or with the final chunk with the calls,
    so the stream lists every token the whole answer lists (it had dropped them)."""
    c = server.client()
    kw: dict = dict(
        model=server.model_id, messages=WHAT, tools=[WEATHER], temperature=0, max_tokens=40,
        parallel_tool_calls=False, logprobs=True, top_logprobs=2,
    )  # fmt: skip
    if bias:
        kw["logit_bias"] = TAG_BIAS
    whole = c.chat.completions.create(**kw)
    assert whole.choices[0].logprobs is not None and whole.usage is not None
    tokens = [(e.token, e.logprob) for e in whole.choices[0].logprobs.content or []]
    assert len(tokens) == whole.usage.completion_tokens
    streamed = []
    for chunk in c.chat.completions.create(**kw, stream=True):
        for ch in chunk.choices:
            if ch.logprobs is not None:
                streamed += [(e.token, e.logprob) for e in ch.logprobs.content or []]
    assert [t for t, _ in streamed] == [t for t, _ in tokens]
    # two requests: rows from decodes of other shapes (a cached prefix, other blocks) differ
    # by float rounding (FIELD.md: up to about 0.02 on an F32 model), never by whole nats
    assert all(abs(a - b) < 0.02 for (_, a), (_, b) in zip(streamed, tokens, strict=True))
    assert (whole.choices[0].message.tool_calls is not None) == bias
