"""specgen.server.tools without a model: what a chat template does with tools (rendered
through the real template code, llama-cpp-python's Jinja2 formatter), the choices and
their 400s, the call grammars on a fake vocabulary (auto: free text, then the call
constrained from its tag on), the answer's parser and the streamed content's gate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from fakes import TextEngine

from specgen.grammar import compile_grammar, tokenizer_for
from specgen.grammarspec import GrammarSpec
from specgen.llamacpp import compile_chat_template
from specgen.server.callgrammar import call_grammar, culprit, with_format
from specgen.server.requestconfig import messages_of
from specgen.server.schemas import ChatMessage, Tool, ToolChoiceNamed
from specgen.server.shapes import Outcome, Shape
from specgen.server.tools import (
    Choice,
    ContentGate,
    TemplateTools,
    choice_of,
    parse,
    render_messages,
)

QWEN = (Path(__file__).parent / "support" / "qwen2.5-chat-template.jinja").read_text()
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' +"
    " message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# reads tools, but writes calls in a syntax of its own (no <tool_call>)
OWN = (
    "{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}{{ m.role }}:"
    " {{ m.content }}\n{% endfor %}"
)
WEATHER = Tool.model_validate(
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
)
TIME = Tool.model_validate(
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
)


def render(template: str):
    return compile_chat_template(template, "<s>", "<|im_end|>")


def tt(template: str) -> TemplateTools:
    return TemplateTools.of(template, render(template))


def test_templates_are_read_for_tools_and_their_call_syntax() -> None:
    assert tt(QWEN) == TemplateTools(native=True, syntax="hermes", object_arguments=True)
    assert tt(CHATML) == TemplateTools(native=False, syntax="json", object_arguments=False)
    assert tt(OWN) == TemplateTools(native=True, syntax="json", object_arguments=False)


def test_a_round_trip_renders_through_the_template() -> None:
    """The tools in the system turn, the assistant's earlier call as Qwen writes one (its
    arguments an object, not JSON text quoted again), the result as a tool response."""
    chat = [
        ChatMessage(role="user", content="Weather in Paris?"),
        ChatMessage.model_validate(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            }
        ),  # fmt: skip
        ChatMessage(role="tool", tool_call_id="call_1", content='{"temp": 21}'),
    ]
    t = tt(QWEN)
    msgs = render_messages(messages_of(chat), chat, [WEATHER], t)
    assert msgs[2]["tool_call_id"] == "call_1"
    text = render(QWEN)(msgs, [w.model_dump(exclude_none=True) for w in [WEATHER]])
    assert "<tools>\n" + json.dumps(WEATHER.model_dump(exclude_none=True)) in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments":'
        ' {"city": "Paris"}}\n</tool_call><|im_end|>\n'
    ) in text
    assert '<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response><|im_end|>' in text
    assert text.endswith("<|im_start|>assistant\n")
    # the fallback: a system message with the tools, the call and result as text
    plain = render_messages(messages_of(chat), chat, [WEATHER], tt(CHATML))
    assert plain[0]["role"] == "system" and "get_weather" in plain[0]["content"]
    assert plain[2]["content"] == '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    assert plain[3]["content"] == 'Result of call call_1: {"temp": 21}'
    assert "To call one" in plain[0]["content"]
    none = render_messages(messages_of(chat), chat, [WEATHER], tt(CHATML), instruct=False)
    assert "get_weather" in none[0]["content"] and "To call one" not in none[0]["content"]


def test_choices_and_their_refusals() -> None:
    q, plain, own = tt(QWEN), tt(CHATML), tt(OWN)
    assert choice_of([WEATHER], None, q) == Choice("auto", syntax="hermes")
    assert choice_of([WEATHER], "auto", q, parallel=False).parallel is False
    assert choice_of([WEATHER], "none", plain) == Choice("none")
    assert choice_of([WEATHER], "required", plain) == Choice("required", parallel=False)
    named = ToolChoiceNamed.model_validate({"type": "function", "function": {"name": "get_time"}})
    assert choice_of([WEATHER, TIME], named, q).name == "get_time"
    assert choice_of(None, None, q) is None
    for t in (plain, own):
        with pytest.raises(ValueError, match='name the function .* or use "required"'):
            choice_of([WEATHER], "auto", t)
        with pytest.raises(ValueError, match="Hermes/Qwen"):
            choice_of([WEATHER], None, t)
    with pytest.raises(ValueError, match="not among the tools"):
        choice_of([WEATHER], ToolChoiceNamed.model_validate(
            {"type": "function", "function": {"name": "nope"}}), q)  # fmt: skip
    with pytest.raises(ValueError, match="needs tools"):
        choice_of(None, "required", q)
    # a named function is called once, parallel calls or not; required may call several
    assert choice_of([WEATHER], named_weather(), q).parallel is False
    assert choice_of([WEATHER], "required", q).parallel is True


def named_weather() -> ToolChoiceNamed:
    return ToolChoiceNamed.model_validate({"type": "function", "function": {"name": "get_weather"}})


# parameters with local references, as pydantic writes a nested model ($defs) and a
# recursive one ("#": the parameters themselves)
PERSON = Tool.model_validate({"type": "function", "function": {"name": "person", "parameters": {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "address": {"$ref": "#/$defs/Addr"},
        "kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 1},
    },
    "required": ["name", "address"],
    "additionalProperties": False,
    "$defs": {"Addr": {
        "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
        "required": ["city"], "additionalProperties": False,
    }},
}}})  # fmt: skip
ADDR = '"address": {"city": "Paris"}'


@pytest.mark.parametrize("with_time", [False, True], ids=["one-tool", "any-of-two"])
def test_local_references_in_parameters_resolve_within_them(with_time: bool) -> None:
    """A ``$ref`` in a tool's parameters points into the parameters, not into the call's
    wrapper schema around them (nor, with several tools, into the ``anyOf``): a nested
    model's ``#/$defs/...`` compiles and holds, a recursive ``#`` is the parameters again
    (a call's ``{"name", "arguments"}`` there is refused), as the schema alone would."""
    eng = TextEngine()
    tools = [PERSON, TIME] if with_time else [PERSON]
    g = compile_grammar(call_grammar(tools, Choice("required")), tokenizer_for(eng))  # type: ignore[arg-type]
    call = '{"name": "person", "arguments": {"name": "Al", ' + ADDR
    assert g.matcher().sync(B(call + "}}"))
    assert not g.matcher().sync(
        B('{"name": "person", "arguments": {"name": "Al", "address": {"city": "Oslo"')
    )
    kid = '{"name": "Bo", ' + ADDR + "}"
    assert g.matcher().sync(B(call + ', "kids": [' + kid + "]}}"))
    wrapper = '{"name": "person", "arguments": {"name": "Bo", ' + ADDR + "}}"
    assert not g.matcher().sync(B(call + ', "kids": [' + wrapper))


def test_a_function_without_parameters_takes_no_arguments() -> None:
    """OpenAI: omitting ``parameters`` defines an empty parameter list. Its calls' arguments
    are ``{}`` (any object had been allowed: a small model made one up, and a client's
    ``fn(**arguments)`` then failed); ``parameters: {}`` stays any object."""
    eng = TextEngine()
    ping = Tool.model_validate({"type": "function", "function": {"name": "ping"}})
    g = compile_grammar(call_grammar([ping], Choice("required")), tokenizer_for(eng))  # type: ignore[arg-type]
    assert g.matcher().sync(B('{"name": "ping", "arguments": {}}'))
    assert not g.matcher().sync(B('{"name": "ping", "arguments": {"city"'))
    anything = Tool.model_validate(
        {"type": "function", "function": {"name": "p", "parameters": {}}}
    )
    g = compile_grammar(call_grammar([anything], Choice("required")), tokenizer_for(eng))  # type: ignore[arg-type]
    assert g.matcher().sync(B('{"name": "p", "arguments": {"city": "Oslo"}}'))


def test_a_streamed_answer_ends_with_its_own_finish_chunk() -> None:
    """The calls (or the held-back text) come in one chunk and the finish_reason in the
    next, with an empty delta, as OpenAI and llama-server send them: replayed through
    openai-python's own stream state, every call gets its ``arguments.done`` event (sent in
    one chunk with the finish_reason, the last call never got it)."""
    from openai.lib.streaming.chat._completions import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk

    answer = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    )
    shape = Shape(True, "chatcmpl-1", "m", 0, [1], tools=Choice("required", syntax="hermes"))
    state = ChatCompletionStreamState()
    events = []
    first = shape.first_chunk()
    assert first is not None
    for chunk in [first, *shape.final_chunks([], Outcome(answer, "stop", None, None), "")]:
        events += state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    done = [e.arguments for e in events if e.type == "tool_calls.function.arguments.done"]
    assert done == ['{"city": "Paris"}', '{"city": "Oslo"}']
    *_, last = shape.final_chunks([], Outcome(answer, "stop", None, None), "")
    assert last["choices"][0]["delta"] == {} and last["choices"][0]["finish_reason"] == "tool_calls"
    text = Shape(True, "chatcmpl-2", "m", 0, [1]).final_chunks(
        [], Outcome("ab", "stop", None, None), "b"
    )
    assert [c["choices"][0]["delta"] for c in text] == [{"content": "b"}, {}]
    assert [c["choices"][0]["finish_reason"] for c in text] == [None, "stop"]


