"""The HTTP side of `specgen serve` over real HTTP on a loopback port, driven by the official
`openai` client and by raw httpx, with the scripted scheduler of `fake_server` behind it
(routes, schemas, streaming, errors, auth, body limit, CORS, queue, disconnects, metrics).
The real scheduler and models: test_server_models.py; signals: test_server_signals.py."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import fake_server as fake
import httpx
import openai
import pytest
from support.served import USER, Served, serving

from specgen.control.costs import Line
from specgen.errors import ChatTemplateError
from specgen.flags import SamplingFlags
from specgen.generate import GenerateConfig
from specgen.sampling import SamplingParams
from specgen.sched.jobs import BatchReport, Failed, Job, Ticket
from specgen.server import runner
from specgen.server.app import Settings
from specgen.server.requestconfig import Defaults
from specgen.server.responses import Events, deliver

T = 60  # seconds: generous, never a bound on speed (httpx defaults to 5)


@pytest.fixture
def served() -> Iterator[Served]:
    with serving() as s:
        yield s


def sse_lines(response: httpx.Response) -> list[str]:
    return [line for line in response.iter_lines() if line.startswith("data: ")]


def chunks_of(lines: list[str]) -> list[dict]:
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


# -- chat and completions ------------------------------------------------------------------


def test_chat_answers_with_usage_timings_and_speculative(served: Served) -> None:
    r = served.client().chat.completions.create(model="x", messages=USER)  # type: ignore[arg-type]
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.model == "fake-model"
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == fake.REPLY
    assert choice.finish_reason == "stop"
    n_prompt = len(fake.render_chat(USER))
    assert r.usage is not None
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (n_prompt, len(fake.REPLY))
    assert r.usage.total_tokens == n_prompt + len(fake.REPLY)
    extra = r.model_extra or {}
    spec, t = extra["speculative"], extra["timings"]
    assert spec["finish"] == "eos"
    assert set(spec["k_per_step"]) == {fake.K}
    assert spec["num_steps"] == spec["num_spec_steps"] == len(spec["k_per_step"])
    assert spec["num_draft_tokens"] == fake.K * spec["num_steps"] == t["draft_n"]
    assert t["draft_n_accepted"] == spec["num_accepted_draft_tokens"] <= t["draft_n"]
    assert t["predicted_n"] == len(fake.REPLY)
    assert t["prompt_n"] + t["cache_n"] == n_prompt


def test_a_stream_sends_its_role_with_the_first_token_not_before_the_prefill() -> None:
    """The role chunk waits for the choice's first event (its first round), as llama-server
    and vLLM send it: sent at once, before the prompt was evaluated, a client timing its
    first chunk (vLLM's benchmark) reported a time to first token of ~0."""
    import asyncio
    from types import SimpleNamespace

    from specgen.events import Done, Stats
    from specgen.server.app import State
    from specgen.server.responses import Run
    from specgen.server.shapes import Shape

    async def main() -> list[dict]:
        events = Events(asyncio.get_running_loop())
        run = Run(State(), fake.fake_backend(), [SimpleNamespace(id="j")], [], events,  # type: ignore[list-item]
                  Shape(True, "chatcmpl-1", "m", 0, [1]), "/v1/chat/completions")  # fmt: skip
        stream = run.stream(include_usage=False)
        first = asyncio.ensure_future(anext(stream))
        for _ in range(10):  # every ready callback runs: the stream waits on the queue alone
            await asyncio.sleep(0)
        assert not first.done()  # was the role chunk, before any event
        events(Done("stop", "hi", (104, 105), Stats(n_prompt=1, n_generated=2)))
        chunks = [await first] + [c async for c in stream]
        return [json.loads(c["data"]) for c in chunks if c["data"] != "[DONE]"]

    role, text, final = asyncio.run(main())
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert text["choices"][0]["delta"] == {"content": "hi"}
    assert final["choices"][0]["finish_reason"] == "stop"


def test_chat_stream_sends_a_chunk_per_round_then_finish_usage_and_done(served: Served) -> None:
    body = {"messages": USER, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", served.url + "/v1/chat/completions", json=body, timeout=10) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        chunks = chunks_of(sse_lines(r))
    first, *rounds, final, usage = chunks
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["choices"][0]["finish_reason"] is None for c in rounds)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in [*rounds, final])
    assert text == fake.REPLY
    assert final["choices"][0]["finish_reason"] == "stop"
    # one chunk per round with text: the last round holds the end token alone (no chunk)
    assert all(c["choices"][0]["delta"]["content"] for c in rounds)
    assert len(rounds) == final["speculative"]["num_steps"] - 1
    assert final["timings"]["predicted_n"] == len(fake.REPLY)
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(fake.REPLY)
    assert len({c["id"] for c in chunks}) == 1


def test_the_openai_client_streams_chat_and_text(served: Served) -> None:
    client = served.client()
    parts = client.chat.completions.create(model="x", messages=USER, stream=True)  # type: ignore[arg-type]
    text = "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
    assert text == fake.REPLY
    stream = client.completions.create(model="x", prompt="Once", stream=True, max_tokens=10)
    got = list(stream)
    assert "".join(c.choices[0].text for c in got) == fake.REPLY[:10]
    assert got[-1].choices[0].finish_reason == "length"


def test_completions_take_text_or_token_ids(served: Served) -> None:
    r = served.client().completions.create(model="x", prompt="Once upon", max_tokens=5)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert r.choices[0].text == fake.REPLY[:5]
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.prompt_tokens == len("Once upon")
    assert (r.model_extra or {})["speculative"]["finish"] == "length"
    ids = served.post("/v1/completions", {"prompt": [72, 105], "return_tokens": True}).json()
    assert ids["usage"]["prompt_tokens"] == 2
    assert ids["tokens"] == fake.tokenize(fake.REPLY)
    assert served.sched.submitted[-1].prompt == [72, 105]
    # a batch of one, as lm-evaluation-harness sends token ids: [[ids]]
    one = served.post("/v1/completions", {"prompt": [[72, 105, 33]], "max_tokens": 2})
    assert one.status_code == 200 and served.sched.submitted[-1].prompt == [72, 105, 33]
    for empty in ([[]], [[72], []], [], "", ["a", ""]):
        err = assert_openai_error(served.post("/v1/completions", {"prompt": empty}), 400, "prompt")
        assert "empty" in err["message"]
    for mixed in (["a", [72]], [[72], "a"]):
        err = assert_openai_error(served.post("/v1/completions", {"prompt": mixed}), 400, "prompt")
        assert "all text or all token-id lists" in err["message"]


