"""The public Python API (`specgen.load`, `Pair.generate`, `Pair.stream`) on the tiny pair:
the same tokens as the loop gives, the speculative statistics, events in order, and a cheap
``import specgen``."""

from __future__ import annotations

import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from support.cli import run_json

import specgen
from specgen.errors import ConfigError, PromptError
from specgen.events import Done, Prefilled, Step


@pytest.fixture(scope="module")
def pair(tiny_target: Path, tiny_draft: Path):
    with specgen.load(tiny_target, tiny_draft, ctx_size=256) as p:
        yield p


def test_generate_greedy_equals_ordinary_decoding(pair, tiny_target: Path) -> None:
    spec = pair.generate("the cat", max_tokens=16, temperature=0, draft_max=3, ignore_eos=True)
    with specgen.load(tiny_target, "none", ctx_size=256) as plain:
        ordinary = plain.generate("the cat", max_tokens=16, temperature=0, ignore_eos=True)
    assert spec.tokens == ordinary.tokens and len(spec.tokens) == 16
    assert spec.text == ordinary.text and spec.finish == spec.finish_reason == "length"
    assert spec.stats.n_drafted > 0 and 0.0 <= spec.acceptance_rate <= 1.0
    assert max(spec.stats.k_history) == 3 and ordinary.stats.n_drafted == 0  # K <= what is left


def test_a_seed_reproduces_a_sampled_call_whatever_came_before(pair) -> None:
    """Each call is independent of the calls before it on the same Pair (issue 33: a second
    seeded call gave another text while `run` reproduces): other calls, at other settings,
    in between change nothing."""
    args = {"max_tokens": 12, "temperature": 1.0, "draft_max": 3, "ignore_eos": True}
    a = pair.generate("the cat", seed=7, **args)
    pair.generate("a dog ran", max_tokens=9, temperature=0, draft_max=5)
    list(pair.stream("the cat sat", max_tokens=5, temperature=0.5, seed=1))
    b = pair.generate("the cat", seed=7, **args)
    c = pair.generate("the cat", seed=8, **args)
    assert a.tokens == b.tokens and a.text == b.text and a.seed == b.seed == 7
    assert c.tokens != a.tokens  # the seed matters (12 sampled tokens at temperature 1)


def test_the_api_makes_the_rounds_run_makes(pair, tiny_target: Path, tiny_draft: Path) -> None:
    """The draft samples under the call's own settings whatever the door: the pair was
    loaded under the default settings (temperature 0.8), and a greedy call must not draft
    at 0.8 (it did: acceptance 0.70 against run's 0.95 on the demo pair)."""
    args = dict(max_tokens=24, temperature=0, draft_max=8, ignore_eos=True)
    api = pair.generate("the cat sat", **args)
    cli = run_json(
        "-m", str(tiny_target), "-md", str(tiny_draft), "-c", "256", "--temp", "0",
        "--draft-max", "8", "-n", "24", "--ignore-eos", "the cat sat",
    )  # fmt: skip
    stats = cli["stats"]
    # the typed stats are --json's, key for key (timings differ between two runs)
    assert api.stats.to_dict().keys() == stats.keys()
    assert api.stats.wall_s == pytest.approx(api.stats.prefill_s + api.stats.decode_s)
    assert api.stats.acceptance_how == stats["acceptance_how"]
    assert list(api.stats.k_history) == stats["k_history"]
    assert (api.stats.n_drafted, api.stats.n_accepted) == (
        stats["n_drafted"],
        stats["n_accepted"],
    )
    assert api.text == cli["text"] and stats["n_drafted"] > 0


def test_stream_yields_prefilled_steps_then_done(pair) -> None:
    events = list(pair.stream("the cat", max_tokens=8, temperature=0, ignore_eos=True))
    assert isinstance(events[0], Prefilled) and isinstance(events[-1], Done)
    steps = [e for e in events[1:-1] if isinstance(e, Step)]
    assert (
        steps
        and "".join(s.text for s in steps) == events[-1].text[: len("".join(s.text for s in steps))]
    )
    # closing a stream early leaves the pair usable
    it = pair.stream("the cat", max_tokens=8, temperature=0)
    next(it)
    it.close()
    assert len(pair.generate("the cat", max_tokens=4, temperature=0, ignore_eos=True).tokens) == 4


