"""The single stream's draft prefill is lazy (issues 33 and 37), as it is the server's (one
engine): the first round is ordinary and makes no draft call, the draft model's prompt
is a catch-up in the first depth of the first block the model drafts, covering every
committed token; rounds of prompt lookup alone never evaluate it. On fakes: the decodes
each model receives are logged."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import FakeEngine

from specgen.drafters import ModelDrafter
from specgen.events import Done
from specgen.generate import AutoK, FixedK, GenerateConfig, KPolicy, generate
from specgen.hybrid import HybridDrafter
from specgen.ngram import NgramDrafter
from specgen.sampling import SamplingParams

GREEDY = SamplingParams(temp=0.0)
V = 9


def ordinary(target: FakeEngine, prompt: list[int], **cfg: object) -> Done:
    """Ordinary decoding's Done (no drafter)."""
    done = list(generate(target, None, prompt, GenerateConfig(**cfg)))[-1]
    assert isinstance(done, Done)
    return done


def logged(engine: FakeEngine) -> list[tuple[int, list[int]]]:
    """Record each decode of `engine` as (cached positions before it, its tokens)."""
    log: list[tuple[int, list[int]]] = []
    real = engine.decode

    def decode(tokens, all_logits=False, rows=None):
        log.append((len(engine.tokens), list(tokens)))
        return real(tokens, all_logits, rows)

    engine.decode = decode
    return log


def cycling_prompt(target: FakeEngine, n: int = 60) -> list[int]:
    """[1, 2] and n of `target`'s greedy tokens after it: a greedy bigram-ish model over 9
    tokens enters a cycle within 81 steps, so from there on the text copies itself and
    prompt lookup proposes exactly what the target commits."""
    return [1, 2, *ordinary(target, [1, 2], max_tokens=n, params=GREEDY, ignore_eos=True).tokens]


def run(target, drafter, prompt, policy: KPolicy, n: int = 40) -> Done:
    config = GenerateConfig(max_tokens=n, params=GREEDY, ignore_eos=True, measure_ordinary=3)
    events = list(generate(target, drafter, prompt, config, policy))
    done = events[-1]
    assert isinstance(done, Done)
    return done


@pytest.mark.parametrize("policy", ["fixed", "auto"])
def test_lookup_rounds_alone_never_evaluate_the_drafts_prompt(policy: str) -> None:
    """On a text that copies itself, a hybrid drafter makes the rounds `--draft ngram`
    makes (at a fixed K) and the draft model evaluates nothing but the adaptive policy's timed passes
    (the controller's start-up decodes, each rolled back): no prompt, no block."""
    target = FakeEngine(n_vocab=V, seed=0, n_ctx=512)
    prompt = cycling_prompt(target)
    draft = FakeEngine(n_vocab=V, seed=0, noise=0.5, n_ctx=512)
    log = logged(draft)

    def make() -> KPolicy:
        return FixedK(4) if policy == "fixed" else AutoK(8)

    hybrid = run(target, HybridDrafter(ModelDrafter(draft, GREEDY, V)), prompt, make())
    lookup = run(FakeEngine(n_vocab=V, seed=0, n_ctx=512), NgramDrafter(V), prompt, make())
    # timed after the first round where the draft's empty cache stands: 3 decodes of one
    # token, then one of a catch-up's 17 (`Scheduler.calibrate`)
    timed = [(0, [0])] * 3 + [(0, [0] * 17)] if policy == "auto" else []
    assert log == timed and draft.tokens == []
    s = hybrid.stats
    assert s.k_history[0] == 0 and sum(k > 0 for k in s.k_history) >= 5  # it did speculate
    assert s.n_drafted_by == {"lookup": s.n_drafted} and s.n_accepted == s.n_drafted
    if policy == "fixed":  # (auto's choices follow the host's timings: not repeatable)
        assert s.k_history == lookup.stats.k_history  # the same rounds as lookup alone
    assert hybrid.tokens == lookup.tokens
    plain = ordinary(FakeEngine(n_vocab=V, seed=0, n_ctx=512), prompt, max_tokens=40,
                     params=GREEDY, ignore_eos=True)  # fmt: skip
    assert hybrid.tokens == plain.tokens


