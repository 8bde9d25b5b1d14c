"""`specgen serve` end to end: the real command, scheduler and SmolLM2 pair over real HTTP,
driven by the official `openai` client and httpx.

Every wait is for an observable state (a line, a chunk, a metric).

Greedy equality under concurrency: batched target decodes of different row counts may
differ in the last bits of float arithmetic, so outputs may diverge at a near-tie; the
suite's rule (`support.greedy.assert_same_or_near_tie`) accepts a divergence only where
the target's top-two logit gap is below NEAR_TIE_LOGITS.
"""

from __future__ import annotations

import hashlib
import json
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from support.serve import Server, start

PROMPTS = [
    "The three most important ideas in computer science are",
    "def fibonacci(n):\n    ",
    "A recipe for pancakes: first,",
    "The capital of France is",
]


@pytest.fixture(scope="module")
def server(smol_pair) -> Iterator[Server]:
    # greedy, so the two rules are equal: --verify block only shows that the rule reaches
    s = start(smol_pair, "-np", "4", "--draft-max", "4", "--temp", "0", "--verify", "block")
    yield s
    assert s.stop() == 0


def completion(s: Server, prompt: str, **fields) -> dict:
    body = {"prompt": prompt, "max_tokens": 24, "ignore_eos": True, "return_tokens": True}
    r = httpx.post(s.url + "/v1/completions", json={**body, **fields}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_chat_and_completions_with_consistent_statistics(server: Server, smol_pair) -> None:
    client = server.client()
    chat = client.chat.completions.create(
        model=server.model_id,
        messages=[{"role": "user", "content": "Name a color."}],
        max_tokens=32,
    )
    assert chat.choices[0].message.content
    assert chat.choices[0].finish_reason in ("stop", "length")
    extra = chat.model_extra or {}
    t, spec = extra["timings"], extra["speculative"]
    assert chat.usage is not None and chat.usage.completion_tokens == t["predicted_n"]
    assert t["draft_n_accepted"] <= t["draft_n"] == spec["num_draft_tokens"]
    assert spec["num_steps"] == len(spec["k_per_step"]) and max(spec["k_per_step"]) <= 4
    assert spec["verify_rule"] == "block"  # the server's --verify
    (card,) = httpx.get(server.url + "/v1/models", timeout=60).json()["data"]
    assert card["meta"]["lookup"] is True  # --lookup auto, as in run: every slot's hybrid

    whole = completion(server, PROMPTS[0], max_tokens=16)
    assert whole["usage"]["completion_tokens"] == 16 == len(whole["tokens"])
    stream = client.completions.create(
        model=server.model_id, prompt=PROMPTS[0], max_tokens=16, stream=True,
        extra_body={"ignore_eos": True}, stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole["choices"][0]["text"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 16
    # OpenAI's cached_tokens is llama-server's cache_n; the same prompt again reuses all of
    # its cells but the last token's (evaluated for the first token's logits)
    assert whole["usage"]["prompt_tokens_details"]["cached_tokens"] == whole["timings"]["cache_n"]
    again = chunks[-1].usage.prompt_tokens_details
    assert again is not None and again.cached_tokens == chunks[-1].usage.prompt_tokens - 1

    (model,) = client.models.list().data
    assert model.id == server.model_id == smol_pair[0].name
    meta = (model.model_extra or {})["meta"]
    assert meta["draft"]["file"] == smol_pair[1].name
    digest = hashlib.sha256(smol_pair[1].read_bytes()).hexdigest()
    assert meta["draft"]["sha256"] == digest


def test_serve_shows_runs_warnings_and_no_false_context_note(smol_pair) -> None:
    from specgen.session import SWAP_HINT

    target, draft = smol_pair
    s = start((draft, target), "-np", "2")  # swapped; -c 512 per slot, 1024 cells
    assert s.stop() == 0
    assert s.proc.stderr is not None
    err = s.proc.stderr.read()
    assert f"specgen: warning: the draft {target.name} is larger" in err and SWAP_HINT in err
    assert "became" not in err, err  # -c is each slot's context, as asked


def test_four_concurrent_greedy_requests_equal_each_served_alone(server: Server, smol_pair):
    alone = [completion(server, p)["tokens"] for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = [r["tokens"] for r in pool.map(lambda p: completion(server, p), PROMPTS)]
    if alone == together:
        return
    from support.greedy import assert_same_or_near_tie

    from specgen.chat import prompt_tokens
    from specgen.llamacpp import EngineConfig, LlamaEngine

    with LlamaEngine(smol_pair[0], EngineConfig(n_ctx=512)) as target:
        for p, a, b in zip(PROMPTS, alone, together, strict=True):
            assert_same_or_near_tie(target, prompt_tokens(target, p.encode()), a, b)


@pytest.mark.parametrize("repeat", [1, 40])
def test_a_seed_reproduces_sampled_text_with_a_fixed_draft_max(server: Server, repeat) -> None:
    # 40: a prompt of about 300 tokens, longer than a step's chunk, whose draft catches up
    # by chunks on the first send only (the second finds it cached)
    fields = {"temperature": 0.8, "seed": 1234}
    prompt = " ".join([PROMPTS[2]] * repeat)
    first = completion(server, prompt, **fields)
    again = completion(server, prompt, **fields)
    if repeat > 1:  # the draft caught up by chunks the first time only
        assert first["timings"]["cache_n"] < 16 and again["timings"]["cache_n"] > 256
    assert again["speculative"]["k_per_step"] == first["speculative"]["k_per_step"]
    assert again["tokens"] == first["tokens"]


def test_a_bench_sweep_reports_the_speculative_counts_of_the_metrics(server: Server) -> None:
    """`specgen bench --url`'s runner, a 2-level sweep (no warm-up: every request it sends
    is one it counts): its drafted and accepted tokens equal the /metrics deltas."""
    from specgen.bench import load
    from specgen.bench.loadstats import LoadLevel

    names = ("specgen_draft_tokens_total", "specgen_accepted_tokens_total",
             "specgen_generation_tokens_total")  # fmt: skip
    before = [server.metric(n) for n in names]
    prompts = [
        load.LoadPrompt(f"p{i}", "k", messages=(("user", p),)) for i, p in enumerate(PROMPTS)
    ]
    settings = load.LoadSettings(
        levels=(LoadLevel(0.0, concurrency=1), LoadLevel(0.0, concurrency=2)),
        num_prompts=3, max_tokens=12, seed=7, warmup=0, timeout_s=120,
    )  # fmt: skip
    res = load.run_load(load.parse_servers([server.url], []), prompts, settings)
    drafted, accepted, generated = (
        server.metric(n) - b for n, b in zip(names, before, strict=True)
    )
    sums = [r.summary for r in res.runs]
    assert [(s.n_completed, s.failures) for s in sums] == [(3, ()), (3, ())]
    assert all(s.tokens_from_usage for s in sums) and res.endpoint == load.CHAT
    assert sum(s.total_output_tokens for s in sums) == generated == 6 * 12
    assert sum(s.num_draft_tokens for s in sums) == drafted > 0
    assert sum(s.num_accepted_draft_tokens for s in sums) == accepted
    specs = [r.spec for run in res.runs for r in run.records]
    assert all(sp is not None and sp.source == "speculative" for sp in specs)


def test_bad_input_is_4xx_and_the_server_keeps_serving(server: Server) -> None:
    url = server.url
    cases = [
        (b"{", 400),
        (json.dumps({"prompt": "x", "max_tokens": 0}).encode(), 400),
        (json.dumps({"prompt": "x", "max_tokens": 100000}).encode(), 400),
        (json.dumps({"prompt": "word " * 600}).encode(), 400),
        (json.dumps({"prompt": "x", "stop": [""]}).encode(), 400),
        (json.dumps({"prompt": "x", "n": 5}).encode(), 400),  # more choices than -np 4
    ]
    for body, status in cases:
        r = httpx.post(url + "/v1/completions", content=body, timeout=60)
        assert r.status_code == status and set(r.json()["error"]) >= {"message", "type"}
    assert completion(server, "Hello", max_tokens=4)["usage"]["completion_tokens"] == 4


def test_queue_full_and_a_disconnect_that_frees_the_slot(smol_pair) -> None:
    # the held stream is 4000 tokens long, to outlast the three local requests made while
    # it holds the slot (the test never waits for time, only for the queue's metric)
    s = start(smol_pair, "-np", "1", "--queue", "1", "--draft-max", "4", "-c", "4096")
    try:
        client = httpx.Client(timeout=120)
        body = {"prompt": PROMPTS[0], "stream": True, "max_tokens": 4000, "ignore_eos": True}
        r = client.send(
            client.build_request("POST", s.url + "/v1/completions", json=body), stream=True
        )
        # kept referenced until r.close(): a dropped line iterator closes the connection
        # (httpcore closes it when its byte stream is closed), which frees the slot early
        held = (line for line in r.iter_lines() if line.startswith("data: "))
        next(held)  # holding the slot
        queued: dict[str, httpx.Response] = {}

        def wait_in_queue() -> None:
            queued["r"] = httpx.post(
                s.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 4}, timeout=120
            )

        t = threading.Thread(target=wait_in_queue)
        t.start()
        while s.metric("specgen_queue_depth") < 1:
            assert t.is_alive()
        full = httpx.post(s.url + "/v1/completions", json={"prompt": "x"}, timeout=60)
        assert full.status_code == 503 and "retry-after" in full.headers
        r.close()  # disconnect mid-stream: the queued request gets the slot
        del held
        client.close()
        t.join(120)
        assert queued["r"].status_code == 200
        assert queued["r"].json()["usage"]["completion_tokens"] == 4
    finally:
        assert s.stop() == 0


def test_sigterm_during_a_stream_sends_a_final_chunk_and_exits_0(smol_pair) -> None:
    s = start(smol_pair, "-np", "2", "--draft-max", "4", "-c", "2048")
    with httpx.Client(timeout=120) as client:
        body = {"prompt": PROMPTS[1], "stream": True, "max_tokens": 1000, "ignore_eos": True}
        with client.stream("POST", s.url + "/v1/completions", json=body) as r:
            lines = (line for line in r.iter_lines() if line.startswith("data: "))
            next(lines)
            s.proc.send_signal(signal.SIGTERM)
            rest = list(lines)
    assert rest[-1] == "data: [DONE]"
    final = json.loads(rest[-2][6:])
    assert final["choices"][0]["finish_reason"] == "abort"
    assert final["speculative"]["finish"] == "interrupted"
    assert s.proc.wait(timeout=60) == 0


# -- log-probabilities over HTTP ---------------------------------------------------------

LP_TOL = 0.05  # nats: F32 target, batched vs single pass (FIELD.md: about 0.016 logits)


def _reference_logprobs(smol_pair, prompt_ids: list[int], tokens: list[int]):
    """The target scoring prompt + output in one ordinary pass: (len(tokens), n_vocab)
    log-softmax rows, row i for tokens[i]."""
    import numpy as np

    from specgen.llamacpp import EngineConfig, LlamaEngine

    with LlamaEngine(smol_pair[0], EngineConfig(n_ctx=512)) as target:
        rows = np.array(target.decode(prompt_ids + tokens, all_logits=True), dtype=np.float64)
    rows = rows[len(prompt_ids) - 1 : len(prompt_ids) - 1 + len(tokens)]
    m = rows.max(1, keepdims=True)
    return rows - m - np.log(np.exp(rows - m).sum(1, keepdims=True))


def test_completion_logprobs_legacy_shape_values_and_stream(server: Server, smol_pair) -> None:
    from specgen.chat import prompt_tokens
    from specgen.llamacpp import EngineConfig, LlamaEngine

    whole = completion(server, PROMPTS[3], max_tokens=12, logprobs=3)
    lp, text, tokens = whole["choices"][0]["logprobs"], whole["choices"][0]["text"], whole["tokens"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(tokens) == 12
    assert "".join(lp["tokens"]) == text
    assert all(text.startswith(t, o) for t, o in zip(lp["tokens"], lp["text_offset"], strict=True))
    with LlamaEngine(smol_pair[0], EngineConfig(n_ctx=512)) as target:
        ids = prompt_tokens(target, PROMPTS[3].encode())
    ref = _reference_logprobs(smol_pair, ids, tokens)
    for i, tok in enumerate(tokens):
        assert abs(lp["token_logprobs"][i] - ref[i][tok]) < LP_TOL
        top = lp["top_logprobs"][i]
        assert len(top) == 3 and max(top.values()) >= lp["token_logprobs"][i] - LP_TOL  # greedy
        assert abs(max(top.values()) - ref[i].max()) < LP_TOL
    # streamed: each chunk its own tokens, the offsets running on
    client = server.client()
    chunks = list(client.completions.create(
        model=server.model_id, prompt=PROMPTS[3], max_tokens=12, stream=True, logprobs=3,
        extra_body={"ignore_eos": True},
    ))  # fmt: skip
    streamed = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    assert sum((x.tokens or [] for x in streamed), []) == lp["tokens"]
    assert sum((x.text_offset or [] for x in streamed), []) == lp["text_offset"]
    # a stop string across two tokens holds its first token back from the text until it
    # matches: every offset is still where its token starts, whole and streamed
    stop = lp["tokens"][6] + lp["tokens"][7]
    cut = text[: text.index(stop)]
    assert stop.strip() and len(cut) > 0
    stopped = completion(server, PROMPTS[3], max_tokens=12, logprobs=3, stop=[stop])
    held = stopped["choices"][0]["logprobs"]
    assert stopped["choices"][0]["text"] == cut
    assert held["text_offset"] == lp["text_offset"][: len(held["text_offset"])]
    chunks = list(client.completions.create(
        model=server.model_id, prompt=PROMPTS[3], max_tokens=12, stream=True, logprobs=3,
        stop=[stop], extra_body={"ignore_eos": True},
    ))  # fmt: skip
    streamed = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    assert sum((x.text_offset or [] for x in streamed), []) == held["text_offset"]


def test_echo_scores_the_prompt_as_lm_evaluation_harness_asks(server: Server, smol_pair) -> None:
    """lm-evaluation-harness's loglikelihood body (its `local-completions`): token ids, echo,
    logprobs 1, one greedy token; it sums ``token_logprobs[ctxlen:-1]`` and compares each
    with ``max(top_logprobs)``. Every prompt entry is the target's own value, whole,
    streamed, with max_tokens 0 and for every choice."""
    from specgen.chat import prompt_tokens
    from specgen.llamacpp import EngineConfig, LlamaEngine

    with LlamaEngine(smol_pair[0], EngineConfig(n_ctx=512)) as target:
        ids = prompt_tokens(target, (PROMPTS[0] + " memory, time and").encode())
    ref = _reference_logprobs(smol_pair, ids[:1], ids[1:])  # rows for prompt tokens 2..n
    body = {"prompt": [ids], "temperature": 0, "max_tokens": 1, "logprobs": 1, "echo": True}
    r = httpx.post(server.url + "/v1/completions", json={**body, "seed": 1234}, timeout=120)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(ids) + 1 and choice["text"].startswith(
        "".join(lp["tokens"][:-1])
    )
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    for i, tok in enumerate(ids[1:]):
        assert abs(lp["token_logprobs"][i + 1] - ref[i][tok]) < LP_TOL
        assert abs(max(lp["top_logprobs"][i + 1].values()) - ref[i].max()) < LP_TOL
    assert lp["text_offset"] == sorted(lp["text_offset"])
    # the prompt alone; then streamed, its first chunk the prompt; then two choices
    alone = completion(server, PROMPTS[0], max_tokens=0, echo=True, logprobs=1, ignore_eos=False)
    assert alone["choices"][0]["text"] == PROMPTS[0]
    assert (
        alone["usage"]["completion_tokens"] == 0
        and alone["choices"][0]["finish_reason"] == "length"
    )
    chunks = list(server.client().completions.create(
        model=server.model_id, prompt=[ids], max_tokens=1, logprobs=1, echo=True, stream=True,
    ))  # fmt: skip
    first = chunks[0].choices[0].logprobs
    assert first is not None and first.token_logprobs is not None
    same = pytest.approx(lp["token_logprobs"][1:-1], abs=LP_TOL)
    assert first.token_logprobs[0] is None and first.token_logprobs[1:] == same
    two = completion(server, [ids], max_tokens=3, logprobs=1, echo=True, n=2)
    for c in two["choices"]:
        assert c["logprobs"]["token_logprobs"][1 : len(ids)] == same
    # the generated token is end-of-generation: listed still, so [ctxlen:-1] is the prompt's
    eos = httpx.post(server.url + "/tokenize", json={"content": "<|im_end|>"}).json()["tokens"]
    body = {**body, "logit_bias": {str(eos[0]): 100}}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=120).json()
    ended = r["choices"][0]
    assert (
        ended["finish_reason"] == "stop" and ended["text"] == choice["text"][: len(ended["text"])]
    )
    assert len(ended["logprobs"]["tokens"]) == len(ids) + 1
    assert ended["logprobs"]["token_logprobs"][1:-1] == same
    # its raw logprob (before the bias: OpenAI's meaning), from the row after the prompt
    after = _reference_logprobs(smol_pair, ids, eos[:1])[0][eos[0]]
    assert abs(ended["logprobs"]["token_logprobs"][-1] - after) < LP_TOL


def test_several_prompts_in_one_request_are_each_served_as_if_alone(server: Server, smol_pair):
    """lm-evaluation-harness's batched bodies: a list of prompts in one request. Greedy,
    choice 0 of [a, b] and of [b, a] are a's and b's tokens sent alone (or differ first at
    a near-tie, as concurrent requests may); echo with logprobs scores each prompt with the
    target's own values."""
    from support.greedy import assert_same_or_near_tie

    from specgen.chat import prompt_tokens
    from specgen.llamacpp import EngineConfig, LlamaEngine

    a, b = PROMPTS[0], PROMPTS[3]
    alone = [completion(server, p)["tokens"] for p in (a, b)]
    batched = [completion(server, [x, y])["tokens"] for x, y in ((a, b), (b, a))]
    with LlamaEngine(smol_pair[0], EngineConfig(n_ctx=512)) as target:
        ids = [prompt_tokens(target, p.encode()) for p in (a, b)]
        for p, one, together in zip(ids, alone, batched, strict=True):
            assert_same_or_near_tie(target, p, one, together)
    body = {"max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0}
    r = completion(server, ids, **body)
    assert r["usage"]["prompt_tokens"] == sum(map(len, ids)) and len(r["choices"]) == 2
    for choice, p in zip(r["choices"], ids, strict=True):
        ref = _reference_logprobs(smol_pair, p[:1], p[1:])
        got = choice["logprobs"]["token_logprobs"]
        assert len(got) == len(p) + 1 and got[0] is None
        assert all(abs(got[i + 1] - ref[i][tok]) < LP_TOL for i, tok in enumerate(p[1:]))


def test_the_tokenizer_routes_are_the_targets(server: Server, smol_pair) -> None:
    from specgen.chat import prompt_tokens
    from specgen.llamacpp import EngineConfig, LlamaEngine

    text = PROMPTS[1]
    with LlamaEngine(smol_pair[0], EngineConfig(n_ctx=512)) as target:
        with_bos = prompt_tokens(target, text.encode())
        plain = target.tokenize(text.encode(), add_special=False)
    url = server.url
    assert httpx.post(url + "/tokenize", json={"prompt": text}).json()["tokens"] == with_bos
    r = httpx.post(url + "/tokenize", json={"content": text}).json()  # llama-server's default
    assert r["tokens"] == plain and r["count"] == len(plain)
    either = {"content": text, "add_special_tokens": True}  # either server's flag
    assert httpx.post(url + "/tokenize", json=either).json()["tokens"] == with_bos
    assert httpx.post(url + "/detokenize", json={"tokens": plain}).json()["prompt"] == text
    info = httpx.get(url + "/tokenizer_info").json()
    assert info["eos_token"] and "im_start" in info["chat_template"]
    eos = httpx.post(
        url + "/tokenize", json={"prompt": info["eos_token"], "add_special_tokens": False}
    )
    assert len(eos.json()["tokens"]) == 1  # special-token text is parsed


def test_chat_logprobs_top_entries_stream_and_refusals(server: Server) -> None:
    client = server.client()
    msgs = [{"role": "user", "content": "Name a color."}]
    r = client.chat.completions.create(
        model=server.model_id,
        messages=msgs,
        max_tokens=8,
        logprobs=True,
        top_logprobs=4,  # type: ignore[arg-type]
    )
    content = r.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content and "".join(c.token for c in content) == r.choices[0].message.content
    for c in content:
        assert len(c.top_logprobs) == 4 and c.bytes == list(c.token.encode())
        # temperature 0: the chosen token is the top entry (or ties it within the
        # batched-vs-single difference)
        assert c.top_logprobs[0].token == c.token or c.logprob >= c.top_logprobs[0].logprob - LP_TOL
        assert [t.logprob for t in c.top_logprobs] == sorted(
            (t.logprob for t in c.top_logprobs), reverse=True
        )
    chunks = list(client.chat.completions.create(
        model=server.model_id, messages=msgs, max_tokens=8, logprobs=True, top_logprobs=4,  # type: ignore[arg-type]
        stream=True,
    ))  # fmt: skip
    streamed = [
        e
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content or []
    ]
    assert [e.token for e in streamed] == [c.token for c in content]
    assert all(abs(a.logprob - b.logprob) < LP_TOL for a, b in zip(streamed, content, strict=True))
    plain = client.chat.completions.create(model=server.model_id, messages=msgs, max_tokens=4)  # type: ignore[arg-type]
    assert plain.choices[0].logprobs is None
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(model=server.model_id, messages=msgs, top_logprobs=2)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(
            model=server.model_id, messages=msgs, logprobs=True, top_logprobs=21
        )  # type: ignore[arg-type]


def test_n_choices_share_one_prefill_stream_by_index_and_stop_at_the_slots(server: Server):
    """n=3 over HTTP with the openai client. That choice i is the request seeded seed + i
    alone is checked exactly on fakes (test_scheduler): here two runs may differ, since
    the Q4_1 draft's rows (quantized activations) move with the batch's composition, and
    with them which proposals are accepted (each run still exact in law)."""
    client = server.client()
    prompt = "Three short poems about the sea, one per line:\n1."  # in no slot yet

    def create(**fields):
        return client.completions.create(
            model=server.model_id, prompt=prompt, temperature=0.9, max_tokens=16,
            extra_body={"ignore_eos": True}, **fields,
        )  # fmt: skip

    before = server.metric("specgen_prompt_evaluated_tokens_total")
    r = create(n=3, seed=300)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.finish_reason == "length" for c in r.choices)
    assert r.usage is not None and r.usage.completion_tokens == 3 * 16
    # one prefill: choice 0 evaluates all but the prompt's last token, the others share
    # its cells (three prefills would count 3 * (prompt_tokens - 1))
    evaluated = server.metric("specgen_prompt_evaluated_tokens_total") - before
    assert 0 < evaluated <= r.usage.prompt_tokens - 1
    assert len({c.text for c in r.choices}) > 1  # sampled apart
    # streamed: each chunk names its choice; each choice ends once; usage counts all three
    chunks = list(create(n=3, seed=300, stream=True, stream_options={"include_usage": True}))
    streamed, finished = ["", "", ""], []
    for chunk in chunks:
        for c in chunk.choices:
            streamed[c.index] += c.text
            if c.finish_reason is not None:
                finished.append((c.index, c.finish_reason))
    assert sorted(finished) == [(0, "length"), (1, "length"), (2, "length")]
    assert all(streamed) and len(set(streamed)) > 1
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3 * 16
    with pytest.raises(openai.BadRequestError, match="--parallel"):
        client.completions.create(model=server.model_id, prompt="x", n=5)


def test_the_loopback_server_refuses_a_rebound_host(server: Server) -> None:
    """`serve` on its default 127.0.0.1 refuses a request naming another host (DNS
    rebinding), and serves its own clients, which name the address they connect to."""
    r = httpx.get(server.url + "/v1/models", headers={"Host": "rebound.example"}, timeout=60)
    assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed"
    assert httpx.get(server.url + "/v1/models", timeout=60).status_code == 200


def test_stop_token_ids_end_the_output_at_the_first_one_kept(server: Server) -> None:
    """vLLM's stop_token_ids on the speculating server (greedy, K = 4): the output is the
    unconstrained output cut just after the first occurrence of the token, whichever
    round's block held it; an id outside the vocabulary is a 400."""
    prompt = PROMPTS[0]
    full = completion(server, prompt)
    tokens = full["tokens"]
    stop_id = tokens[5]
    absent = next(t for t in range(100, 300) if t not in tokens)
    cut = completion(server, prompt, stop_token_ids=[absent, stop_id])
    expect = tokens[: tokens.index(stop_id) + 1]
    assert cut["tokens"] == expect, (cut["tokens"], tokens)
    assert cut["choices"][0]["finish_reason"] == "stop"
    assert cut["usage"]["completion_tokens"] == len(expect)
    assert full["choices"][0]["text"].startswith(cut["choices"][0]["text"])
    bad = httpx.post(
        server.url + "/v1/completions",
        json={"prompt": prompt, "max_tokens": 4, "stop_token_ids": [-1]},
        timeout=120,
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "stop_token_ids"


def test_min_tokens_holds_the_end_back_and_changes_nothing_before_it(server: Server) -> None:
    """vLLM's min_tokens on the speculating server (greedy, K = 4): a chat answer that ends
    by itself after n tokens goes on to at least n + 6 with min_tokens n + 6, its first n
    tokens unchanged (the held-back end changes only where the end was the argmax); the
    same request without it ends where it did."""
    body = {
        "messages": [{"role": "user", "content": "Reply with one word: is water wet?"}],
        "max_tokens": 48,
        "return_tokens": True,
    }
    url = server.url + "/v1/chat/completions"
    free = httpx.post(url, json=body, timeout=120).json()
    n = len(free["tokens"])
    assert free["choices"][0]["finish_reason"] == "stop" and n < 30, free
    held = httpx.post(url, json={**body, "min_tokens": n + 6}, timeout=120).json()
    assert held["tokens"][:n] == free["tokens"], (held["tokens"], free["tokens"])
    assert len(held["tokens"]) >= n + 6 and held["usage"]["completion_tokens"] >= n + 6
    assert httpx.post(url, json=body, timeout=120).json()["tokens"] == free["tokens"]


def test_a_prediction_is_drafted_by_prompt_lookup_and_changes_no_token(
    server: Server, smol_pair
) -> None:
    """OpenAI's Predicted Outputs on the speculating server (greedy, K = 4, prompt lookup
    on): an answer sent back as the request's ``prediction`` is the same answer (greedy:
    its tokens, up to a near tie between two batchings' last bits), now drafted mostly by
    prompt lookup from the prediction, which the prompt alone could not copy from."""
    body = {
        "messages": [{"role": "user", "content": "List the days of the week, comma-separated."}],
        "max_tokens": 40,
        "return_tokens": True,
    }
    url = server.url + "/v1/chat/completions"
    free = httpx.post(url, json=body, timeout=120).json()
    text = free["choices"][0]["message"]["content"]
    predicted = {**body, "prediction": {"type": "content", "content": text}}
    got = httpx.post(url, json=predicted, timeout=120).json()
    if got["tokens"] != free["tokens"]:
        from support.greedy import assert_same_or_near_tie

        from specgen.chat import ChatFormatter, load_template
        from specgen.llamacpp import EngineConfig, LlamaEngine

        with LlamaEngine(smol_pair[0], EngineConfig(n_ctx=512)) as target:
            template = load_template(target)
            assert template is not None
            prompt = ChatFormatter(template, target).tokens(body["messages"])
            assert_same_or_near_tie(target, prompt, free["tokens"], got["tokens"])

    def by_lookup(reply: dict) -> int:
        return reply["speculative"]["num_accepted_draft_tokens_by_source"].get("prediction", 0)

    assert by_lookup(got) >= len(got["tokens"]) // 2 > by_lookup(free), (free, got)
    # OpenAI's counts of the prediction's tokens, as the speculative object's
    spec = got["speculative"]
    tested = spec["num_tested_draft_tokens_by_source"]["prediction"]
    assert got["usage"]["completion_tokens_details"] == {
        "accepted_prediction_tokens": by_lookup(got),
        "rejected_prediction_tokens": tested - by_lookup(got),
    }
    assert "completion_tokens_details" not in free["usage"]