def test_bad_settings_are_refused_before_generating(pair) -> None:
    with pytest.raises(ConfigError, match="^draft_max") as e:
        pair.stream("the cat", draft_max=0)
    assert "--" not in str(e.value)  # named as the argument the caller passed
    with pytest.raises(ConfigError, match="^top_p must be"):
        pair.generate("the cat", top_p=2)
    with pytest.raises(PromptError, match="empty"):
        pair.generate("")
    n_ctx = pair.session.target.n_ctx
    with pytest.raises(PromptError, match="shorten it or raise ctx_size$"):  # was "-c"
        pair.generate([1] * n_ctx)
    with pytest.raises(ConfigError, match="needs target"):
        specgen.load(draft="small.gguf")


def test_a_value_of_the_wrong_type_is_a_config_error_naming_the_argument(pair, ordinary) -> None:
    """The Python API takes anything: a wrong type is said in one line naming the
    argument, as a bad value is, not a bare TypeError from deep in the sampler."""
    for settings, said in (
        ({"temperature": "hot"}, "^temperature must be a number, got 'hot'"),
        ({"top_k": 2.5}, "^top_k must be an integer"),
        ({"max_tokens": True}, "^max_tokens must be an integer"),
        ({"stop": 5}, "^stop must be a string or a list of strings"),
        ({"draft_max": 4.0}, "^draft_max must be an integer \\(1 to 64\\) or 'auto', got 4.0"),
        ({"draft_max": 0}, "got 0: for ordinary decoding \\(the target alone\\), ordinary=True$"),
        ({"draft_max": "x"}, "^draft_max must be an integer \\(1 to 64\\) or 'auto', got 'x'"),
        ({"temprature": 0}, "unknown setting 'temprature' \\(did you mean temperature\\?\\)"),
    ):
        with pytest.raises(ConfigError, match=said):
            pair.generate("the cat", **settings)
    with pytest.raises(ConfigError, match="^ctx_size must be an integer, got 'big'"):
        specgen.load(ctx_size="big")  # refused before anything is loaded
    with pytest.raises(ConfigError, match="^flash_attn must be on, off or auto, got 'yes'"):
        specgen.load(flash_attn="yes")
    with pytest.raises(ConfigError, match="^prompt must be text"):
        pair.generate(["the cat"])
    with pytest.raises(ConfigError, match="^settings .* must be a SamplingFlags or None"):
        pair.generate("the cat", "x")  # a string where the settings go (was AttributeError)
    with pytest.raises(ConfigError, match='^draft_max 4 needs a drafter: with draft="none"'):
        ordinary.generate("the cat", draft_max=4)  # was ignored
    with pytest.raises(ConfigError, match="^ordinary must be True or False, got 'yes'"):
        pair.generate("the cat", ordinary="yes")  # was taken as True
    # close enough is taken as meant: an int temperature, one stop string
    one = pair.generate("the cat", temperature=0, max_tokens=6, stop="zzz", ignore_eos=True)
    assert len(one.tokens) == 6
    # numpy's integers, as tokenizers and arrays give them (draft_max and token-id prompts
    # had refused them, the message naming the value it refused as an integer)
    import numpy as np

    from specgen.chat import prompt_tokens

    ids = prompt_tokens(pair.session.target, b"the cat")
    by_ints = pair.generate(ids, temperature=0, draft_max=3, max_tokens=6, ignore_eos=True)
    for prompt in (np.array(ids), [np.int64(t) for t in ids]):
        by_numpy = pair.generate(
            prompt, temperature=0, draft_max=np.int64(3), max_tokens=6, ignore_eos=True
        )
        assert by_numpy.tokens == by_ints.tokens
    for bad in (np.array([ids]), [True, 2], np.array([1.0, 2.0])):
        with pytest.raises(ConfigError, match="^prompt must be text"):
            pair.generate(bad)