@pytest.mark.parametrize("lookup", [False, True])
def test_the_first_model_block_follows_a_prefill_of_every_committed_token(lookup: bool) -> None:
    """Where the model drafts (lookup has nothing, or it failed), its first decode
    evaluates every committed token, from position 0 (the catch-up and the block's first
    depth in one decode), and the model alone is never behind again by more than a round.
    The prompt here was written by another model, so its copies mislead the lookup and
    the model takes over."""
    target = FakeEngine(n_vocab=V, seed=0, n_ctx=512)
    prompt = cycling_prompt(FakeEngine(n_vocab=V, seed=3), 30)
    draft = FakeEngine(n_vocab=V, seed=0, noise=0.5, n_ctx=512)
    log = logged(draft)
    model = ModelDrafter(draft, GREEDY, V)
    done = run(target, HybridDrafter(model) if lookup else model, prompt, FixedK(4))
    committed = prompt + list(done.tokens)
    starts = [i for i, (at, toks) in enumerate(log) if len(toks) > 1]
    assert starts, "the model never drafted"
    first = starts[0]
    at, toks = log[first]
    assert at == 0 and toks == committed[: len(toks)]  # the prompt and what followed it
    if not lookup:  # then at most `last` and a fully accepted block's x_K: never behind
        assert all(len(t) <= 2 for _, t in log[first + 1 :])
    assert done.stats.n_drafted_by.get("draft", 0) > 0
    plain = ordinary(FakeEngine(n_vocab=V, seed=0, n_ctx=512), prompt, max_tokens=40,
                     params=GREEDY, ignore_eos=True)  # fmt: skip
    assert done.tokens == plain.tokens


def test_the_drafts_catch_up_counts_as_drafting_and_the_ttft_is_one_decode(monkeypatch) -> None:
    """On a fake clock (10 ms a target decode, 3 ms a draft decode): the first token comes
    from the one decode that evaluates the prompt (TTFT = prefill = 10 ms); the draft's
    deferred prompt is the first block's catch-up, in that round's drafting and so in
    `decode_s`, as the server counts it."""
    import time

    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    target = FakeEngine(n_vocab=V, seed=0)
    draft = FakeEngine(n_vocab=V, seed=0, noise=0.5)
    for engine, seconds in ((target, 0.010), (draft, 0.003)):
        real = engine.decode

        def decode(tokens, all_logits=False, rows=None, _real=real, _s=seconds):
            clock[0] += _s
            return _real(tokens, all_logits, rows)

        monkeypatch.setattr(engine, "decode", decode)
    done = run(target, ModelDrafter(draft, GREEDY, V), [1, 2, 3, 4, 5], FixedK(4), n=30)
    s = done.stats
    assert s.ttft_s == pytest.approx(0.010)
    assert s.prefill_s == pytest.approx(0.010)
    # every round's time is in decode_s, and nothing else is: rounds of the block, and
    # the three timed ordinary passes left out
    assert s.decode_s == pytest.approx(s.draft_s + s.verify_s + s.sample_s, abs=1e-9)
    assert np.isclose(s.wall_s, s.prefill_s + s.decode_s)


def held_run(monkeypatch, prompt: list[int]):
    """A greedy hybrid generation of 40 tokens under `auto` on a fake clock (a target decode
    10 ms and 1 ms a token, so that speculation can pay; a draft token 3 ms), so the
    controller's choices do not depend on the machine.
    Returns (its steps, the index of the first with a model token, the steps held to
    lookup before it, the draft's decodes, the Done); the output is checked against
    ordinary decoding's."""
    import time

    from specgen.events import Step

    v = 60
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    target = FakeEngine(n_vocab=v, seed=0, n_ctx=512)
    draft = FakeEngine(n_vocab=v, seed=0, noise=0.3, n_ctx=512)
    for engine, fixed, seconds in ((target, 0.010, 0.001), (draft, 0.0, 0.003)):
        real = engine.decode

        def decode(tokens, all_logits=False, rows=None, _real=real, _f=fixed, _s=seconds):
            clock[0] += _f + _s * len(tokens)
            return _real(tokens, all_logits, rows)

        monkeypatch.setattr(engine, "decode", decode)
    log = logged(draft)
    config = GenerateConfig(max_tokens=40, params=GREEDY, ignore_eos=True, measure_ordinary=3)
    hybrid = HybridDrafter(ModelDrafter(draft, GREEDY, v))
    events = list(generate(target, hybrid, prompt, config, AutoK(8)))
    steps = [e for e in events if isinstance(e, Step)]
    first_model = next(i for i, s in enumerate(steps) if s.n_drafted_by.get("draft", 0))
    held = [s for s in steps[1:first_model] if s.k_reason == "lookup_first"]
    done = events[-1]
    assert isinstance(done, Done)
    plain = ordinary(FakeEngine(n_vocab=v, seed=0, n_ctx=512), prompt, max_tokens=40,
                     params=GREEDY, ignore_eos=True)  # fmt: skip
    assert done.tokens == plain.tokens
    return steps, first_model, held, log, done