def test_a_prediction_reaches_the_generation_as_tokens_cut_to_max_tokens(served: Served) -> None:
    """OpenAI's ``prediction`` (Predicted Outputs), as the official client sends it: its
    text (or text parts) tokenized without a BOS, at most max_tokens of it; another type
    or a part that is not text is a 400 naming the field."""
    c = served.client()
    r = c.chat.completions.create(
        model="x", messages=USER, max_tokens=50, prediction={"type": "content", "content": "Hi!"}
    )
    assert served.sched.submitted[-1].config.prediction == (72, 105, 33)
    # the fake proposes nothing from it: OpenAI's counts are there, at 0
    assert r.usage is not None and r.usage.completion_tokens_details is not None
    assert r.usage.completion_tokens_details.accepted_prediction_tokens == 0
    parts = [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]
    body = {"messages": USER, "max_tokens": 3, "prediction": {"type": "content", "content": parts}}
    assert served.post("/v1/chat/completions", body).status_code == 200
    assert served.sched.submitted[-1].config.prediction == (72, 101, 108)
    plain = served.post("/v1/chat/completions", {"messages": USER, "max_tokens": 3}).json()
    assert served.sched.submitted[-1].config.prediction == ()
    assert "completion_tokens_details" not in plain["usage"]
    n = len(served.sched.submitted)
    for bad in (
        {"type": "text", "content": "Hi"},
        {"type": "content", "content": [{"type": "image_url", "text": None}]},
        "Hi",
    ):
        r = served.post("/v1/chat/completions", {"messages": USER, "prediction": bad})
        assert_openai_error(r, 400)
        assert "prediction" in r.json()["error"]["param"]
    assert len(served.sched.submitted) == n


def test_add_special_tokens_reaches_the_tokenizer_on_both_routes() -> None:
    """vLLM's ``add_special_tokens``: false asks for the prompt without an added BOS (the
    tokenizer's flag, `specgen.chat.prompt_tokens`); unsaid or true, with one."""
    backend = fake.fake_backend()
    seen: list[tuple[str, bool]] = []

    def tokenize(text, add=True):
        seen.append(("text", add))
        return [66] * add + fake.tokenize(text)  # a "BOS" of its own, to count

    def render_chat(messages, tools=None, variables=None, add=True):
        seen.append(("chat", add))
        return [66] * add + fake.render_chat(messages, tools, variables)

    backend.tokenize, backend.render_chat = tokenize, render_chat
    with serving(backend=backend) as s:
        for flag, added in ((None, True), (True, True), (False, False)):
            extra = {} if flag is None else {"add_special_tokens": flag}
            text = s.post("/v1/completions", {"prompt": "Once", **extra}).json()
            chat = s.post("/v1/chat/completions", {"messages": USER, **extra}).json()
            assert seen[-2:] == [("text", added), ("chat", added)]
            assert text["usage"]["prompt_tokens"] == len("Once") + added
            assert chat["usage"]["prompt_tokens"] == len(fake.render_chat(USER)) + added
        bad = s.post("/v1/completions", {"prompt": "Once", "add_special_tokens": "no"})
        assert_openai_error(bad, 400, "add_special_tokens")


def test_a_model_is_retrieved_by_its_id_and_another_id_is_a_404(served: Served) -> None:
    client = served.client()
    listed = client.models.list().data[0]
    assert client.models.retrieve(listed.id).id == listed.id
    r = httpx.get(served.url + "/v1/models/other-model", timeout=T)
    assert assert_openai_error(r, 404, "model")["code"] == "model_not_found"


def test_the_routes_answer_without_v1_too_as_llama_servers_do(served: Served) -> None:
    # a base URL given without /v1 (llama-server serves both forms)
    assert httpx.get(served.url + "/models", timeout=T).json()["data"][0]["object"] == "model"
    chat = served.post("/chat/completions", {"messages": USER, "max_tokens": 3})
    assert chat.status_code == 200 and chat.json()["object"] == "chat.completion"
    text = served.post("/completions", {"prompt": "a", "max_tokens": 3})
    assert text.status_code == 200 and text.json()["choices"][0]["text"] == fake.REPLY[:3]


def test_stop_strings_cut_exactly_and_say_stop(served: Served) -> None:
    r = served.post("/v1/completions", {"prompt": "a", "stop": ["fake", "zzz"]}).json()
    assert r["choices"][0]["text"] == "Hello from the "
    assert r["choices"][0]["finish_reason"] == "stop"
    assert r["speculative"]["finish"] == "stop"
    one = served.post("/v1/completions", {"prompt": "a", "stop": "from"}).json()
    assert one["choices"][0]["text"] == "Hello "
    kept = {"prompt": "a", "stop": ["fake", "zzz"], "include_stop_str_in_output": True}
    assert (
        served.post("/v1/completions", kept).json()["choices"][0]["text"] == "Hello from the fake"
    )
    # the reply ends "time." then the end of generation: "time." was held as the start
    # of "time.!", and the end releases it, in the whole text as in a stream
    held = served.post("/v1/completions", {"prompt": "a", "stop": ["time.!"]}).json()
    assert held["choices"][0]["text"] == fake.REPLY
    assert held["choices"][0]["finish_reason"] == "stop"  # OpenAI's name for an end


def test_omitted_fields_take_the_servers_defaults_and_given_ones_win() -> None:
    defaults = Defaults(SamplingFlags(temp=0.3, top_k=7, top_p=0.5, min_p=0.2, seed=11))
    with serving(Settings(defaults=defaults)) as s:
        assert s.post("/v1/completions", {"prompt": "a"}).status_code == 200
        c = s.sched.submitted[-1].config
        assert c.params == defaults.params and c.seed == 11 and not c.ignore_eos
        assert c.max_tokens == s.sched.n_ctx_slot - 1  # -n -1: up to the slot's context
        body = {
            "prompt": "a", "temperature": 0, "top_k": 3, "top_p": 0.9, "min_p": 0.0,
            "seed": 5, "max_tokens": 7, "ignore_eos": True, "n": 1, "user": "u", "logprobs": None,
        }  # fmt: skip
        r = s.post("/v1/completions", body)
        assert r.status_code == 200
        assert r.json()["usage"]["completion_tokens"] == 7  # ignore_eos: a fixed length
        c = s.sched.submitted[-1].config
        assert c.params == SamplingParams(temp=0.0, top_k=3, top_p=0.9, min_p=0.0)
        assert (c.seed, c.max_tokens, c.ignore_eos) == (5, 7, True)
        # top_p 0 is the most likely token alone (llama-server's and OpenAI's range is [0, 1])
        assert s.post("/v1/completions", {"prompt": "a", "top_p": 0}).status_code == 200
        assert s.sched.submitted[-1].config.params.top_p == 0.0
        assert s.post("/v1/completions", {"prompt": "a", "top_p": -0.1}).status_code == 400
        s.post("/v1/completions", {"prompt": "a", "seed": -1})
        assert s.sched.submitted[-1].config.seed == 11  # -1: the default (llama.cpp's random)
        # another negative seed is a fixed one, wrapped as llama-server's uint32 seed
        s.post("/v1/completions", {"prompt": "a", "seed": -5})
        assert s.sched.submitted[-1].config.seed == 2**32 - 5
        s.post("/v1/completions", {"prompt": "a", "seed": 2**40})
        assert s.sched.submitted[-1].config.seed == 2**40  # a positive one as it is
        chat = {"messages": USER, "max_tokens": 9, "max_completion_tokens": 4}
        assert s.post("/v1/chat/completions", chat).json()["usage"]["completion_tokens"] == 4