def test_a_closed_pair_raises_a_specgen_error_instead_of_killing_the_process(
    tiny_target: Path, tiny_draft: Path, tmp_path: Path
) -> None:
    """After `close()` (or the ``with`` block) every call says the model is closed: llama.cpp
    would read a freed vocabulary and abort the whole process (exit 134, or a segfault).
    Run in a child process, so that a regression fails this test, not the test run."""
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    code = f"""
import specgen
pair = specgen.load({str(tiny_target)!r}, {str(tiny_draft)!r}, ctx_size=256)
pair.close()
pair.close()  # idempotent
for call in (lambda: pair.generate("the cat", max_tokens=2),
             lambda: list(pair.stream("the cat", max_tokens=2)),
             lambda: pair.chat([{{"role": "user", "content": "hi"}}], chat_template={str(template)!r})):
    try:
        call()
    except specgen.SpecgenError as exc:
        print(type(exc).__name__, exc)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert len(lines) == 3 and all(line.endswith("the model is closed") for line in lines), lines


def test_max_tokens_past_the_context_is_a_warning_as_the_cli_notes_it(pair) -> None:
    import warnings

    with pytest.warns(UserWarning, match=r"plus max_tokens 5000 do not fit the context of 256.*"
                      r"at most 25\d tokens \(raise ctx_size"):  # fmt: skip
        pair.stream("the cat", max_tokens=5000, temperature=0).close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pair.stream("the cat", max_tokens=8, temperature=0).close()


def test_chat_renders_the_messages_with_the_template(pair, tmp_path: Path) -> None:
    """`Pair.chat` is `generate` on the messages rendered by the chat template (here a file:
    the tiny models carry none; SmolLM2's own is checked against `run` below)."""
    template = tmp_path / "t.jinja"
    template.write_text(
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the cat"}]
    args = dict(max_tokens=8, temperature=0, draft_max=4, ignore_eos=True)
    reply = pair.chat(messages, chat_template=template, **args)
    raw = pair.generate("<system>be brief\n<user>the cat\n<assistant>", **args)
    assert reply.tokens == raw.tokens and reply.stats.n_prompt == raw.stats.n_prompt
    events = list(pair.stream_chat(messages, chat_template=str(template), **args))
    assert isinstance(events[-1], Done) and events[-1].tokens == reply.tokens
    with pytest.raises(ConfigError, match="has no chat template.*chat_template=FILE"):
        pair.chat(messages)  # a base model: no template of its own
    with pytest.raises(ConfigError, match=r"^messages\[1\] must be a dict"):
        pair.chat([messages[0], {"role": "user"}], chat_template=template)
    with pytest.raises(PromptError, match="no messages"):
        pair.chat([], chat_template=template)


def test_cli_words_become_the_arguments_names() -> None:
    from specgen.flags import in_python_words

    assert in_python_words("--top-p must be in [0, 1], got 2") == "top_p must be in [0, 1], got 2"
    assert in_python_words("-md needs -m (the target)") == "draft needs target (the target)"
    assert in_python_words("--no-live is bad; see top-k") == "--no-live is bad; see top-k"
    assert in_python_words("-t/--threads must be at least 1") == "threads must be at least 1"
    assert in_python_words("-x/--xy is -c/--ctx-size's") == "-x/--xy is ctx_size's"
    assert (
        in_python_words("--target needs --draft too: -md auto uses x; not --draft none")
        == 'target needs draft too: draft="auto" uses x; not draft="none"'
    )


def test_messages_are_checked_as_the_server_checks_them() -> None:
    from typing import get_args

    from specgen.apiargs import ROLES, check_messages
    from specgen.server.schemas import ChatMessage

    assert ROLES == get_args(ChatMessage.model_fields["role"].annotation)
    ok = [{"role": r, "content": "x", "name": "n"} for r in ROLES]
    assert check_messages(ok) == ok
    with pytest.raises(
        ConfigError, match=r"^messages\[1\]: role must be system, .* or tool, got 'bogus'"
    ):
        check_messages([ok[0], {"role": "bogus", "content": "x"}])


def test_import_specgen_is_cheap() -> None:
    """...and `dir(specgen)` lists the names loaded on first use (`load`, `Pair`...) for
    completion, without loading them."""
    code = (
        "import sys, specgen; listed = set(specgen.__all__) <= set(dir(specgen));"
        " print(sorted(m for m in ('numpy', 'llama_cpp') if m in sys.modules), listed)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[] True"


def test_chat_on_smollm2_sends_what_run_sends(smol_pair) -> None:
    """A real ChatML template: `Pair.chat` with one user message renders the prompt `run`
    renders (the same tokens), and its greedy reply is `run`'s."""
    target, draft = smol_pair
    args = dict(max_tokens=12, temperature=0, draft_max=4)
    with specgen.load(target, draft, ctx_size=512) as smol:
        reply = smol.chat([{"role": "user", "content": "Name a colour."}], **args)
    cli = run_json(
        "-m", str(target), "-md", str(draft), "-c", "512", "--temp", "0", "--draft-max", "4",
        "-n", "12", "Name a colour.",
    )  # fmt: skip
    assert reply.stats.n_prompt == cli["stats"]["n_prompt"] and cli["chat_template"] is not None
    assert reply.text == cli["text"] and reply.tokens == tuple(cli["tokens"])


def test_a_settings_object_and_token_ids_go_in_as_keywords_and_text_do(pair) -> None:
    """What `run` hands the API (its SamplingFlags, the prompt's token ids after its
    template) gives what keyword arguments and text give; keywords replace the object's
    fields; the Generation says its seed, settings and controller."""
    from specgen.chat import prompt_tokens

    flags = specgen.SamplingFlags(temp=0.0, draft_max="3", max_tokens=9, ignore_eos=True)
    ids = prompt_tokens(pair.session.target, b"the cat")
    gen = pair.stream(ids, flags, max_tokens=5)
    done = list(gen)[-1]
    by_words = pair.generate("the cat", temperature=0, draft_max=3, max_tokens=5, ignore_eos=True)
    assert isinstance(done, Done) and done.tokens == by_words.tokens and len(done.tokens) == 5
    assert gen.settings == replace(flags, max_tokens=5) and gen.n_prompt == len(ids)
    assert gen.controller is None  # a fixed K: no controller
    auto = pair.generate(ids, draft_max="auto", max_tokens=4, temperature=0)
    assert auto.controller is not None and "k_history" in auto.controller
    with pytest.raises(ConfigError, match=r"token ids must be in \[0, "):
        pair.generate([1, 10**9])


def test_ordinary_is_the_target_alone_and_of_drives_engines_loaded_elsewhere(pair) -> None:
    """`ordinary=True` (bench's baseline): the target alone on the loaded pair (no draft
    pass, K = 0 every round), the greedy text speculation gives; `Pair.of` drives engines
    loaded elsewhere (as `bench` does), with a fixed K the same rounds, and closing it
    leaves them open."""
    args = dict(max_tokens=10, temperature=0, draft_max=3, ignore_eos=True)
    spec = pair.generate("the cat", **args)
    events = list(pair.stream("the cat", ordinary=True, **args))
    done = events[-1]
    assert isinstance(events[0], Prefilled) and isinstance(done, Done)
    assert done.tokens == spec.tokens and spec.stats.n_drafted > 0
    assert done.stats.n_drafted == 0 and set(done.stats.k_history) == {0}
    auto = {**args, "draft_max": "auto"}  # no controller: nothing to choose
    assert pair.generate("the cat", ordinary=True, **auto).controller is None
    session = pair.session
    with specgen.Pair.of(session.target, session.drafter) as engines:
        again = engines.generate("the cat", **args)
    assert again.tokens == spec.tokens and again.stats.k_history == spec.stats.k_history
    assert pair.generate("the cat", **args).tokens == spec.tokens  # still open


@pytest.fixture(scope="module")
def many(tiny_target: Path, tiny_draft: Path):
    """The tiny pair with two sequences a model: two slots of the batch engine."""
    with specgen.load(tiny_target, tiny_draft, ctx_size=256, n_parallel=2) as p:
        yield p


@pytest.fixture(scope="module")
def ordinary(tiny_target: Path):
    with specgen.load(tiny_target, "none", ctx_size=256) as p:
        yield p


PROMPTS = ["the cat", "a dog ran", "the cat sat on"]


@pytest.mark.parametrize("draft_max", [3, "auto"])
def test_generate_many_is_ordinary_decoding_greedy_on_two_slots(many, ordinary, draft_max) -> None:
    """Three prompts on two slots (one waits for a slot), by the batch engine `serve`
    runs: each text is the target's greedy text; with auto the controller is calibrated
    first and drafts."""
    args = {"max_tokens": 16, "temperature": 0, "ignore_eos": True}
    results = many.generate_many(PROMPTS, draft_max=draft_max, **args)
    assert [len(r.tokens) for r in results] == [16, 16, 16]
    for prompt, r in zip(PROMPTS, results, strict=True):
        alone = ordinary.generate(prompt, **args)
        assert r.tokens == alone.tokens and r.text == alone.text and r.finish == "length"
    assert sum(r.stats.n_drafted for r in results) > 0
    assert all(r.controller is None and r.logprobs is None for r in results)


def test_generate_many_seeds_prompt_i_with_seed_plus_i_and_reproduces(many) -> None:
    args = {"max_tokens": 12, "temperature": 1.0, "draft_max": 3, "ignore_eos": True}
    a = many.generate_many(["the cat", "the cat"], seed=5, **args)
    many.generate("a dog", max_tokens=4)  # a single stream in between changes nothing
    b = many.generate_many(["the cat", "the cat"], seed=5, **args)
    assert [r.tokens for r in a] == [r.tokens for r in b]
    assert [r.seed for r in a] == [5, 6]
    assert a[0].tokens != a[1].tokens  # 12 sampled tokens at temperature 1: other seeds


def test_generate_many_takes_ordinary_as_generate_does(many, ordinary) -> None:
    args = {"max_tokens": 12, "temperature": 0, "ignore_eos": True}
    results = many.generate_many(PROMPTS[:2], ordinary=True, **args)
    assert [r.tokens for r in results] == [ordinary.generate(p, **args).tokens for p in PROMPTS[:2]]
    assert all(r.stats.n_drafted == 0 and r.stats.target_passes == 12 for r in results)


def test_tokenize_and_detokenize_are_the_prompts_own(pair) -> None:
    """`Pair.tokenize` gives the ids `generate` takes for the same text (start token
    included), and `detokenize` gives the text back."""
    ids = pair.tokenize("the cat")
    assert ids == pair.session.target.tokenize(b"the cat", add_special=True)
    assert ids[1:] == pair.tokenize("the cat", add_special=False)
    args = {"max_tokens": 6, "temperature": 0, "ignore_eos": True}
    assert pair.generate(ids, **args).tokens == pair.generate("the cat", **args).tokens
    # as the vocabulary spells them: a SentencePiece model's word-start space included
    assert pair.detokenize(ids[1:]) == " the cat" and pair.detokenize([]) == ""
    n = pair.session.target.n_vocab
    with pytest.raises(ConfigError, match=f"^token ids must be in \\[0, {n}\\)"):
        pair.detokenize([n])
    with pytest.raises(ConfigError, match="^tokens must be a list of token ids, got 'the cat'"):
        pair.detokenize("the cat")
    with pytest.raises(ConfigError, match="^text must be str or bytes, got 5"):
        pair.tokenize(5)  # type: ignore[arg-type]


def test_generate_many_refuses_what_it_cannot_do(many) -> None:
    with pytest.raises(PromptError, match="no prompts"):
        many.generate_many([])
    with pytest.raises(PromptError, match="^prompt 1: the prompt is empty"):
        many.generate_many(["the cat", ""])
    with pytest.raises(PromptError, match="prompt 0: the prompt .* context of 256"):
        many.generate_many(["the cat", "the cat"], max_tokens=400)  # beyond -c 256
    with pytest.raises(ConfigError, match="temperature"):
        many.generate_many(["the cat"], temperature="hot")
    for one in ("abc", [5, 6, 7]):  # one prompt: it was one prompt per character or token
        with pytest.raises(ConfigError, match="^prompts must be a list of prompts"):
            many.generate_many(one)
    with pytest.raises(ConfigError, match="n_parallel"):
        specgen.load("none-such.gguf", n_parallel=0)


def test_the_scheduler_serve_drives_is_the_apis(many, ordinary) -> None:
    """`Pair.scheduler` is `specgen serve`'s engine: a Job in, its events to the sink."""
    with pytest.raises(ValueError, match="sequences"):
        many.scheduler(n_parallel=3)
    with pytest.raises(ConfigError, match="slo_ttft_s must be more than 0"):
        many.scheduler(slo_ttft_s=0.0)
    with pytest.raises(ConfigError, match="slo_tpot_s must be 0 or more"):
        many.scheduler(slo_tpot_s=-0.08)
    many.scheduler(slo_tpot_s=0.0)  # ordinary decoding's own: a target, not an error
    sched = many.scheduler(draft_max=2)
    flags = specgen.SamplingFlags(temp=0, max_tokens=10, ignore_eos=True)
    config = specgen.GenerateConfig.of(flags, seed=1)
    ids = many.tokenize("the cat")
    got: list[object] = []
    ticket = sched.submit(specgen.Job("a", ids, config), got.append)
    assert isinstance(ticket, specgen.Ticket)
    sched.run_until_idle()
    done = got[-1]
    assert isinstance(done, Done) and all(isinstance(e, Step) for e in got[:-1])
    assert list(done.tokens) == list(
        ordinary.generate("the cat", max_tokens=10, temperature=0, ignore_eos=True).tokens
    )
    with pytest.raises(specgen.DoesNotFit):
        sched.submit(specgen.Job("b", [], config), got.append)


def test_one_generation_at_a_time_and_never_a_silent_mix(pair) -> None:
    """A second generation while one is open would truncate the caches under the first
    (wrong text with no error, or llama.cpp's GGML_ASSERT and a hang from another thread):
    it is refused with BusyError, from this thread (an unfinished stream) and from another,
    and the Pair is free again once the first has ended however it ends."""
    import threading

    args = {"max_tokens": 8, "temperature": 0, "draft_max": 3, "ignore_eos": True}
    alone = pair.generate("the cat", **args)
    it = pair.stream("the cat", **args)
    next(it)
    for call in (
        lambda: pair.generate("a dog", **args),
        lambda: pair.stream("a dog", **args),
        lambda: pair.generate_many(["a dog"], **args),
    ):
        with pytest.raises(specgen.BusyError, match="generating already"):
            call()
    other: list[BaseException] = []
    t = threading.Thread(target=lambda: _catch(other, lambda: pair.generate("a dog", **args)))
    t.start()
    t.join()
    assert len(other) == 1 and isinstance(other[0], specgen.BusyError)
    rest = [e for e in it]  # the first goes on undisturbed
    assert isinstance(rest[-1], Done) and rest[-1].tokens == alone.tokens
    assert pair.generate("the cat", **args).tokens == alone.tokens  # free after the Done
    it = pair.stream("the cat", **args)
    next(it)
    it.close()
    assert pair.generate("the cat", **args).tokens == alone.tokens  # free after close()
    dropped = pair.stream("the cat", **args)  # never started, then dropped
    del dropped
    assert pair.generate("the cat", **args).tokens == alone.tokens
    it = pair.stream("the cat", **args)  # Ctrl-C before the first event (relay's throw)
    with pytest.raises(KeyboardInterrupt):
        it.throw(KeyboardInterrupt())
    assert pair.generate("the cat", **args).tokens == alone.tokens  # was BusyError until gc


def test_the_pair_is_free_as_soon_as_the_done_is_handed_out(pair) -> None:
    """A caller that breaks out of its loop at the Done, or holds the stream after it, may
    call again at once (it was BusyError until one more next() or the stream's end); an
    interrupted Done (`throw`) frees it too, and the KeyboardInterrupt after it still comes
    on the next call: Ctrl-C is never swallowed."""
    args = {"max_tokens": 8, "temperature": 0, "draft_max": 3, "ignore_eos": True}
    alone = pair.generate("the cat", **args)
    held = pair.stream("the cat", **args)
    for ev in held:
        if isinstance(ev, Done):
            break
    assert not held.alive and ev.tokens == alone.tokens
    assert pair.generate("the cat", **args).tokens == alone.tokens
    with pytest.raises(StopIteration):
        next(held)
    held = pair.stream("the cat", **args)
    next(held)
    done = held.throw(KeyboardInterrupt())
    assert isinstance(done, Done) and done.finish_reason == "interrupted"
    assert pair.generate("the cat", **args).tokens == alone.tokens
    with pytest.raises(KeyboardInterrupt):
        next(held)
    with pytest.raises(StopIteration):
        next(held)
    with pytest.raises(KeyboardInterrupt):  # thrown after the end: raised as it is
        held.throw(KeyboardInterrupt())


def test_a_pairs_start_up_is_timed_by_its_first_call_and_kept(tiny_target, tiny_draft) -> None:
    """The ordinary passes and the controller's calibration are timed once per Pair (each
    call paid 100-250 ms for them, which its stats leave out): later calls keep them."""
    args = {"max_tokens": 12, "temperature": 0, "ignore_eos": True}  # draft_max auto
    with specgen.load(tiny_target, tiny_draft, ctx_size=256) as p:
        kept = p.session.start_up
        assert kept.passes == [] and kept.controller is None
        a = p.generate("the cat", **args)
        controller, passes = kept.controller, list(kept.passes)
        assert controller is not None and len(passes) == 3
        b = p.generate("the cat", **args)
        assert kept.controller is controller and kept.passes == passes
    assert a.tokens == b.tokens and b.stats.ordinary_token_s is not None


def test_a_stream_is_cancelled_from_another_thread(pair) -> None:
    """`Generation.cancel()` stops a stream that another thread iterates (``close()``
    there raises "generator already executing", and the stream ran to its end): the
    consumer gets the Done, finish "interrupted", and the Pair is free again. A ``with``
    block closes a stream."""
    gen = pair.stream("the cat", max_tokens=200, temperature=0, draft_max=3, ignore_eos=True)
    events: list = []
    seen, cancelled = threading.Event(), threading.Event()

    def consume() -> None:
        for ev in gen:
            events.append(ev)
            if isinstance(ev, specgen.Step) and not seen.is_set():
                seen.set()
                cancelled.wait(30)

    consumer = threading.Thread(target=consume)
    consumer.start()
    assert seen.wait(60)
    gen.cancel()
    cancelled.set()
    consumer.join(60)
    assert not consumer.is_alive()
    done = events[-1]
    assert isinstance(done, specgen.Done) and done.finish_reason == "interrupted"
    assert 0 < len(done.tokens) < 200
    with pair.stream("the cat", max_tokens=50) as open_one:
        next(open_one)
    assert len(pair.generate("the cat", max_tokens=3, ignore_eos=True).tokens) == 3


def _catch(into: list[BaseException], call) -> None:
    try:
        call()
    except BaseException as e:  # noqa: BLE001 - the test looks at it
        into.append(e)


def test_a_hybrid_pairs_first_call_is_the_same_call_made_again(demo_pair) -> None:
    """Prompt lookup's record is each generation's own: kept from an earlier call it
    changed which tokens were proposed, and so a seeded sampled text (the first call
    after `load` differed from the same call made again, while `run` gives the first)."""
    args = {"max_tokens": 40, "temperature": 0.8, "seed": 7, "draft_max": 4}
    with specgen.load(*demo_pair, lookup="on", ctx_size=512) as hybrid:
        texts = [hybrid.generate("Once upon a time", **args) for _ in range(3)]
    assert texts[0].stats.n_drafted_by.get("lookup", 0) > 0  # the lookup took part
    assert texts[0].tokens == texts[1].tokens == texts[2].tokens


def test_a_prediction_is_drafted_from_and_changes_no_token(demo_pair) -> None:
    """``prediction`` (OpenAI's Predicted Outputs) through the API, one stream and the
    batch engine (the demo pair: text that tokenizes back to its tokens): an answer given
    back as the prediction is the same answer, now drafted mostly by prompt lookup from
    it; the same call without it drafts far less so."""
    args = {"max_tokens": 32, "temperature": 0, "draft_max": 4, "ignore_eos": True}

    def by_lookup(r) -> int:
        return r.stats.n_accepted_by.get("prediction", 0)

    with specgen.load(*demo_pair, ctx_size=512, n_parallel=2) as p:
        free = p.generate("Once upon a time", **args)
        got = p.generate("Once upon a time", prediction=free.text, **args)
        both = p.generate_many(["Once upon a time"] * 2, prediction=free.text, **args)
        with pytest.raises(ConfigError, match="prediction must be"):
            p.generate("the cat", prediction=5)
    assert got.tokens == free.tokens
    assert by_lookup(got) >= len(got.tokens) // 2 > by_lookup(free), (free.stats, got.stats)
    assert [r.tokens for r in both] == [free.tokens, free.tokens]
    assert all(by_lookup(r) >= len(r.tokens) // 2 for r in both)


def test_a_long_value_of_the_wrong_type_is_cut_in_its_message() -> None:
    """A file's text given where a setting goes (``prediction=file.read_bytes()``) was
    quoted whole in the one-line error."""
    from specgen.flags import SamplingFlags

    with pytest.raises(ConfigError) as got:
        SamplingFlags(prediction=b"x" * 90_000)  # type: ignore[arg-type]
    message = str(got.value)
    assert message.startswith("prediction must be text or None, got b'xxx")
    assert message.endswith("...") and len(message) < 200