@pytest.mark.parametrize("n_prompt", [30, 9])
def test_a_hybrid_tries_its_lookup_before_the_drafts_prefill(monkeypatch, n_prompt) -> None:
    """Under `auto`, a hybrid slot whose draft has not evaluated the prompt drafts by
    lookup alone until its lookup has gained nothing in `LOOKUP_FIRST` steps (here it
    offers nothing: those steps ordinary, reason "lookup_first"); then the model is let
    in, its first block after a prefill of every committed token. A prompt whose catch-up
    costs less than `LOOKUP_FIRST` target passes (longer than a block, though) lets the
    model in at once."""
    from specgen.sched.step import LOOKUP_FIRST

    prompt = list(range(1, n_prompt + 1))  # no n-gram repeats: the lookup has nothing
    steps, first_model, held, log, _ = held_run(monkeypatch, prompt)
    if n_prompt == 9:  # 9 draft tokens (27 ms) cost less than 3 target passes (33 ms)
        assert first_model == 1 and not held
    else:
        assert (
            LOOKUP_FIRST > 0 and len(held) == first_model - 1
        )  # every step before the model's held to lookup
        assert sum(s.k == 0 for s in held) == LOOKUP_FIRST  # until that many offered none
        assert all(s.n_drafted_by.get("draft", 0) == 0 for s in held)
        # no decode of the prompt before the model's first block (the controller's timed
        # passes have one token, or a catch-up's worth from an empty cache, rolled back)
        prefills = [at for at, toks in log if len(toks) > 17]
        assert prefills and prefills[0] == 0


def test_a_held_hybrid_proposes_as_prompt_lookup_alone(monkeypatch) -> None:
    """While the model is held out the hybrid is prompt lookup alone: it proposes after a
    1-token match too (outside the hold a match must be `min_match` = 2 tokens long), and
    a held step whose lookup tokens are all rejected counts towards `LOOKUP_FIRST` as one
    that offered nothing, so a text the lookup keeps failing on still gets the model."""
    from specgen.sched.step import LOOKUP_FIRST

    prompt = list(range(1, 30)) + [5]  # "5" matched at 4: the lookup offers "6 7 ..."
    steps, first_model, held, _, _ = held_run(monkeypatch, prompt)
    assert held and held[0].n_drafted_by.get("lookup", 0) > 0  # the 1-token match proposed
    assert len(held) == first_model - 1
    assert sum(s.n_accepted == 0 for s in held) == LOOKUP_FIRST
    assert all(s.n_drafted_by.get("draft", 0) == 0 for s in held)


def test_the_hold_lasts_until_the_lookup_fails_though_the_costs_move() -> None:
    """`_lookup_first` decides on a hold by the catch-up's cost against `LOOKUP_FIRST`
    ordinary passes, then keeps it while the lookup gains (the costs move with every
    decode: a catch-up near the threshold let the model in after one step); only
    `LOOKUP_FIRST` fruitless steps end it. A slot that was never held decides each step."""
    from specgen.control.batch import BatchController
    from specgen.control.costs import Line
    from specgen.sched.slot import Slot
    from specgen.sched.step import LOOKUP_FIRST, _lookup_first

    draft = FakeEngine(n_vocab=V, seed=0, n_ctx=512)
    slot = Slot(0, FakeEngine(n_vocab=V, seed=0, n_ctx=512), draft)
    slot.drafter = HybridDrafter(ModelDrafter(draft, GREEDY, V))
    slot.catch_up = 100
    ctl = BatchController(target_prior=Line(0.040, 0.005))  # an ordinary pass: 45 ms
    ctl.draft.set_prior(Line(0.0, 0.020), 0.0014)  # the catch-up: 140 ms, over 135
    assert _lookup_first(slot, 8, ctl)
    ctl.draft.set_prior(Line(0.0, 0.020), 0.0013)  # now 130 ms: under, yet still held
    assert _lookup_first(slot, 8, ctl)
    slot.lookup_misses = LOOKUP_FIRST
    assert not _lookup_first(slot, 8, ctl)
    fresh = Slot(1, FakeEngine(n_vocab=V, seed=0, n_ctx=512), draft)
    fresh.drafter, fresh.catch_up = slot.drafter, 100
    assert not _lookup_first(fresh, 8, ctl)  # 130 ms: not held
    assert not _lookup_first(slot, 0, ctl)  # an ordinary step is never held