@pytest.mark.parametrize(
    ("verify", "rules"),
    [(None, ("token", "block")), ("block", ("block", "block")), ("token", ("token", "token"))],
)
def test_the_servers_verify_rule_reaches_each_job_and_its_statistics(verify, rules) -> None:
    # --verify auto (None) is each request's own: token when it samples greedily
    with serving(Settings(defaults=Defaults(SamplingFlags(verify=verify)))) as s:
        for temperature, rule in zip((0.0, 0.8), rules, strict=True):
            r = s.post("/v1/completions", {"prompt": "a", "temperature": temperature})
            assert s.sched.submitted[-1].config.verify_rule == rule
            assert r.json()["speculative"]["verify_rule"] == rule


def test_models_lists_the_model_with_its_card(served: Served) -> None:
    models = served.client().models.list()
    (m,) = models.data
    assert m.id == "fake-model" and m.object == "model" and m.owned_by == "specgen"
    assert (m.model_extra or {})["meta"]["target"]["sha256"] == "0" * 64


def test_health_is_503_while_loading_and_other_routes_say_so() -> None:
    with serving(loaded=False) as s:
        r = httpx.get(s.url + "/health", timeout=T)
        assert r.status_code == 503 and r.json()["error"]["message"] == "Loading model"
        r = s.post("/v1/completions", {"prompt": "a"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "loading"
        s.state.backend = fake.fake_backend()
        assert httpx.get(s.url + "/health", timeout=T).json() == {"status": "ok"}
        assert httpx.head(s.url + "/health", timeout=T).status_code == 200  # load balancers
        s.state.draining = True
        assert httpx.get(s.url + "/health", timeout=T).status_code == 503
        assert s.post("/v1/completions", {"prompt": "a"}).json()["error"]["code"] == "shutdown"


# -- bad input -----------------------------------------------------------------------------


def assert_openai_error(r: httpx.Response, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"] and err["type"]
    if param is not None:
        assert err["param"] == param
    return err


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {}}}]

BAD_CHAT = [
    ({"messages": USER, "max_tokens": "10"}, "max_tokens"),
    ({"messages": USER, "max_tokens": 0}, "max_tokens"),
    ({"messages": USER, "max_tokens": -3}, "max_tokens"),
    ({"messages": USER, "temperature": "hot"}, "temperature"),
    ({"messages": USER, "stream": "yes"}, "stream"),
    ({"messages": USER, "top_p": 1.5}, "top_p"),
    ({"messages": USER, "n": 0}, "n"),
    ({"messages": USER, "n": 99}, "n"),  # more choices than slots
    ({"messages": USER, "tool_choice": "sometimes", "tools": TOOLS}, "tool_choice"),
    ({"messages": USER, "logit_bias": {"1": "x"}}, "logit_bias.1"),
    ({"messages": USER, "stop": ""}, "stop"),
    ({"messages": USER, "stop": [1, 2]}, "stop"),
    ({"messages": USER, "stop": ["x"] * 17}, "stop"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, None),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0]"),
    ({}, "messages"),
]


@pytest.mark.parametrize(
    ("body", "param"), BAD_CHAT, ids=[f"{i}-{p}" for i, (_, p) in enumerate(BAD_CHAT)]
)
def test_bad_fields_are_refused_with_400_and_the_field(served: Served, body, param) -> None:
    err = assert_openai_error(served.post("/v1/chat/completions", body), 400, param)
    assert err["type"] == "invalid_request_error"
    # the field once, named by its path alone (not pydantic's union member)
    assert not err["message"].startswith(f"{param}: {param} ") and "literal[" not in err["message"]
    assert served.sched.submitted == []
    # the server keeps serving
    assert served.post("/v1/chat/completions", {"messages": USER}).status_code == 200


def test_malformed_json_and_non_objects_are_400(served: Served) -> None:
    for raw in (b"{", b'{"messages": [}', b"[]", b"null", b"", "\u00e9".encode("latin-1")):
        r = httpx.post(
            served.url + "/v1/chat/completions",
            content=raw,
            headers={"content-type": "application/json"},
            timeout=T,
        )
        assert_openai_error(r, 400, None)
    assert served.post("/v1/completions", {"prompt": "ok"}).status_code == 200
    assert len(served.log) >= 6  # one line per refusal


def test_prompts_and_lengths_that_cannot_fit_the_context(served: Served) -> None:
    n_ctx = served.sched.n_ctx_slot
    err = assert_openai_error(served.post("/v1/completions", {"prompt": "x" * n_ctx}), 400)
    assert err["code"] == "context_length_exceeded" and "-c" in err["message"]
    body = {"prompt": "abc", "max_tokens": n_ctx}
    err = assert_openai_error(served.post("/v1/completions", body), 400, "max_tokens")
    assert err["code"] == "context_length_exceeded"
    assert f"at most {n_ctx - 3}" in err["message"]
    fits = {"prompt": "abc", "max_tokens": n_ctx - 3, "ignore_eos": True}
    assert served.post("/v1/completions", fits).json()["usage"]["completion_tokens"] == n_ctx - 3
    assert_openai_error(served.post("/v1/completions", {"prompt": [999]}), 400, "prompt")
    assert_openai_error(served.post("/v1/completions", {"prompt": []}), 400, "prompt")
    # which of several prompts does not fit
    err = assert_openai_error(served.post("/v1/completions", {"prompt": ["a", "x" * n_ctx]}), 400)
    assert err["code"] == "context_length_exceeded" and err["message"].startswith("prompt 1: ")


def test_chat_without_a_template_and_a_failing_template_are_400() -> None:
    with serving(backend=fake.fake_backend(chat=False)) as s:
        err = assert_openai_error(s.post("/v1/chat/completions", {"messages": USER}), 400)
        assert err["code"] == "no_chat_template" and "/v1/completions" in err["message"]
    backend = fake.fake_backend()

    def broken(messages, tools=None, variables=None, add=True):
        raise ChatTemplateError("line 1: Conversation roles must alternate")

    backend.render_chat = broken
    with serving(backend=backend) as s:
        err = assert_openai_error(s.post("/v1/chat/completions", {"messages": USER}), 400)
        assert err["code"] == "template_error" and "alternate" in err["message"]


def test_unknown_routes_and_methods_answer_in_the_openai_shape(served: Served) -> None:
    assert_openai_error(httpx.get(served.url + "/v1/nothing", timeout=T), 404)
    assert_openai_error(httpx.get(served.url + "/v1/chat/completions", timeout=T), 405)