def B(text: str) -> list[int]:
    return TextEngine().tokenize(text.encode(), add_special=False)


def test_auto_is_free_text_until_the_tag_then_the_call() -> None:
    """The constraint layer: before <tool_call> every text token and the end are allowed;
    from the tag on only the call's JSON and closing tag; after it another call or the
    end; a wrong name or argument is never allowed."""
    eng = TextEngine()
    spec = call_grammar([WEATHER], Choice("auto", syntax="hermes"))
    assert spec is not None and spec.kind == "lark"
    g = compile_grammar(spec, tokenizer_for(eng))

    def after(text: str):
        m = g.matcher()
        assert m.sync(B(text)), text
        return m

    # every token of text (here the ASCII ones: a lone byte >= 0x80 is no character) and EOS
    text = {t for t, piece in eng.pieces.items() if piece and piece.isascii()} | {0}
    free = after("Let me look. <tool_c")
    assert text <= {int(t) for t in np.flatnonzero(free.allowed())}
    tag = after("Let me look. <tool_call>")
    assert not tag.allowed()[0] and tag.n_allowed() == 1
    forced = b"".join(eng.pieces[t] for t in tag.forced())
    assert forced.startswith(b'\n{"name": "get_weather", "arguments": {"city": "'), forced
    assert not g.matcher().sync(B('Hi <tool_call>\n{"name": "get_time"'))
    assert not g.matcher().sync(B('Hi <tool_call>\n{"name": "get_weather", "arguments": {"x"'))
    done = after(
        'Hi <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    assert done.allowed()[0] and done.accepting  # the end, or another call
    assert not g.matcher().sync(
        B('<tool_call>\n{"name": "get_weather", "arguments": {"city": "P"}}\n</tool_call> and')
    )
    # one call only without parallel calls; required: no text before the call
    one = compile_grammar(
        call_grammar([WEATHER], Choice("auto", syntax="hermes", parallel=False)), tokenizer_for(eng)
    )  # type: ignore[arg-type]
    m = one.matcher()
    assert m.sync(
        B('<tool_call>\n{"name": "get_weather", "arguments": {"city": "P"}}\n</tool_call>')
    )
    assert m.stopped
    req = compile_grammar(
        call_grammar([WEATHER, TIME], Choice("required", syntax="hermes")), tokenizer_for(eng)
    )  # type: ignore[arg-type]
    assert not req.matcher().sync(B("Hi"))
    assert req.matcher().sync(B('<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'))
    assert call_grammar([WEATHER], Choice("none", syntax="hermes")) is None
    bare = call_grammar([WEATHER], Choice("required"))
    assert bare is not None and bare.kind == "json_schema"


def test_auto_beside_a_json_format_is_that_json_or_the_calls() -> None:
    """`response_format` (or Responses' ``text.format``) beside tools under auto: the
    answer is JSON that follows the format, with its own whitespace, or the calls; never
    free text, never JSON of another shape. Under required the calls alone; a grammar
    that is not JSON beside calls is refused."""
    eng = TextEngine()
    city = GrammarSpec.json_schema(
        {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"],
         "additionalProperties": False}, "response_format.json_schema.schema",
    )  # fmt: skip
    spec = with_format([WEATHER], Choice("auto", syntax="hermes"), city)
    assert spec is not None
    g = compile_grammar(spec, tokenizer_for(eng))
    assert g.matcher().sync(B('{"name": "Paris"}'))
    assert g.matcher().sync(
        B('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    )
    for wrong in ("Hi <tool_call>", '{"name":"Paris"}', '{"town": "Paris"}', "Paris"):
        assert not g.matcher().sync(B(wrong)), wrong
    done = g.matcher()
    assert done.sync(B('{"name": "Paris"}')) and done.accepting
    required = with_format([WEATHER], Choice("required", syntax="hermes"), city)
    assert required == call_grammar([WEATHER], Choice("required", syntax="hermes"))
    assert with_format([WEATHER], Choice("none", syntax="hermes"), city) is None
    with pytest.raises(ValueError, match="only a JSON format"):
        with_format([WEATHER], Choice("auto", syntax="hermes"), GrammarSpec("regex", "a+", "x"))
    mode = with_format([WEATHER], Choice("auto", syntax="hermes"), GrammarSpec("json_object"))
    assert mode is not None and compile_grammar(mode, tokenizer_for(eng)).matcher().sync(B("{"))


@pytest.mark.parametrize("kind", ["auto", "required"])
def test_a_bad_tool_schema_is_named_in_the_schemas_own_words(kind: str) -> None:
    """The calls' grammar fails whole with llguidance quoting its Lark rules; the culprit
    says what is wrong with the tool's schema alone, and names the tool's field."""
    eng = TextEngine()
    bad = Tool.model_validate({"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "pattern": "(("}}}}})  # fmt: skip

    def check(spec: GrammarSpec) -> None:
        compile_grammar(spec, tokenizer_for(eng))

    found = culprit([WEATHER, bad], Choice(kind, syntax="hermes"), check)
    assert found is not None and found[0] == "tools[1].function.parameters"
    assert "unclosed group" in found[1] and "call_body" not in found[1], found[1]


def test_auto_rows_are_masked_alike_for_p_and_q_and_follow_rollback() -> None:
    """The same history gives the same mask whichever side asks, and a matcher moved past
    the tag and rolled back to free text allows free text again."""
    from specgen.grammarrows import GrammarProcessor

    eng = TextEngine()
    g = compile_grammar(
        call_grammar([WEATHER], Choice("auto", syntax="hermes")), tokenizer_for(eng)
    )  # type: ignore[arg-type]
    prompt = B("Q:")
    target, draft = GrammarProcessor(g, len(prompt)), GrammarProcessor(g, len(prompt))
    ctx = prompt + B("ok <tool_call>")
    logits = np.zeros((2, eng.n_vocab), dtype=np.float32)
    rows = target.rows(logits, ctx, B("\n"))
    assert np.array_equal(rows[0], draft.row(logits[0], ctx, []))
    assert np.isfinite(rows[0]).sum() == 1 and np.isfinite(rows[1]).sum() == 1
    back = target.row(logits[0], prompt + B("ok"), [])  # rolled back before the tag
    assert np.isfinite(back).sum() > 100


@pytest.mark.parametrize(
    ("text", "content", "names"),
    [
        ("Just text.", "Just text.", None),
        ('<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>', None, ["f"]),
        (
            'Looking.\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n'
            '<tool_call>\n{"name": "g", "arguments": {"b": "x"}}\n</tool_call>',
            "Looking.",
            ["f", "g"],
        ),
        ('Hi <tool_call>\n{"name": "f", "argu', None, None),  # cut by max_tokens
        (  # a later call cut by max_tokens: the complete one stands
            '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n<tool_call>\n{"na',
            None,
            ["f"],
        ),
        *(  # a later call cut inside its opening tag: the complete one stands
            ('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n' + tag, None, ["f"])
            for tag in ("<", "<tool", "<tool_call")
        ),
        ('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n<b>', None, None),
        (  # a cut call's tag, then no call after it: not a call
            '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n</tool_call>',
            None,
            None,
        ),
        ('<tool_call>\n{"name": "f"}\n</tool_call>', None, None),  # no arguments
        ('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call> then text', None, None),
    ],
)
def test_hermes_answers_parse_into_content_and_calls(
    text: str, content: str | None, names: list[str] | None
) -> None:
    got_content, calls = parse(text, "hermes")
    if names is None:
        assert calls is None and got_content == text
        return
    assert got_content == content
    assert calls is not None and [c["function"]["name"] for c in calls] == names
    for c in calls:
        assert c["type"] == "function" and c["id"].startswith("call_")
        assert isinstance(json.loads(c["function"]["arguments"]), dict)
    assert calls[0]["id"] != calls[-1]["id"] or len(calls) == 1


def test_bare_json_answers_parse() -> None:
    content, calls = parse('{"name": "f", "arguments": {"a": 1}}', "json")
    assert content is None and calls is not None
    assert calls[0]["function"]["arguments"] == '{"a": 1}'
    assert parse('{"name": "f", "argu', "json") == ('{"name": "f", "argu', None)


def test_the_gate_streams_content_and_holds_back_a_possible_tag() -> None:
    g = ContentGate(True)
    out = [g.feed(p) for p in ["Let me ", "check <", "tool", "_call>\n{", '"name": ...']]
    assert out == ["Let me", " check", "", "", ""]
    assert "".join(out) == "Let me check" and g.released == len("Let me check")
    t = ContentGate(True)
    out = [t.feed(p) for p in ["a <t", "ea> b", "\n\n"]]
    assert "".join(out) == "a <tea> b"  # not a tag after all: sent; the newlines held
    assert t.text[t.released :] == "\n\n"
    closed = ContentGate(False)
    assert closed.feed("<tool_call>") == "" and closed.released == 0
