"""Instruct models as people use them, on the second family (SmolLM2-135M-Instruct, ChatML):
chat-template rendering against a hand-written reference, BOS handling, end-of-turn
stopping, greedy equality of speculative and ordinary decoding on chat prompts, multi-turn
cache reuse, and the Gemma/SmolLM2 vocabulary refusal."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.cli import specgen
from support.greedy import GREEDY, assert_same_or_near_tie

from specgen import Pair, chat
from specgen.drafters import ModelDrafter
from specgen.errors import ChatTemplateError, ConfigError
from specgen.generate import FixedK, GenerateConfig, generate
from specgen.llamacpp import EngineConfig, LlamaEngine

# SmolLM2's template adds this system message when the conversation has none.
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
IM_START, IM_END = 1, 2  # SmolLM2's <|im_start|> (also its BOS) and <|im_end|> (EOS, EOG)


def chatml(turns: list[tuple[str, str]]) -> str:
    """The ChatML text transformers renders for these turns, generation prompt added."""
    body = "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in turns)
    return body + "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def smol(smol_pair):
    target_path, draft_path = smol_pair
    cfg = EngineConfig(n_ctx=1024)
    target, draft = LlamaEngine(target_path, cfg), LlamaEngine(draft_path, cfg)
    yield target, draft
    draft.close()
    target.close()


@pytest.fixture(scope="module")
def fmt(smol):
    target, _ = smol
    template = chat.load_template(target)
    assert template is not None, "SmolLM2 carries a chat template"
    return chat.ChatFormatter(template, target)


def gen(target, drafter, prompt, k, **cfg):
    return list(generate(target, drafter, prompt, GenerateConfig(**cfg), FixedK(k)))[-1]


# -- rendering -----------------------------------------------------------------------------


def test_embedded_template_renders_chatml(smol, fmt):
    target, _ = smol
    assert fmt.template.source == f"{target.name} (tokenizer.chat_template)"
    assert len(fmt.template.sha256) == 12
    one = chat.messages("Write a haiku about the sea.")
    assert fmt.text(one) == chatml(
        [("system", DEFAULT_SYSTEM), ("user", "Write a haiku about the sea.")]
    )
    with_system = chat.messages("Hi", system="Answer in French.")
    assert fmt.text(with_system) == chatml([("system", "Answer in French."), ("user", "Hi")])
    conv = chat.Conversation(system="Be brief.")
    conv.add("user", "Hi")
    conv.add("assistant", "Hello!")
    conv.add("user", "Bye")
    assert fmt.text(conv.messages()) == chatml(
        [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello!"), ("user", "Bye")]
    )


def test_rendered_turn_markers_are_special_tokens_and_bos_appears_once(smol, fmt):
    target, _ = smol
    ids = fmt.tokens(chat.messages("Hi"))
    # <|im_start|> is SmolLM2's BOS; the model adds none itself, the template writes it
    assert ids[0] == IM_START and ids[1] != IM_START
    assert ids.count(IM_START) == 3 and ids.count(IM_END) == 2  # system, user, assistant
    tail = ids[len(ids) - ids[::-1].index(IM_START) :]
    assert b"".join(target.token_bytes(t) for t in tail) == b"assistant\n"


def test_raw_prompt_starting_with_the_bos_text_gets_one_bos(demo_pair):
    _, q4 = demo_pair
    with LlamaEngine(q4, EngineConfig(n_ctx=256)) as gemma:
        bos = gemma.vocab.bos
        assert gemma.vocab.add_bos
        plain = chat.prompt_tokens(gemma, b"Hello")
        explicit = chat.prompt_tokens(gemma, b"<bos>Hello")
        assert plain == explicit and plain[0] == bos and plain[1] != bos
        # the tokenizer alone would double it: the case prompt_tokens exists for
        assert gemma.tokenize(b"<bos>Hello")[:2] == [bos, bos]
        # add_special_tokens: false (vLLM's): the text's own ids, its BOS text still a BOS
        assert chat.prompt_tokens(gemma, b"Hello", add_special=False) == plain[1:]
        assert chat.prompt_tokens(gemma, b"<bos>Hello", add_special=False) == plain


def test_template_file_overrides_and_errors_name_the_source(smol, tmp_path: Path):
    target, _ = smol
    custom = tmp_path / "plain.jinja"
    custom.write_text(
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}",
        encoding="utf-8",
    )
    t = chat.load_template(target, custom)
    assert t is not None and t.source == str(custom)
    assert chat.ChatFormatter(t, target).text(chat.messages("Hi")) == "user: Hi\nassistant:"

    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m['content'] }", encoding="utf-8")
    with pytest.raises(ChatTemplateError) as e:
        chat.ChatFormatter(chat.load_template(target, broken), target)
    msg = str(e.value)
    assert str(broken) in msg and "\n" not in msg and "line 1" in msg

    strict = tmp_path / "strict.jinja"
    strict.write_text(
        "{% if messages[0]['role'] != 'system' %}"
        "{{ raise_exception('a system message is required') }}{% endif %}",
        encoding="utf-8",
    )
    f = chat.ChatFormatter(chat.load_template(target, strict), target)
    with pytest.raises(ChatTemplateError, match="strict.jinja: a system message is required"):
        f.text(chat.messages("Hi"))

    empty = tmp_path / "empty.jinja"
    empty.write_text("  \n", encoding="utf-8")
    with pytest.raises(ChatTemplateError, match="empty"):
        chat.load_template(target, empty)
    with pytest.raises(ConfigError, match="cannot read"):
        chat.load_template(target, tmp_path / "missing.jinja")


def test_base_model_without_template_gives_none(demo_pair):
    _, q4 = demo_pair
    with LlamaEngine(q4, EngineConfig(n_ctx=256)) as gemma:
        assert gemma.chat_template() is None
        assert chat.load_template(gemma) is None


# -- generation ----------------------------------------------------------------------------

QUESTIONS = ["Write a haiku about the sea.", "What is the capital of France?"]


@pytest.mark.parametrize("question", QUESTIONS, ids=["haiku", "capital"])
def test_chat_reply_stops_at_end_of_turn_and_speculation_changes_nothing(smol, fmt, question):
    target, draft = smol
    ids = fmt.tokens(chat.messages(question))
    base = gen(target, None, ids, 0, max_tokens=120, params=GREEDY)
    assert base.finish_reason == "eos", "the instruct model ends its turn"
    assert IM_END not in base.tokens and "<|im_end|>" not in base.text and base.text.strip()
    spec = gen(target, ModelDrafter(draft, GREEDY, target.n_vocab), ids, 4, max_tokens=120,
               params=GREEDY)  # fmt: skip
    assert spec.stats.n_drafted > 0 and spec.stats.target_passes < len(spec.tokens)
    assert_same_or_near_tie(target, ids, base.tokens, spec.tokens)
    assert spec.finish_reason == "eos" or spec.tokens != base.tokens


def test_second_turn_prefills_only_its_new_tokens(smol, fmt):
    target, draft = smol
    drafter = ModelDrafter(draft, GREEDY, target.n_vocab)
    cfg = dict(max_tokens=60, params=GREEDY, reuse_cache=True)
    target.truncate(0)  # earlier tests leave their prompts cached
    conv = chat.Conversation()
    conv.add("user", QUESTIONS[1])
    ids1 = fmt.tokens(conv.messages())
    first = gen(target, drafter, ids1, 4, **cfg)
    assert first.stats.n_prefill == len(ids1) - 1
    conv.add("assistant", first.text)
    conv.add("user", "And of Italy?")
    ids2 = fmt.tokens(conv.messages())
    # the re-rendered reply tokenizes back to the generated ids (checked, not assumed)
    assert ids2[: len(ids1) + len(first.tokens)] == ids1 + list(first.tokens)
    second = gen(target, drafter, ids2, 4, **cfg)
    # cached: turn 1's prompt and whole reply (its closing <|im_end|> was committed but not
    # evaluated); the rest is this turn's, except the last token, evaluated by round 1
    assert first.finish_reason == "eos"
    new = len(ids2) - 1 - (len(ids1) + len(first.tokens))
    assert second.stats.n_prefill == new < len(ids1)
    fresh = gen(target, None, ids2, 0, max_tokens=60, params=GREEDY)
    assert_same_or_near_tie(target, ids2, fresh.tokens, second.tokens)


# -- vocabulary refusal --------------------------------------------------------------------


def test_gemma_target_with_smollm2_draft_is_refused_in_users_words(demo_pair, smol_pair):
    _, gemma_q4 = demo_pair
    _, smol_q4 = smol_pair
    r = specgen("run", "-m", str(gemma_q4), "-md", str(smol_q4), "-c", "256", "-n", "4", "x")
    assert r.returncode == 1
    err = r.stderr.decode()
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "SentencePiece 262,144" in err and "BPE 49,152" in err
    assert "same model family" in err


# -- the session behind `specgen chat` ------------------------------------------------------

#: the replies' settings: greedy, at a fixed K, short
REPLIES = {"max_tokens": 40, "temperature": 0, "draft_max": 4}


def test_chat_session_reuses_the_caches_and_refuses_what_does_not_fit(smol):
    from specgen.ngram import NgramDrafter

    target, draft = smol
    for drafter in (
        ModelDrafter(draft, GREEDY, target.n_vocab),
        NgramDrafter(target.n_vocab),
        None,
    ):
        target.truncate(0)
        # no drafter: no K to fix (a fixed K with none is refused, not ignored)
        replies = REPLIES if drafter is not None else {**REPLIES, "draft_max": "auto"}
        s = Pair.of(target, drafter).chat_session(system="Be brief.", **replies)
        cached = 0  # what the target holds after the previous turn
        for question in ("What is the capital of France?", "And of Italy?", "And of Spain?"):
            done = list(s.reply(question))[-1]
            st = done.stats
            assert done.text.strip() and "<|im_end|>" not in done.text
            # only the tokens after the previous prompt and reply are evaluated (the last
            # prompt token is evaluated by the first round)
            assert st.n_prefill == s.totals.last_prefill == st.n_prompt - 1 - cached
            assert cached == 0 or st.n_prefill < 20
            cached = st.n_prompt + st.n_generated
        t = s.totals
        assert t.turns == 3 and len(s.conversation.turns) == 6
        # without a draft, ordinary decoding is the reply itself: no baseline is timed
        assert (t.speedup is not None) == (t.n_drafted > 0) == (drafter is not None)
        # a message that does not fit: refused in one line, the session goes on
        n_turns = len(s.conversation.turns)
        with pytest.raises(chat.ContextFullError, match=r"reset\(\) to start over"):
            list(s.reply("sea " * target.n_ctx))
        assert len(s.conversation.turns) == n_turns
        s.reset()
        assert s.totals.turns == 0 and s.totals.n_generated == 0  # the totals start over
        assert list(s.reply("Hi"))[-1].text.strip() and len(s.conversation.turns) == 2
        assert s.totals.turns == 1 and s.replies == 4


def test_chat_session_first_reply_is_pair_chat_and_the_next_reuses_the_cache(smol, demo_pair):
    """A session's first reply on empty caches is `Pair.chat` of the same messages with the
    same seed (sampled, at a fixed K: the same text); the next reuses the cache."""
    target, draft = smol
    pair = Pair.of(target, ModelDrafter(draft, GREEDY, target.n_vocab))
    settings = {"max_tokens": 24, "temperature": 0.8, "draft_max": 3, "ignore_eos": True}
    target.truncate(0)
    s = pair.chat_session(system="Be brief.", seed=7, **settings)
    replies = [list(s.reply(q))[-1] for q in ("Name a colour.", "Another one?")]
    convo = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a colour."},
    ]
    first = pair.chat(convo, seed=7, **settings)
    assert replies[0].text == first.text and replies[0].tokens == first.tokens
    convo += [
        {"role": "assistant", "content": first.text},
        {"role": "user", "content": "Another one?"},
    ]
    second = pair.chat(convo, seed=8, **settings)  # a fresh call evaluates it all
    assert second.stats.n_prompt == replies[1].stats.n_prompt
    # the session evaluated less (a sampled reply may tokenize back otherwise than it was
    # generated: then the cache holds only the prefix up to there)
    assert replies[1].stats.n_prefill < second.stats.n_prefill == second.stats.n_prompt - 1
    # a base model has no template; settings are checked at the call, in Python's words
    with pytest.raises(ConfigError, match="no chat template.*chat_template=FILE"):
        with LlamaEngine(demo_pair[1], EngineConfig(n_ctx=256)) as gemma:
            Pair.of(gemma, None).chat_session()
    with pytest.raises(ConfigError, match="temperature must be a number"):
        pair.chat_session(temperature="hot")


def test_build_prompt_raw_and_chat(smol):
    target, _ = smol
    raw, none = chat.build_prompt(target, b"Write a haiku.", raw=True)
    assert none is None and raw == chat.prompt_tokens(target, b"Write a haiku.")
    ids, template = chat.build_prompt(target, b"Write a haiku.", system="Be brief.")
    assert template is not None and ids[0] == IM_START and len(ids) > len(raw)
    with pytest.raises(ConfigError, match="--raw"):
        chat.build_prompt(target, b"x", raw=True, system="s")


def test_a_reply_interrupted_inside_the_loop_is_kept_as_far_as_it_got(smol):
    target, draft = smol
    target.truncate(0)
    drafter = ModelDrafter(draft, GREEDY, target.n_vocab)
    s = Pair.of(target, drafter).chat_session(**{**REPLIES, "draft_max": 2})
    real, calls = target.decode_batch, [0]

    def ctrl_c_on_the_fourth_pass(parts, copy=True):
        calls[0] += 1
        if calls[0] == 4:
            raise KeyboardInterrupt  # as llamacpp raises a Ctrl-C that came during a decode
        return real(parts, copy)

    target.decode_batch = ctrl_c_on_the_fourth_pass
    events = []
    try:
        with pytest.raises(KeyboardInterrupt):  # passed on, for the command to stop the reply
            for ev in s.reply("Tell me a long story about a dragon."):
                events.append(ev)
    finally:
        del target.decode_batch
    done = events[-1]
    assert done.finish_reason == "interrupted" and done.text
    assert s.conversation.turns[-1] == {"role": "assistant", "content": done.text}
    assert s.totals.turns == 1


def test_a_reply_interrupted_in_the_consumer_is_kept_as_far_as_it_got(smol, monkeypatch):
    """Ctrl-C while the command draws a token (here: while it writes the third Step's
    text) is thrown into the events: the loop ends the reply ("interrupted"), the session
    keeps it, and the interrupt ends the reply only."""
    from specgen.cli import chat as cli_chat
    from specgen.events import Step
    from specgen.ui import output

    target, draft = smol
    target.truncate(0)
    drafter = ModelDrafter(draft, GREEDY, target.n_vocab)
    s = Pair.of(target, drafter).chat_session(**{**REPLIES, "draft_max": 2})
    written: list[str] = []
    real_write = output.write_text

    def ctrl_c_on_the_third_step(text):
        written.append(text)
        if len(written) == 3:
            raise KeyboardInterrupt  # as SIGINT lands while the text is written
        real_write(text)

    monkeypatch.setattr(output, "write_text", ctrl_c_on_the_third_step)
    events = s.reply("Tell me a long story about a dragon.")
    done = cli_chat._plain_reply(events)
    assert done is not None and done.finish_reason == "interrupted" and done.text
    assert s.conversation.turns[-1] == {"role": "assistant", "content": done.text}
    assert s.totals.turns == 1 and written[-1] == "\n\n"
    # the interrupt came between rounds: the reply holds the tokens of the steps shown
    assert done.text.startswith("".join(written[:2]))

    # the same when the consumer throws the interrupt itself, as the live view's does
    events = s.reply("And then?")
    first = [next(events) for _ in range(3)]
    assert isinstance(first[-1], Step)
    done = events.throw(KeyboardInterrupt)
    assert done.finish_reason == "interrupted"
    with pytest.raises(KeyboardInterrupt):
        next(events)
    assert s.conversation.turns[-1] == {"role": "assistant", "content": done.text}
    assert s.totals.turns == 2


def test_a_reply_interrupted_while_the_session_records_a_step_is_kept(smol):
    """Ctrl-C landing in the session's own bookkeeping of an event (not in the loop, not
    in the consumer) ended the reply without its Done and dropped it from the
    conversation (a fresh clone's `make test`, 2026-12-07: turn 2's prompt lacked turn
    1); it is handed to the loop like the others."""
    import dataclasses

    from specgen.events import Step

    class CtrlCStep(Step):  # the signal lands as the session reads this step
        @property
        def timed_ordinary_s(self):  # type: ignore[override]
            raise KeyboardInterrupt

        @timed_ordinary_s.setter
        def timed_ordinary_s(self, value) -> None:
            pass

    def ctrl_c_in_the_record(gen):
        steps = 0
        try:
            ev = next(gen)
            while True:
                if isinstance(ev, Step):
                    steps += 1
                    if steps == 2:
                        ev = CtrlCStep(
                            **{f.name: getattr(ev, f.name) for f in dataclasses.fields(ev)}
                        )
                try:
                    yield ev
                except KeyboardInterrupt:
                    ev = gen.throw(KeyboardInterrupt)
                    continue
                try:
                    ev = next(gen)
                except StopIteration:
                    return
        finally:
            gen.close()

    _assert_an_interrupted_reply_is_kept(smol, ctrl_c_in_the_record)


def test_a_reply_interrupted_in_the_glue_above_the_loop_is_kept(smol):
    """Ctrl-C landing in a frame between the consumer and the loop, as it resumes (a fresh
    clone's `make test`, 2026-12-07, twice: the chat session's own generator frame) ended
    the reply without its Done, lost from the conversation; the events are still alive
    then, and the interrupt is handed to the loop."""

    class Glue:  # the signal lands as this frame resumes, before it reaches the loop
        def __init__(self, gen) -> None:
            self.gen, self.n = gen, 0

        def __iter__(self):
            return self

        def __next__(self):
            self.n += 1
            if self.n == 4:
                raise KeyboardInterrupt
            return next(self.gen)

        def throw(self, exc):
            return self.gen.throw(exc)

        def close(self) -> None:
            self.gen.close()

        @property
        def alive(self) -> bool:
            return self.gen.alive

    _assert_an_interrupted_reply_is_kept(smol, Glue)


def _assert_an_interrupted_reply_is_kept(smol, wrap) -> None:
    """A reply whose events pass through `wrap` (where the Ctrl-C lands) ends with its
    Done, "interrupted", and the session keeps it."""
    from specgen.events import Done

    target, draft = smol
    target.truncate(0)
    drafter = ModelDrafter(draft, GREEDY, target.n_vocab)
    s = Pair.of(target, drafter).chat_session(**{**REPLIES, "draft_max": 2})
    start = s._start
    s._start = lambda ids, i: wrap(start(ids, i))
    events = []
    with pytest.raises(KeyboardInterrupt):
        for ev in s.reply("Tell me a long story about a dragon."):
            events.append(ev)
    done = events[-1]
    assert isinstance(done, Done) and done.finish_reason == "interrupted" and done.text
    assert s.conversation.turns[-1] == {"role": "assistant", "content": done.text}
    assert s.totals.turns == 1