def test_a_silent_connection_is_closed_and_a_trickled_body_is_a_408() -> None:
    """A connection that sends no request head within the head timeout is closed (such
    connections were kept for ever: 20,000 of them took every file descriptor, no key
    needed), on a fresh connection and on a kept-alive one between requests; a body that
    has not come whole within the body timeout is a 408, or a 413 when announced over the
    limit. The test waits for the server's
    answer, bounded far above the timeouts (no timing is asserted)."""
    from specgen.server import wire

    http = wire.uvicorn_options(head_timeout_s=0.2)
    with serving(Settings(body_timeout_s=0.2, max_body_bytes=1000), http=http) as s:
        host, port = s.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=T) as raw:
            assert raw.recv(4096) == b""  # closed by the server, nothing sent
        with socket.create_connection((host, int(port)), timeout=T) as raw:
            raw.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # a head never ended
            assert raw.recv(4096) == b""
        with socket.create_connection((host, int(port)), timeout=T) as raw:
            raw.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert raw.recv(4096).startswith(b"HTTP/1.1 200")
            raw.sendall(b"GET /health HTTP/1.1\r\n")  # the next request, its head unended
            assert raw.recv(4096) == b""
        # a body that stops coming: under the limit a 408; announced over it, a 413 (its
        # rest was awaited for ever before the 413: the connection and its file descriptor
        # held), and closed either way
        for length, status, code in ((100, b"408", b"request_timeout"),
                                     (2000, b"413", b"request_too_large")):  # fmt: skip
            with socket.create_connection((host, int(port)), timeout=T) as raw:
                raw.sendall(
                    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                    b'\r\nContent-Length: %d\r\n\r\n{"prompt"' % length
                )
                answer = raw.recv(4096)
                assert answer.startswith(b"HTTP/1.1 " + status) and code in answer, answer
                assert raw.recv(4096) == b""
        assert s.sched.submitted == []
        assert s.post("/v1/completions", {"prompt": "Hi"}).status_code == 200


def test_a_bug_is_a_500_in_the_openai_shape_and_one_log_line(monkeypatch) -> None:
    """An exception no handler expects (a logit_bias id past int64 made numpy raise
    OverflowError) was Starlette's plain-text 500 and a traceback in the log; now the
    client reads OpenAI's shape, the log gets one line, and the next request is served."""
    monkeypatch.delenv("SPECGEN_DEBUG", raising=False)

    class Buggy(fake.FakeScheduler):
        def submit(self, job, sink):
            if job.config.max_tokens == 7:
                raise OverflowError("Python int too large to convert to C long")
            return super().submit(job, sink)

    sched = Buggy()
    with serving(backend=fake.fake_backend(sched)) as s:
        err = assert_openai_error(s.post("/v1/completions", {"prompt": "Hi", "max_tokens": 7}), 500)
        assert err["type"] == "server_error" and "OverflowError" in err["message"], err
        assert [x for x in s.log if "500 unexpected OverflowError" in x], s.log
        assert s.post("/v1/completions", {"prompt": "Hi", "max_tokens": 4}).status_code == 200


def test_the_body_limit_refuses_before_parsing() -> None:
    with serving(Settings(max_body_bytes=1000)) as s:
        big = {"messages": [{"role": "user", "content": "x" * 2000}]}
        err = assert_openai_error(s.post("/v1/chat/completions", big), 413)
        assert err["code"] == "request_too_large"

        def chunked():  # no Content-Length: counted as it arrives
            yield b'{"messages": [{"role": "user", "content": "'
            for _ in range(10):
                yield b"y" * 200
            yield b'"}]}'

        r = httpx.post(s.url + "/v1/chat/completions", content=chunked(), timeout=T)
        assert_openai_error(r, 413)
        # one chunk over the limit that is also the body's last: nothing left to read
        whole = iter([b'{"prompt": "' + b"z" * 2000 + b'"}'])
        assert_openai_error(httpx.post(s.url + "/v1/completions", content=whole, timeout=T), 413)
        # `Expect: 100-continue`: the client waits for this answer before its body
        host, port = s.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=T) as raw:
            raw.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                b"\r\nContent-Length: 5000\r\nExpect: 100-continue\r\n\r\n"
            )
            assert raw.recv(4096).startswith(b"HTTP/1.1 413")
        assert s.sched.submitted == []
        text = httpx.get(s.url + "/metrics", timeout=T).text
        assert 'specgen_requests_refused_total{status="413"}' in text
        assert any("POST /v1/chat/completions: 413 the request body is over" in x for x in s.log)
        assert s.post("/v1/chat/completions", {"messages": USER}).status_code == 200


# -- security ------------------------------------------------------------------------------


def test_a_client_that_sends_its_whole_body_first_reads_the_413() -> None:
    """Python's http.client (under urllib) writes the whole body before reading: a 3 MiB body
    over the 1 MiB limit is read to its end and answered 413, where closing on the unread
    body broke the pipe under the client's writes (BrokenPipeError before the change)."""
    import http.client
    from urllib.parse import urlsplit

    with serving(Settings(max_body_bytes=1 << 20)) as s:
        where = urlsplit(s.url)
        for _ in range(3):
            conn = http.client.HTTPConnection(where.hostname, where.port, timeout=T)
            body = b'{"prompt": "' + b"x" * (3 << 20) + b'"}'
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            r = conn.getresponse()
            assert r.status == 413 and b"request_too_large" in r.read()
            conn.close()


def test_the_api_key_guards_every_route_but_health() -> None:
    key = "s3cret-key"
    with serving(Settings(api_key=key)) as s:
        for path in ("/v1/models", "/metrics"):
            assert_openai_error(httpx.get(s.url + path, timeout=T), 401)
        err = assert_openai_error(s.post("/v1/completions", {"prompt": "a"}), 401)
        assert err["code"] == "invalid_api_key"
        wrong = {"Authorization": "Bearer nope"}
        assert_openai_error(s.post("/v1/completions", {"prompt": "a"}, headers=wrong), 401)
        with pytest.raises(openai.AuthenticationError):
            s.client("nope").models.list()
        assert httpx.get(s.url + "/health", timeout=T).status_code == 200
        r = s.client(key).completions.create(model="x", prompt="a", max_tokens=3)
        assert r.choices[0].text == fake.REPLY[:3]
        assert s.sched.submitted and len(s.sched.submitted) == 1
        assert not any(key in line for line in s.log)
        # counted and logged as the routes' refusals are (the key never in the log)
        assert sum("401 missing API key" in line for line in s.log) == 3
        assert sum("401 invalid API key" in line for line in s.log) == 2
        auth = {"Authorization": f"Bearer {key}"}
        text = httpx.get(s.url + "/metrics", headers=auth, timeout=T).text
        assert 'specgen_requests_refused_total{status="401"} 5.0' in text


def test_no_cors_unless_asked_and_other_pages_refused() -> None:
    """No CORS headers unless --cors; and a request from a web page of an origin not given
    (its Origin header) is a 403, whatever its content type: a "simple" text/plain POST
    from any page an operator opened was served (cross-site request forgery), the answer
    hidden from the page but the generation run. Clients outside a browser send no
    Origin and are served as before."""
    origin = {"Origin": "https://app.example"}
    with serving() as s:
        r = s.post("/v1/completions", {"prompt": "a"}, headers=origin)
        err = assert_openai_error(r, 403)
        assert err["code"] == "origin_not_allowed" and "--cors" in err["message"]
        assert "access-control-allow-origin" not in r.headers
        forged = httpx.post(s.url + "/v1/completions", content=b'{"prompt": "a"}', timeout=T,
                            headers={**origin, "Content-Type": "text/plain"})  # fmt: skip
        assert forged.status_code == 403 and s.sched.submitted == []
        assert s.post("/v1/completions", {"prompt": "a"}).status_code == 200
    with serving(Settings(cors=("https://app.example",), api_key="k")) as s:
        pre = httpx.options(
            s.url + "/v1/chat/completions",
            headers={**origin, "Access-Control-Request-Method": "POST",
                     "Access-Control-Request-Headers": "authorization,content-type"},
        )  # fmt: skip
        assert pre.status_code == 200
        assert pre.headers["access-control-allow-origin"] == "https://app.example"
        r = s.post(
            "/v1/completions", {"prompt": "a"}, headers={**origin, "Authorization": "Bearer k"}
        )
        assert r.headers["access-control-allow-origin"] == "https://app.example"
        other = {"Origin": "https://evil.example", "Authorization": "Bearer k"}
        r = s.post("/v1/completions", {"prompt": "a"}, headers=other)
        assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
        pre = httpx.options(
            s.url + "/v1/chat/completions",
            headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
        )  # another origin's preflight: the same 403, in OpenAI's shape
        assert assert_openai_error(pre, 403)["code"] == "origin_not_allowed"
    with serving(Settings(cors=("*",))) as s:  # every page, as CORS's own "*" (was none)
        r = s.post("/v1/completions", {"prompt": "a"}, headers={"Origin": "https://any.example"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"


def test_the_loopback_rule_for_the_open_server_warning() -> None:
    assert runner.open_warning("127.0.0.1", None) is None
    assert runner.open_warning("localhost", None) is None
    assert runner.open_warning("::1", None) is None
    assert runner.open_warning("0.0.0.0", "key") is None
    warning = runner.open_warning("0.0.0.0", None)
    assert warning is not None and "anyone" in warning and "--api-key" in warning
    assert runner.open_warning("example.com", None) is not None
    assert runner.open_warning("127.1", None) is None  # the resolver's shorthand for 127.0.0.1


def test_a_loopback_server_serves_only_requests_naming_a_loopback_host() -> None:
    """DNS rebinding: a page whose own domain name now points at 127.0.0.1 reads the
    loopback server's answers as same-origin ones, its requests naming that domain in
    Host: refused (403) on a server bound to loopback, served on one bound for others."""
    with serving(Settings(loopback_only=True)) as s:
        port = s.url.rsplit(":", 1)[1]
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "app.localhost"):
            r = httpx.get(s.url + "/v1/models", headers={"Host": host}, timeout=T)
            assert r.status_code == 200, host
        r = httpx.get(s.url + "/v1/models", headers={"Host": f"rebound.example:{port}"}, timeout=T)
        err = assert_openai_error(r, 403)
        assert err["code"] == "host_not_allowed" and "rebound.example" in err["message"]
        assert s.post("/v1/completions", {"prompt": "a"}).status_code == 200
    with serving(Settings(loopback_only=False)) as s:
        r = httpx.get(s.url + "/v1/models", headers={"Host": "lan-name.example"}, timeout=T)
        assert r.status_code == 200


# -- slots, queue, disconnects, failures ---------------------------------------------------


def open_stream(s: Served, prompt: str) -> tuple[httpx.Client, httpx.Response]:
    client = httpx.Client(timeout=T)
    req = client.build_request(
        "POST", s.url + "/v1/completions", json={"prompt": prompt, "stream": True}
    )
    return client, client.send(req, stream=True)


def test_queue_full_is_503_with_retry_after_and_a_disconnect_frees_the_slot() -> None:
    with serving(backend=fake.fake_backend(fake.FakeScheduler(n_parallel=1, queue_max=1))) as s:
        client, held = open_stream(s, "HOLD the slot")
        lines = held.iter_lines()
        assert next(lines).startswith("data: ")  # its first round arrived: the slot is busy
        s.sched.wait(lambda f: f.held() == 1)
        waiting: dict[str, httpx.Response] = {}
        t = threading.Thread(
            target=lambda: waiting.setdefault("r", s.post("/v1/completions", {"prompt": "next"}))
        )
        t.start()
        s.sched.wait(lambda f: f.queue_depth == 1)
        r = s.post("/v1/completions", {"prompt": "one too many"})
        err = assert_openai_error(r, 503)
        assert err["code"] == "queue_full" and r.headers["retry-after"] == "1"
        held.close()  # the client goes away mid-stream
        client.close()
        t.join(10)
        assert waiting["r"].status_code == 200  # the queued request got the slot
        assert waiting["r"].json()["choices"][0]["text"] == fake.REPLY
        assert len(s.sched.cancelled) == 1 and s.sched.cancelled[0].startswith("cmpl-")
        assert any("finish cancelled" in line for line in s.log)


def test_a_stream_cancelled_after_its_first_token_counts_its_ttft() -> None:
    """/metrics' TTFT histogram counts a request that ended by a client going away after
    its first token (it ends without stats: the wall time to that token is counted)."""

    def ttft_count(s: Served) -> float:
        page = httpx.get(s.url + "/metrics", timeout=T).text
        line = next(
            x
            for x in page.splitlines()
            if x.startswith("specgen_time_to_first_token_seconds_count")
        )
        return float(line.split()[-1])

    with serving(backend=fake.fake_backend(fake.FakeScheduler(n_parallel=1, queue_max=1))) as s:
        client, held = open_stream(s, "HOLD the slot")
        lines = held.iter_lines()  # kept: a dropped iterator closes the stream
        assert next(lines).startswith("data: ")  # its first token arrived
        before = ttft_count(s)
        held.close()
        client.close()
        s.sched.wait(lambda f: len(f.cancelled) == 1)
        # the server cancels and then counts the request in one stretch of its event loop
        # (`Run._cancel`), which serves /metrics too: the next page shows the count
        assert ttft_count(s) == before + 1


def _post_and_leave(served: Served, fields: dict, started) -> None:
    """POST a non-streaming completion on a raw socket, wait until `started(scheduler)`
    holds, then close the socket without reading the answer."""
    body = json.dumps(fields).encode()
    port = int(served.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        served.sched.wait(started)


def test_a_client_leaving_a_non_streaming_request_cancels_its_job(served: Served) -> None:
    _post_and_leave(served, {"prompt": "HOLD"}, lambda f: f.held() == 1)
    served.sched.wait(lambda f: len(f.cancelled) == 1 and f.slots_busy == 0)


def test_a_client_leaving_a_request_that_keeps_generating_frees_its_slot(served: Served) -> None:
    """A non-streaming request whose job sends events all the time (a round every 50 ms):
    the client's leaving is noticed within the poll interval all the same (it was looked
    for only after half a second without an event, so such a job kept its slot to the
    end: 443 and 949 tokens later in a helper's test). The fake's job never ends by
    itself, so only the server's noticing can end it, on a machine of any speed."""
    _post_and_leave(served, {"prompt": "SLOW", "max_tokens": 8}, lambda f: f.slots_busy == 1)
    served.sched.wait(lambda f: len(f.cancelled) == 1 and f.slots_busy == 0)


def test_a_failure_inside_a_round_ends_only_that_request(served: Served) -> None:
    with httpx.stream(
        "POST", served.url + "/v1/completions", json={"prompt": "FAIL", "stream": True}
    ) as r:
        chunks = chunks_of(sse_lines(r))
    final = chunks[-1]
    assert final["choices"][0]["finish_reason"] == "abort"
    assert final["error"]["type"] == "server_error" and "planted" in final["error"]["message"]
    assert final["speculative"]["finish"] == "failed"
    err = assert_openai_error(served.post("/v1/completions", {"prompt": "FAIL"}), 500)
    assert err["code"] == "engine"
    assert served.post("/v1/completions", {"prompt": "fine"}).status_code == 200


def test_shutdown_ends_a_stream_with_a_final_chunk(served: Served) -> None:
    client, r = open_stream(served, "HOLD")
    try:
        lines = r.iter_lines()
        first = next(lines)
        served.sched.wait(lambda f: f.held() == 1)
        served.sched.shutdown()
        rest = [line for line in lines if line.startswith("data: ")]
    finally:
        r.close()
        client.close()
    chunks = chunks_of([first, *rest])
    final = chunks[-1]
    assert final["choices"][0]["finish_reason"] == "abort"
    assert final["error"]["code"] == "shutdown"
    assert "param" in final["error"] and final["error"]["param"] is None  # as OpenAI's body
    assert final["speculative"]["finish"] == "interrupted"


def test_shutdown_counts_a_queued_request_as_interrupted_too() -> None:
    """One label for a shutdown, whether the request was generating or waiting for a slot
    (a queued one was logged and counted "failed", as a server error is)."""
    with serving(backend=fake.fake_backend(fake.FakeScheduler(n_parallel=1))) as s:
        c1, held = open_stream(s, "HOLD the slot")
        c2, queued = open_stream(s, "waits")
        try:
            s.sched.wait(lambda f: f.held() == 1 and f.queue_depth == 1)
            s.sched.shutdown()
            chunks = chunks_of([x for x in queued.iter_lines() if x.startswith("data: ")])
        finally:
            held.close(), queued.close(), c1.close(), c2.close()
        final = chunks[-1]
        assert final["error"]["code"] == "shutdown"
        assert final["speculative"]["finish"] == "interrupted"
        assert any("finish interrupted" in x for x in s.log) and not any(
            "finish failed" in x for x in s.log
        ), s.log


# -- metrics and the log -------------------------------------------------------------------


def test_metrics_count_requests_tokens_and_steps(served: Served) -> None:
    served.post("/v1/completions", {"prompt": "a", "max_tokens": 10})
    served.post("/v1/chat/completions", {"messages": "nope"})
    report = BatchReport(
        n_rows=9, n_slots=2, k=(3, 4), decode_s=0.04, draft_s=0.02, step_s=0.07, host_s=0.004,
        queue_depth=0, slots_busy=2, target_line=Line(0.04, 0.005), draft_line=Line(0.015, 0.0025),
        spec_overhead_s=0.006,
    )  # fmt: skip
    served.state.metrics.observe_batch(report)
    text = httpx.get(served.url + "/metrics", timeout=T).text
    assert 'specgen_requests_total{finish="length",route="completions"} 1.0' in text
    assert "specgen_generation_tokens_total 10.0" in text
    assert 'specgen_requests_refused_total{status="400"} 1.0' in text
    assert 'specgen_draft_position_proposed_total{position="1"}' in text
    assert "specgen_k_chosen_count 2.0" in text
    assert "specgen_host_seconds_per_slot_sum 0.002" in text
    assert "specgen_queue_depth" in text and "specgen_slots_busy" in text
    assert 'specgen_controller_cost_seconds{model="draft",term="slope"} 0.0025' in text
    assert 'specgen_controller_cost_seconds{model="target",term="intercept"} 0.04' in text
    assert 'specgen_controller_cost_seconds{model="step",term="spec_overhead"} 0.006' in text


def test_one_log_line_per_request(served: Served) -> None:
    served.post("/v1/completions", {"prompt": "abc", "max_tokens": 4})
    (line,) = [x for x in served.log if x.startswith("cmpl-")]
    assert "prompt 3 tokens" in line and "output 4 tokens" in line
    assert "acceptance" in line and "tok/s" in line and line.endswith("finish length")


class _RecordingLoop:
    """Stands for an event loop: records the callbacks handed to it."""

    def __init__(self, closed: bool = False) -> None:
        self.calls: list = []
        self.closed = closed

    def call_soon_threadsafe(self, fn, *args) -> None:
        if self.closed:
            raise RuntimeError("Event loop is closed")
        self.calls.append((fn, args))


def test_a_steps_events_wake_each_event_loop_once_in_the_order_sent() -> None:
    one, other = _RecordingLoop(), _RecordingLoop()
    a, b, c = Events(one), Events(one), Events(other)  # type: ignore[arg-type]
    plain: list = []
    job = Job("j", [1], GenerateConfig(4, SamplingParams()))
    ev = [Failed(f"event {i}", "engine") for i in range(5)]
    batch = [(Ticket(job, a), ev[0]), (Ticket(job, b), ev[1]), (Ticket(job, plain.append), ev[2])]
    batch += [(Ticket(job, c), ev[3]), (Ticket(job, a), ev[4])]
    deliver(batch)
    assert len(one.calls) == 1 and len(other.calls) == 1  # one wake-up per loop
    assert plain == [ev[2]]  # a sink that is not a request's queue is called in turn
    for loop in (one, other):
        fn, args = loop.calls[0]
        fn(*args)
    # (choice index, event): each request's sink is its choice 0's
    assert [a.queue.get_nowait(), a.queue.get_nowait()] == [(0, ev[0]), (0, ev[4])]
    assert b.queue.get_nowait() == (0, ev[1]) and c.queue.get_nowait() == (0, ev[3])
    closed = Events(_RecordingLoop(closed=True))  # type: ignore[arg-type]
    deliver([(Ticket(job, closed), ev[0])])  # the process is ending: nobody listens
    assert closed.queue.empty()


def test_n_choices_are_indexed_seeded_apart_and_share_choice_0s_prompt(served: Served) -> None:
    client = served.client()
    r = client.chat.completions.create(model="x", messages=USER, n=2, seed=40)  # type: ignore[arg-type]
    assert [c.index for c in r.choices] == [0, 1]
    assert all(c.message.content == fake.REPLY and c.finish_reason == "stop" for c in r.choices)
    assert r.usage is not None and r.usage.completion_tokens == 2 * len(fake.REPLY)
    assert r.usage.prompt_tokens == len(fake.render_chat(USER))  # the prompt counted once
    first, second = served.sched.submitted[-2:]
    assert (first.config.seed, second.config.seed) == (40, 41)  # seed + choice index
    assert first.share_from is None and second.share_from == first.id == r.id
    body = {"prompt": "ab", "n": 2, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", served.url + "/v1/completions", json=body, timeout=10) as resp:
        chunks = chunks_of(sse_lines(resp))
    *rounds, usage = chunks
    texts = {0: "", 1: ""}
    finals = []
    for c in rounds:
        (choice,) = c["choices"]
        texts[choice["index"]] += choice["text"]
        if choice["finish_reason"] is not None:
            finals.append(choice["index"])
    assert sorted(finals) == [0, 1] and texts == {0: fake.REPLY, 1: fake.REPLY}
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 2 * len(fake.REPLY)
    # chat, streamed with the openai client: each choice opens with its role, then its
    # content and its finish under its own index
    stream = client.chat.completions.create(model="x", messages=USER, n=2, stream=True)  # type: ignore[arg-type]
    roles, content, finished = [], {0: "", 1: ""}, []
    for chunk in stream:
        (c,) = chunk.choices
        if c.delta.role is not None:
            roles.append(c.index)
        content[c.index] += c.delta.content or ""
        if c.finish_reason is not None:
            finished.append(c.index)
    assert roles == [0, 1] and sorted(finished) == [0, 1]
    assert content == {i: fake.REPLY for i in range(2)}


def test_several_prompts_are_n_choices_each_in_openais_order(served: Served) -> None:
    """A list of prompts (OpenAI's array forms; lm-evaluation-harness batches token ids):
    choice ``p * n + i`` is prompt p's i-th, seeded ``seed + i`` as the prompt sent alone,
    sharing its prompt's prefill; usage counts each prompt once; echo is each choice's own
    prompt, whole and streamed."""
    client = served.client()
    r = client.completions.create(
        model="x", prompt=["ab", "cde"], n=2, seed=7, echo=True, max_tokens=5
    )
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert [c.text for c in r.choices] == [p + fake.REPLY[:5] for p in ("ab", "ab", "cde", "cde")]
    assert r.usage is not None and (r.usage.prompt_tokens, r.usage.completion_tokens) == (5, 20)
    jobs = served.sched.submitted[-4:]
    assert [j.prompt for j in jobs] == [fake.tokenize(p) for p in ("ab", "ab", "cde", "cde")]
    assert [j.config.seed for j in jobs] == [7, 8, 7, 8]
    assert [j.id for j in jobs] == [r.id, f"{r.id}-1", f"{r.id}-2", f"{r.id}-3"]
    assert [j.share_from for j in jobs] == [None, r.id, None, f"{r.id}-2"]
    body = {"prompt": [[104, 105], [106]], "echo": True, "max_tokens": 3, "stream": True}
    with httpx.stream("POST", served.url + "/v1/completions", json=body, timeout=T) as resp:
        chunks = chunks_of(sse_lines(resp))
    for i, prompt in enumerate(("hi", "j")):
        texts = [c["choices"][0]["text"] for c in chunks if c["choices"][0]["index"] == i]
        assert texts[0] == prompt and "".join(texts) == prompt + fake.REPLY[:3]
    # more choices than the slots and the queue hold: refused whole, nothing queued
    before = len(served.sched.submitted)
    room = served.sched.n_parallel + served.sched.queue_max
    many = {"prompt": ["a"] * (room // 2 + 1), "n": 2}
    err = assert_openai_error(served.post("/v1/completions", many), 400, "prompt")
    assert f"at most {room // 2} prompts" in err["message"]
    assert len(served.sched.submitted) == before


# -- echo ------------------------------------------------------------------------------------


def test_echo_puts_the_prompt_before_the_completion_whole_and_streamed(served: Served) -> None:
    # the values of the prompt's logprobs come from the engine: test_server_models.py
    for prompt, shown in (("Say hi", "Say hi"), ([104, 105], "hi"), ([[104, 105]], "hi")):
        r = served.post("/v1/completions", {"prompt": prompt, "echo": True, "max_tokens": 5})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == shown + fake.REPLY[:5]
        assert r.json()["usage"]["completion_tokens"] == 5
    body = {"prompt": "Say hi", "echo": True, "max_tokens": 5, "stream": True, "n": 2}
    with httpx.stream("POST", served.url + "/v1/completions", json=body, timeout=T) as r:
        chunks = chunks_of(sse_lines(r))
    for i in (0, 1):
        texts = [c["choices"][0]["text"] for c in chunks if c["choices"][0]["index"] == i]
        assert texts[0] == "Say hi" and "".join(texts) == "Say hi" + fake.REPLY[:5]


def test_max_tokens_zero_is_served_with_echo_only_and_echo_needs_the_vocabulary() -> None:
    with serving() as s:
        r = s.post("/v1/completions", {"prompt": "Say hi", "max_tokens": 0})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
        assert "echo" in r.json()["error"]["message"]
        r = s.post("/v1/completions", {"prompt": "Say hi", "max_tokens": 0, "echo": True})
        assert r.status_code == 200, r.text
        assert s.sched.submitted[-1].config.max_tokens == 0
        r = s.post("/v1/completions", {"prompt": "a", "echo": True, "logprobs": 2})
        assert s.sched.submitted[-1].config.prompt_logprobs == 2
        s.post("/v1/completions", {"prompt": "a", "logprobs": 2})  # no echo: not the prompt's
        assert s.sched.submitted[-1].config.prompt_logprobs is None
    backend = fake.fake_backend()
    backend.vocabulary = None
    with serving(backend=backend) as s:
        r = s.post("/v1/completions", {"prompt": "Say hi", "echo": True})
        assert r.status_code == 400 and r.json()["error"]["param"] == "echo"


# -- the tokenizer routes ----------------------------------------------------------------------


def test_tokenize_and_detokenize_answer_vllms_and_llama_servers_clients(served: Served) -> None:
    ids = fake.tokenize("Say hi")
    for body in ({"prompt": "Say hi"}, {"content": "Say hi", "with_pieces": False}):
        r = served.post("/tokenize", body)
        assert r.status_code == 200, r.text
        assert r.json()["tokens"] == ids and r.json()["count"] == len(ids)
        assert r.json()["max_model_len"] == served.sched.n_ctx_slot
    r = served.post("/detokenize", {"tokens": ids})
    assert r.json() == {"prompt": "Say hi", "content": "Say hi"}
    info = httpx.get(served.url + "/tokenizer_info", timeout=T).json()
    assert {"eos_token", "bos_token", "chat_template"} <= set(info)
    for path, body, param in (
        ("/tokenize", {"prompt": "a", "content": "b"}, "prompt"),
        ("/tokenize", {}, "prompt"),
        ("/detokenize", {"tokens": [fake.N_VOCAB]}, "tokens"),
        ("/detokenize", {"tokens": "abc"}, "tokens"),
    ):
        r = served.post(path, body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)


def test_the_tokenizer_routes_need_the_key_and_a_vocabulary() -> None:
    with serving(Settings(api_key="sekrit")) as s:
        assert s.post("/tokenize", {"prompt": "a"}).status_code == 401
        r = s.post("/tokenize", {"prompt": "a"}, headers={"Authorization": "Bearer sekrit"})
        assert r.status_code == 200
    backend = fake.fake_backend()
    backend.vocabulary = None
    with serving(backend=backend) as s:
        assert s.post("/tokenize", {"prompt": "a"}).status_code == 404


def test_echo_offsets_follow_the_text_sent() -> None:
    from specgen.server.logprobs import Echo

    pieces = {1: b"<s>", 2: b"a", 3: b"b", 4: b"\xc3", 5: b"\xa9", 6: b"!", 7: b"<|im|>"}
    # a BOS the tokenizer added takes no characters; a special token's text does
    e = Echo.of("ab", [1, 2, 3], pieces.__getitem__)
    assert (e.text, e.offsets) == ("ab", [0, 0, 1])
    e = Echo.of("<|im|>ab", [7, 2, 3], pieces.__getitem__)
    assert e.offsets == [0, 6, 7]
    # UTF-8 split across tokens: é starts where its first byte's token is
    e = Echo.of(None, [2, 4, 5, 6], pieces.__getitem__)
    assert (e.text, e.offsets) == ("aé!", [0, 1, 1, 2])
    lp = e.legacy_logprobs()  # before the prompt's values came: the first token alone
    assert lp == {"tokens": ["a"], "token_logprobs": [None], "top_logprobs": [None],
                  "text_offset": [0]}  # fmt: skip


def test_echo_false_is_accepted_on_chat_and_the_tokenizer_routes_are_strict(
    served: Served,
) -> None:
    r = served.post("/v1/chat/completions", {"messages": USER, "echo": False})
    assert r.status_code == 200, r.text
    assert served.post("/v1/chat/completions", {"messages": USER, "echo": True}).status_code == 400
    for path, body in (
        ("/tokenize", {"prompt": "hi", "add_special_tokens": "no"}),
        ("/tokenize", {"prompt": "hi", "add_special_tokens": 0}),
        ("/detokenize", {"tokens": [True]}),
        ("/detokenize", {"tokens": ["1"]}),
    ):
        assert served.post(path, body).status_code == 400, body


def test_a_legacy_top_logprobs_object_names_the_chosen_token_too() -> None:
    from specgen.events import Span
    from specgen.logprobs import TokenLogprob
    from specgen.server.logprobs import text_logprobs

    best = TokenLogprob(5, -0.1, b"a")
    chosen = TokenLogprob(7, -2.5, b"b", (best,))  # sampled, not the most likely
    alone = TokenLogprob(9, -0.3, b"c")  # logprobs 0: no alternatives
    out = text_logprobs([Span("b", 7, False, logprob=chosen), Span("c", 9, False, logprob=alone)])
    assert out["top_logprobs"] == [{"a": -0.1, "b": -2.5}, {"c": -0.3}]


def test_legacy_text_offsets_count_tokens_not_the_text_released() -> None:
    """A token held back from the text (it might start a stop string) still starts where it
    stands, and a UTF-8 character split across tokens starts at its first byte's token;
    a stream's chunks continue one count."""
    from specgen.events import Span
    from specgen.logprobs import TokenLogprob
    from specgen.server.logprobs import TextOffsets, text_logprobs

    def span(text: str, piece: bytes) -> Span:
        return Span(text, 1, False, logprob=TokenLogprob(1, -0.5, piece))

    spans = [
        span("", b"a"),
        span("ab", b"b"),
        span("", b"\xc3"),
        span("\u00e9", b"\xa9"),
        span("c", b"c"),
    ]
    assert text_logprobs(spans)["text_offset"] == [0, 1, 2, 2, 3]
    counted = TextOffsets(10)  # after an echoed prompt of 10 characters, in two chunks
    first, rest = text_logprobs(spans[:3], counted), text_logprobs(spans[3:], counted)
    assert first["text_offset"] + rest["text_offset"] == [10, 11, 12, 12, 13]


def test_a_text_part_without_text_is_named_so(served: Served) -> None:
    body = {"messages": [{"role": "user", "content": [{"type": "text"}]}]}
    err = assert_openai_error(served.post("/v1/chat/completions", body), 400)
    assert "needs its 'text'" in err["message"] and "only text parts" not in err["message"]


def test_a_path_cannot_write_lines_into_the_log() -> None:
    """The per-request log shows a refused request's path with control characters
    escaped: ``%0A`` decoded to a newline forged a whole "specgen: serving ..." line, for
    any client (the 401 is logged before any key is checked)."""
    with serving(Settings(api_key="k")) as s:
        r = httpx.get(s.url + "/x%0Aspecgen:%20serving%20evil%1b[31m", timeout=T)
        assert r.status_code == 401
        line = next(x for x in s.log if "401" in x)
        assert "\n" not in line and "\x1b" not in line
        assert "/x\\nspecgen: serving evil\\x1b[31m" in line


def test_a_trailing_slash_is_not_redirected_to_the_host_the_client_named(served: Served) -> None:
    r = httpx.get(served.url + "/v1/models/", headers={"Host": "evil.example"}, timeout=T)
    assert r.status_code == 404 and "location" not in r.headers
    assert_openai_error(r, 404)


def test_a_prompt_no_context_can_hold_is_refused_before_it_is_tokenized() -> None:
    """Text over a slot's context times the longest token's text cannot fit whatever its
    tokens: a 400 context_length_exceeded before tokenizing it (60 prompts of 1 MiB, each
    tokenized whole only to be refused, held a small request up 7 s)."""
    backend = fake.fake_backend()
    backend.max_token_bytes = 2  # the fake's slot: 256 tokens, so 512 bytes at most
    seen: list[str] = []

    def tokenize(text, add=True):
        seen.append(text)
        return fake.tokenize(text)

    backend.tokenize = tokenize
    with serving(backend=backend) as s:
        err = assert_openai_error(s.post("/v1/completions", {"prompt": "x" * 513}), 400, "prompt")
        assert err["code"] == "context_length_exceeded" and "513 bytes" in err["message"]
        chat = {"messages": [{"role": "user", "content": "y" * 600}]}
        assert_openai_error(s.post("/v1/chat/completions", chat), 400, "messages")
        assert seen == [] and s.sched.submitted == []
        assert s.post("/v1/completions", {"prompt": "x" * 100}).status_code == 200


def test_min_tokens_out_of_reach_or_with_a_grammar_is_a_400_naming_it(served: Served) -> None:
    """vLLM's min_tokens: more than the output's limit, negative, or beside a grammar (which
    decides where the output ends) is a 400 naming it; within the limit it is served, and a
    stop string inside the first min_tokens tokens does not end the output."""
    for extra in (
        {"max_tokens": 3, "min_tokens": 4},
        {"min_tokens": -1},
        {"min_tokens": 2, "response_format": {"type": "json_object"}},
    ):
        r = served.post("/v1/completions", {"prompt": "a", **extra})
        assert_openai_error(r, 400, "min_tokens")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    r = served.post(
        "/v1/chat/completions",
        {"messages": USER, "tools": tools, "tool_choice": "required", "min_tokens": 2},
    )
    assert_openai_error(r, 400, "min_tokens")
    late = {"prompt": "a", "stop": ["e", "zzz"], "min_tokens": 3}
    assert served.post("/v1/completions", late).json()["choices"][0]["text"] == "Hello from th"
    assert served.post("/v1/completions", {"prompt": "a", "min_tokens": 3}).status_code == 200
