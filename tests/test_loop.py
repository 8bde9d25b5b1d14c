"""The loop's logic on scripted in-memory models: exact checks of greedy equality,
rollback discipline, stop/EOS/limit/context handling, and a statistical check that the
whole loop samples the target's joint distribution (chi-square, fixed seed, p > 1e-4)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pytest
from fakes import FakeEngine, WrongDrafter
from reference import probs
from scipy import stats

from specgen import rejection
from specgen.drafters import ModelDrafter
from specgen.errors import PromptError
from specgen.events import Done, Prefilled, Step
from specgen.generate import AutoK, FixedK, GenerateConfig, generate
from specgen.sampling import SamplingParams, draw

GREEDY = SamplingParams(temp=0.0)


@dataclass(frozen=True)
class NoBonusK(FixedK):
    """Fixed K, scoring only x_1..x_K (what a probe does): no bonus token."""

    def bonus(self) -> bool:
        return False


def run(target, drafter, prompt, k, policy=FixedK, **cfg):
    events = list(generate(target, drafter, prompt, GenerateConfig(**cfg), policy(k)))
    assert isinstance(events[0], Prefilled) and isinstance(events[-1], Done)
    return events


def ordinary(target, prompt, **cfg):
    return run(target, None, prompt, 0, **cfg)[-1]


@pytest.mark.parametrize("policy", [FixedK, NoBonusK])
@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("prompt", [[1], [3, 4, 1], [2, 2, 2, 2, 2, 7]])
def test_greedy_speculative_equals_ordinary(k, prompt, policy):
    target = FakeEngine(n_vocab=9, seed=0)
    draft = FakeEngine(n_vocab=9, seed=0, noise=1.5)
    base = ordinary(target, prompt, max_tokens=40, params=GREEDY)
    spec = run(
        target, ModelDrafter(draft, GREEDY, 9), prompt, k, policy, max_tokens=40, params=GREEDY
    )
    done = spec[-1]
    assert done.tokens == base.tokens and done.text == base.text
    s = done.stats
    assert 0 < s.n_accepted < s.n_drafted  # the noisy draft is sometimes right, sometimes not
    assert s.n_generated == 40 and (s.target_passes < 40 or (policy is NoBonusK and k == 1))


@pytest.mark.parametrize("policy", [FixedK, NoBonusK])
def test_greedy_block_verification_equals_ordinary(policy):
    target = FakeEngine(n_vocab=9, seed=0)
    draft = FakeEngine(n_vocab=9, seed=0, noise=1.5)
    base = ordinary(target, [3, 4, 1], max_tokens=40, params=GREEDY)
    drafter = ModelDrafter(draft, GREEDY, 9)
    cfg = {"max_tokens": 40, "params": GREEDY, "verify_rule": "block"}
    done = run(target, drafter, [3, 4, 1], 4, policy, **cfg)[-1]
    assert done.tokens == base.tokens and done.stats.verify_rule == "block"


def test_block_verification_accepts_more_than_token_wise():
    """Same seeds, same pair at temperature 1: block verification's mean accepted length
    per round is larger (seeded; about 3.7 against 3.2 tokens per pass over ~900 rounds,
    a gap near ten standard errors on this pair)."""
    params = SamplingParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.0)
    v = 6
    means = {}
    for rule in ("token", "block"):
        target = FakeEngine(n_vocab=v, seed=0, scale=1.0, n_ctx=4096)
        draft = FakeEngine(n_vocab=v, seed=0, scale=1.0, noise=1.0, n_ctx=4096)
        drafter = ModelDrafter(draft, params, v)
        cfg = {"max_tokens": 3000, "params": params, "seed": 5, "verify_rule": rule}
        s = run(target, drafter, [1], 6, **cfg)[-1].stats
        means[rule] = s.n_generated / s.target_passes
        assert s.n_drafted_by.keys() == {"draft"} and s.verify_rule == rule
    assert means["block"] > means["token"] + 0.2


def test_wrong_drafter_changes_nothing_at_temperature_zero():
    target = FakeEngine(n_vocab=9, seed=2)
    base = ordinary(target, [1, 2], max_tokens=30, params=GREEDY)
    done = run(target, WrongDrafter(target), [1, 2], 4, max_tokens=30, params=GREEDY)[-1]
    assert done.tokens == base.tokens
    # the first round is ordinary and the last has room for one token only: neither drafts
    assert done.stats.n_accepted == 0 and done.stats.n_drafted == 28
    assert done.stats.target_passes == 30  # one token per pass, like ordinary decoding


def test_identical_draft_accepts_everything_when_sampling():
    params = SamplingParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.0)
    target = FakeEngine(n_vocab=9, seed=3)
    draft = FakeEngine(n_vocab=9, seed=3)
    done = run(
        target, ModelDrafter(draft, params, 9), [1], 4, max_tokens=50, params=params, seed=7
    )[-1]
    assert done.stats.acceptance_rate == 1.0
    # 1 ordinary token, then 49 in blocks of 4 + bonus (the last block 3 + bonus)
    assert done.stats.target_passes == 11


def test_caches_hold_committed_minus_last_after_every_round():
    target = FakeEngine(n_vocab=9, seed=0)
    draft = FakeEngine(n_vocab=9, seed=0, noise=1.0)
    prompt = [4, 5]
    emitted: list[int] = []
    for ev in generate(
        target,
        ModelDrafter(draft, GREEDY, 9),
        prompt,
        GenerateConfig(max_tokens=25, params=GREEDY),
        FixedK(5),
    ):
        if isinstance(ev, Step):
            emitted += [s.token for s in ev.spans]
            committed = prompt + emitted
            assert target.tokens == committed[:-1]
            assert draft.tokens == committed[: len(draft.tokens)]
    assert target.tokens == (prompt + emitted)[:-1]


def test_closing_the_generator_early_restores_the_caches():
    target = FakeEngine(n_vocab=9, seed=0)
    draft = FakeEngine(n_vocab=9, seed=0, noise=1.0)
    gen = generate(
        target,
        ModelDrafter(draft, GREEDY, 9),
        [1],
        GenerateConfig(max_tokens=50, params=GREEDY),
        FixedK(6),
    )
    emitted = []
    for ev in gen:
        if isinstance(ev, Step):
            emitted += [s.token for s in ev.spans]
            if len(emitted) > 5:
                break
    gen.close()
    assert target.tokens == ([1] + emitted)[:-1]


def test_interrupt_inside_a_decode_ends_cleanly():
    target = FakeEngine(n_vocab=9, seed=0)
    real = target.decode
    calls = itertools.count()

    def flaky(tokens, all_logits=False):
        out = real(tokens, all_logits)
        if next(calls) == 4:
            raise KeyboardInterrupt
        return out

    target.decode = flaky
    events = []
    with pytest.raises(KeyboardInterrupt):  # never swallowed: callers that loop must stop
        for ev in generate(target, None, [1], GenerateConfig(max_tokens=50, params=GREEDY)):
            events.append(ev)
    done = events[-1]  # the text so far comes first, for `run` to show
    assert isinstance(done, Done)
    assert done.finish_reason == "interrupted" and 0 < len(done.tokens) < 50
    assert target.tokens == ([1] + list(done.tokens))[:-1]


def test_interrupt_during_the_prefill_is_raised_after_an_empty_done():
    target = FakeEngine(n_vocab=9, seed=0)

    def ctrl_c(tokens, all_logits=False):
        raise KeyboardInterrupt

    target.decode = ctrl_c
    gen = generate(target, None, [1, 2, 3], GenerateConfig(max_tokens=5, params=GREEDY))
    done = next(gen)
    assert isinstance(done, Done) and done.finish_reason == "interrupted" and not done.tokens
    with pytest.raises(KeyboardInterrupt):
        next(gen)


def test_eos_inside_an_accepted_block_ends_there():
    pieces = {i: bytes([97 + i]) for i in range(9)}
    target = FakeEngine(n_vocab=9, seed=5, eos=0, pieces=pieces)
    base = ordinary(target, [3], max_tokens=200, params=GREEDY)
    assert base.finish_reason == "eos", "this seed must reach EOS"
    draft = FakeEngine(n_vocab=9, seed=5, eos=0, pieces=pieces)  # identical: all accepted
    done = run(target, ModelDrafter(draft, GREEDY, 9), [3], 8, max_tokens=200, params=GREEDY)[-1]
    assert done.finish_reason == "eos" and done.tokens == base.tokens
    assert 0 not in done.tokens
    s = done.stats
    assert s.n_generated == len(base.tokens)
    assert s.n_accepted <= s.n_generated + 1  # nothing counted past the EOS


def test_stop_string_completed_inside_a_block():
    target = FakeEngine(n_vocab=9, seed=0)
    base = ordinary(target, [1], max_tokens=30, params=GREEDY)
    stop = base.text[7:10]
    draft = FakeEngine(n_vocab=9, seed=0)
    done = run(
        target, ModelDrafter(draft, GREEDY, 9), [1], 8, max_tokens=30, params=GREEDY, stop=(stop,)
    )[-1]
    cut = base.text.find(stop)
    assert done.finish_reason == "stop" and done.text == base.text[:cut]


def test_context_full_ends_with_context_and_no_overflow():
    target = FakeEngine(n_vocab=9, seed=0, n_ctx=20)
    draft = FakeEngine(n_vocab=9, seed=0, n_ctx=20)
    done = run(target, ModelDrafter(draft, GREEDY, 9), [1, 2, 3], 8, max_tokens=100, params=GREEDY)[
        -1
    ]
    assert done.finish_reason == "context"  # the context filled before -n
    assert len(done.tokens) == 20 - 3  # the prompt and the output fit the context
    base = ordinary(
        FakeEngine(n_vocab=9, seed=0, n_ctx=20), [1, 2, 3], max_tokens=100, params=GREEDY
    )
    assert base.tokens == done.tokens and base.finish_reason == "context"
    # -n exactly what the context holds: -n is reached first, so "length"
    exact = ordinary(
        FakeEngine(n_vocab=9, seed=0, n_ctx=20), [1, 2, 3], max_tokens=17, params=GREEDY
    )
    assert exact.tokens == done.tokens and exact.finish_reason == "length"


def test_prompt_errors():
    target = FakeEngine(n_vocab=9, n_ctx=8)
    with pytest.raises(PromptError, match="empty"):
        list(generate(target, None, [], GenerateConfig()))
    with pytest.raises(PromptError, match="context holds 8"):
        list(generate(target, None, [1] * 8, GenerateConfig()))


def test_seed_reproducible_and_different_seeds_differ():
    params = SamplingParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.0)

    def sample(seed):
        t = FakeEngine(n_vocab=9, seed=0, scale=1.0)
        d = FakeEngine(n_vocab=9, seed=0, scale=1.0, noise=0.5)
        return run(t, ModelDrafter(d, params, 9), [1], 4, max_tokens=30, params=params, seed=seed)[
            -1
        ].tokens

    assert sample(1) == sample(1)
    assert sample(1) != sample(2)


@pytest.mark.parametrize(
    ("params", "policy", "k", "rule"),
    [
        (SamplingParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.0), FixedK, 2, "token"),
        (SamplingParams(temp=0.7, top_k=3, top_p=0.9, min_p=0.05), FixedK, 2, "token"),
        (SamplingParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.0), NoBonusK, 1, "token"),
        (SamplingParams(temp=0.7, top_k=3, top_p=0.9, min_p=0.05), NoBonusK, 2, "token"),
        (SamplingParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.0), FixedK, 3, "block"),
        (SamplingParams(temp=0.7, top_k=3, top_p=0.9, min_p=0.05), FixedK, 2, "block"),
        (SamplingParams(temp=0.7, top_k=3, top_p=0.9, min_p=0.05), NoBonusK, 3, "block"),
    ],
)
def test_loop_samples_the_targets_joint_distribution(params, policy, k, rule):
    """First three tokens of (prompt [1]): the exact law is the product of the target's
    warped conditionals; the draft is a different, noisy model. Also without the bonus
    row (a probe): then every token is an accepted proposal or a residual draw. Under
    either acceptance rule (`--verify token|block`); every run's first round verifies a
    block of min(K, 3) proposals. On 600 runs, the sample on which the planted bugs
    below fail (token-wise was 2,500; block verification was 5,000, on runs whose
    ordinary first pass left room for blocks of one proposal only, where the two rules
    coincide; its subtler planted bugs are shown failing in tests/test_block_verify.py,
    on 8,000 rounds of a case chosen for them)."""
    assert joint_pvalue(params, policy, k, rule, 600) > 1e-4


def test_a_broken_residual_in_the_loop_is_detected(monkeypatch):
    """The test above has power: a residual drawn from p (not renormalized max(0, p - q))
    fails it on 600 runs (measured with these seeds 2026-12-03: p = 3e-11; 1e-22 at
    temperature 0.7 with top-k 3, top-p 0.9, min-p 0.05; 8e-16 and 1e-34 without the bonus
    row)."""

    def broken(n, q, p, rng):
        ids, w = p.row(n) if hasattr(p, "row") else (np.arange(p.shape[1]), p[n])
        return int(rng.choice(ids, p=w / w.sum()))

    monkeypatch.setattr(rejection, "correct", broken)
    params = SamplingParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.0)
    assert joint_pvalue(params, FixedK, 2, "token", 600) < 1e-4


def test_a_broken_block_residual_in_the_loop_is_detected(monkeypatch):
    """The block cases above have power: block verification's correction drawn from
    p_tau (not the block residual) fails them on 600 runs (measured with these seeds
    2026-12-03: p = 5e-11 at K = 3, temperature 1; at 0.7 with top-k 3, top-p 0.9, min-p
    0.05: 6e-21 at K = 2, 3e-28 at K = 3 without the bonus row)."""
    real = rejection.block_correct

    def from_p(tau, big_p_tau, q, p, rng):
        if tau < len(rejection.as_dists(q)):
            return draw(*rejection.as_dists(p).row(tau), rng)
        return real(tau, big_p_tau, q, p, rng)

    monkeypatch.setattr(rejection, "block_correct", from_p)
    params = SamplingParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.0)
    assert joint_pvalue(params, FixedK, 3, "block", 600) < 1e-4


def joint_pvalue(params, policy, k, rule, n):
    """Chi-square p-value of the first three tokens of `n` runs (seeds 0..n-1) against
    their exact law."""
    v = 5
    target = FakeEngine(n_vocab=v, seed=0, scale=1.0)
    draft = FakeEngine(n_vocab=v, seed=0, scale=1.0, noise=1.0)
    law = {}
    for seq in itertools.product(range(v), repeat=3):
        ctx, pr = [1], 1.0
        for x in seq:
            pr *= probs(target.logits_after(ctx), params)[x]
            ctx.append(x)
        law[seq] = pr
    counts = dict.fromkeys(law, 0)
    drafter = ModelDrafter(draft, params, v)
    for s in range(n):
        # a first round that speculates (as `specgen verify` runs it) and 4 tokens: the
        # first block has min(K, 3) proposals (after an ordinary first pass, 3 tokens left
        # room for one proposal and the bonus only)
        config = GenerateConfig(max_tokens=4, params=params, seed=s, verify_rule=rule)
        events = list(generate(target, drafter, [1], config, policy(k), ordinary_first=False))
        first = next(e for e in events if isinstance(e, Step))
        assert first.k == min(k, 3) and isinstance(events[-1], Done)
        counts[tuple(events[-1].tokens[:3])] += 1
    keys = sorted(law)
    exp = np.array([law[k] for k in keys]) * n
    obs = np.array([counts[k] for k in keys], dtype=float)
    if obs[exp == 0].sum() > 0:
        return 0.0  # a sequence of probability 0 was emitted
    big = exp >= 5  # pool small cells so the chi-square approximation holds
    small = (exp > 0) & ~big
    obs_p = np.append(obs[big], obs[small].sum()) if small.any() else obs[big]
    exp_p = np.append(exp[big], exp[small].sum()) if small.any() else exp[big]
    return stats.chisquare(obs_p, exp_p).pvalue


def test_catch_up_is_charged_apart_from_drafting(monkeypatch: pytest.MonkeyPatch) -> None:
    """After ordinary rounds the drafter evaluates the missed tokens in the same batch
    that yields x_1's row: only the part beyond one single-token pass is catch-up.
    A fake clock advances 20 ms + 10 ms per token on every decode, so the split is exact."""
    import time

    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    draft = FakeEngine(n_vocab=9, seed=3)
    real_decode = draft.decode

    def timed_decode(tokens: list[int], all_logits: bool = False) -> np.ndarray:
        clock[0] += 0.02 + 0.01 * len(tokens)
        return real_decode(tokens, all_logits)

    monkeypatch.setattr(draft, "decode", timed_decode)
    d = ModelDrafter(draft, GREEDY, 9)
    context = [1, 2, 3]
    d.prefill(context)
    rng = np.random.default_rng(0)
    first = d.draft(context, 3, rng)  # up to date: two single-token passes after x_1
    assert d.catchup_s == 0.0  # the drafter reports it, not the block
    # ten ordinary tokens it never saw, differing from its own proposals
    context = context + [(x + 1) % 9 for x in first.tokens.tolist()] + [1, 2, 3, 4, 5, 6, 7]
    n_sync = len(context) - 3  # all but the shared prompt
    d.draft(context, 1, rng)
    # the sync evaluates 10 tokens (0.12 s); one pass (0.03 s) would have been paid anyway
    assert n_sync == 10
    assert d.catchup_s == pytest.approx(0.02 + 0.01 * n_sync - 0.03, abs=1e-9)


def test_second_turn_evaluates_only_its_new_tokens():
    """A chat's next prompt extends the last one (prompt, reply, new user text): with
    `reuse_cache`, prefill keeps the cached common prefix and evaluates only the rest, and
    the output equals a fresh generation of the same prompt."""
    target = FakeEngine(n_vocab=9, seed=0)
    draft = FakeEngine(n_vocab=9, seed=0, noise=1.0)
    drafter = ModelDrafter(draft, GREEDY, 9)
    cfg = dict(max_tokens=12, params=GREEDY, reuse_cache=True)
    turn1 = [1, 2, 3, 4]
    first = run(target, drafter, turn1, 4, **cfg)[-1]
    assert first.stats.n_prefill == len(turn1) - 1
    turn2 = turn1 + list(first.tokens) + [5, 6, 7]
    fed = []
    real = target.decode
    target.decode = lambda tokens, all_logits=False: (
        fed.append(list(tokens)) or real(tokens, all_logits)
    )
    second = run(target, drafter, turn2, 4, **cfg)[-1]
    # the cache held turn1 + reply minus its last token: that token and the new ones remain,
    # evaluated in one decode with the first round (the prompt's last token)
    assert second.stats.n_prefill == 3 and second.stats.n_prompt == len(turn2)
    assert fed[0] == turn2[len(turn1) + len(first.tokens) - 1 :]
    fresh = ordinary(FakeEngine(n_vocab=9, seed=0), turn2, max_tokens=12, params=GREEDY)
    assert second.tokens == fresh.tokens
    # without reuse (the default) the whole prompt is evaluated again
    again = run(target, drafter, turn2, 4, max_tokens=12, params=GREEDY)[-1]
    assert again.stats.n_prefill == len(turn2) - 1 and again.tokens == fresh.tokens


def test_host_time_is_the_round_outside_the_decodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake clock: every decode takes 20 ms (counted by the engine as evaluation), every
    warp 1 ms (host work), nothing else takes time. Host time is then exactly 1 ms per
    warp call: one per draft row (while drafting) and one per round for the target."""
    import time

    from specgen import drafters
    from specgen import stages as loop

    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    params = SamplingParams(temp=1.0, top_k=4, top_p=1.0, min_p=0.0)
    target = FakeEngine(n_vocab=9, seed=0)
    draft = FakeEngine(n_vocab=9, seed=0, noise=1.0)
    for engine in (target, draft):
        real = engine.decode

        def timed(tokens, all_logits=False, _real=real, _engine=engine):
            clock[0] += 0.02
            _engine.decode_s += 0.02
            return _real(tokens, all_logits)

        monkeypatch.setattr(engine, "decode", timed)
    calls = {"draft": 0, "target": 0}

    def counting(module, side):
        real = module.warp_rows

        def warp(logits, p):
            clock[0] += 0.001
            calls[side] += 1
            return real(logits, p)

        monkeypatch.setattr(module, "warp_rows", warp)

    counting(drafters, "draft")
    counting(loop, "target")
    events = run(target, ModelDrafter(draft, params, 9), [1, 2], 3, max_tokens=20, params=params)
    steps = [e for e in events if isinstance(e, Step)]
    s = events[-1].stats
    assert s.host_s == pytest.approx(0.001 * (calls["draft"] + calls["target"]), abs=1e-9)
    assert s.draft_host_s == pytest.approx(0.001 * calls["draft"], abs=1e-9)
    assert calls["target"] == len(steps) == s.target_passes
    assert s.n_rows == sum(st.n_rows for st in steps) == sum(st.k + 1 for st in steps)
    assert s.host_s_per_row == pytest.approx(0.001 * len(steps) / s.n_rows)
    assert sum(st.host_s for st in steps) == pytest.approx(s.host_s)
    for st in steps:  # the rest of each round is the decodes
        assert st.round_s - st.host_s == pytest.approx(0.02 * (1 + max(st.k, 0)), abs=1e-9)


def test_an_end_inside_a_block_flushes_held_text_scores_only_tokens_and_commits_no_more():
    """Greedy from [1, 2] is "c h i c b g..."; with "g" (token 6) the end of generation and
    a stop string "b!" the "b" is held, then released by the end, which comes inside a
    K = 8 block of a draft that goes on past it. The end's span carries the "b" but is no
    token: no log-probability of its own; nothing after the end is committed."""
    from specgen.generate import OneSlot

    target = FakeEngine(n_vocab=9, seed=0, eos=6)
    drafter = ModelDrafter(FakeEngine(n_vocab=9, seed=0), GREEDY, 9)
    config = GenerateConfig(max_tokens=12, params=GREEDY, stop=("b!",), logprobs=2)
    slot = OneSlot(target, drafter, [1, 2], config, FixedK(8))
    events = list(slot.events())
    done = events[-1]
    assert (done.text, done.tokens, done.finish_reason) == ("chicb", (2, 7, 8, 2, 1), "eos")
    spans = [sp for e in events if isinstance(e, Step) for sp in e.spans]
    assert "".join(sp.text for sp in spans) == done.text
    assert [sp.token for sp in spans if sp.logprob is not None] == list(done.tokens)
    assert max(e.k for e in events if isinstance(e, Step)) == 8  # the end was in a block
    assert slot.seq.committed == [1, 2, 2, 7, 8, 2, 1, 6]


def test_a_slower_draft_is_timed_before_the_second_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """The start-up times the draft's decodes after the first round (as it times the
    ordinary pass), so the controller knows a draft slower than its target before its
    first choice and drafts nothing; the output is ordinary decoding's. A fake clock:
    10 ms per target decode, 25 ms per draft decode."""
    import time

    from specgen.generate import OneSlot

    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    target = FakeEngine(n_vocab=9, seed=0)
    draft = FakeEngine(n_vocab=9, seed=0)  # the same model: it would accept everything

    def slowed(engine: FakeEngine, seconds: float) -> None:
        real = engine.decode

        def decode(tokens: list[int], all_logits: bool = False) -> np.ndarray:
            clock[0] += seconds
            return real(tokens, all_logits)

        monkeypatch.setattr(engine, "decode", decode)

    slowed(target, 0.01)
    slowed(draft, 0.025)
    config = GenerateConfig(max_tokens=40, params=GREEDY, measure_ordinary=3, ignore_eos=True)
    run = OneSlot(target, ModelDrafter(draft, GREEDY, 9), [1, 2], config, AutoK(8))
    events = list(run.events())
    summary = run.summary()
    assert summary is not None
    assert summary["draft_line_s"] == [0.0, pytest.approx(0.025)]  # one slot: one row
    assert events[-1].stats.k_history == [0] * 40
    # a reason for every round, the first (ordinary, on the prefill) included (`--json`)
    assert summary["reasons"]["first"] == 1
    assert sum(summary["reasons"].values()) == len(summary["k_history"]) == 40
    # power: the same draft at 2 ms a decode speculates
    fast = FakeEngine(n_vocab=9, seed=0)
    slowed(fast, 0.002)
    again = list(generate(FakeEngine(n_vocab=9, seed=0), ModelDrafter(fast, GREEDY, 9),
                          [1, 2], config, AutoK(8)))  # fmt: skip
    assert any(k > 0 for k in again[-1].stats.k_history)
    assert (
        events[-1].tokens
        == ordinary(
            FakeEngine(n_vocab=9, seed=0), [1, 2], max_tokens=40, params=GREEDY, ignore_eos=True
        ).tokens
    )


def test_a_pairs_later_generations_reuse_its_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loaded pair times its start-up once (`StartUp`): the first generation with the
    controller calibrates it and times the ordinary passes; a later one takes both (the
    same controller, the passes on its first Step) and times nothing; a fixed K's first
    generation leaves the controller for the first auto one to calibrate. Greedy, so the
    tokens stay the same whatever K was chosen."""
    from specgen.generate import OneSlot, StartUp
    from specgen.sched.scheduler import Scheduler

    calls: list[int] = []
    real = Scheduler.calibrate

    def counted(self: Scheduler, repeats: int = 3, quick: bool = False) -> list[float] | None:
        calls.extend([1] if self.controller is not None else [])  # else a no-op
        return real(self, repeats, quick)

    monkeypatch.setattr(Scheduler, "calibrate", counted)
    config = GenerateConfig(max_tokens=20, params=GREEDY, measure_ordinary=3, ignore_eos=True)

    def run(start_up: StartUp, policy: AutoK | FixedK) -> tuple[OneSlot, list]:
        draft = ModelDrafter(FakeEngine(n_vocab=9, seed=0), GREEDY, 9)
        one = OneSlot(FakeEngine(n_vocab=9, seed=0), draft, [1, 2], config, policy,
                      start_up=start_up)  # fmt: skip
        return one, list(one.events())

    kept = StartUp()
    first, a = run(kept, AutoK(8))
    assert len(calls) == 1 and len(kept.passes) == 3
    assert kept.controller is first.scheduler.controller is not None
    second, b = run(kept, AutoK(8))
    assert len(calls) == 1  # nothing timed again
    assert second.scheduler.controller is kept.controller
    timed = [e.timed_ordinary_s for e in b if isinstance(e, Step) and e.timed_ordinary_s]
    assert timed == [pytest.approx(float(np.median(kept.passes)))]
    assert a[-1].tokens == b[-1].tokens and b[-1].stats.ordinary_token_s is not None
    # a fixed K times the passes only; the first auto generation calibrates
    fixed = StartUp()
    run(fixed, FixedK(4))
    assert len(calls) == 1 and len(fixed.passes) == 3 and fixed.controller is None
    run(fixed, AutoK(8))
    assert len(calls) == 2 and fixed.controller is not None


def test_cancel_ends_the_generation_after_the_round_under_way() -> None:
    """`OneSlot.cancel` (what `Generation.cancel` calls from another thread) makes the
    next event the Done, finish "interrupted", with the tokens committed so far; before
    the first event, nothing is generated."""
    from specgen.generate import OneSlot

    config = GenerateConfig(max_tokens=40, params=GREEDY, ignore_eos=True)

    def one() -> OneSlot:
        draft = ModelDrafter(FakeEngine(n_vocab=9, seed=0), GREEDY, 9)
        return OneSlot(FakeEngine(n_vocab=9, seed=0), draft, [1, 2], config, FixedK(3))

    run = one()
    events = []
    for ev in run.events():
        events.append(ev)
        if sum(isinstance(e, Step) for e in events) == 2:
            run.cancel()
    done = events[-1]
    assert isinstance(done, Done) and done.finish_reason == "interrupted"
    assert [type(e) for e in events[:-1]] == [Prefilled, Step, Step]
    emitted = [sp.token for e in events if isinstance(e, Step) for sp in e.spans]
    assert list(done.tokens) == emitted and 0 < len(emitted) < 40
    early = one()
    early.cancel()
    first = list(early.events())
    assert len(first) == 1 and isinstance(first[0], Done) and first[0].tokens == ()


def test_a_ctrl_c_after_the_final_token_is_not_swallowed() -> None:
    """SIGINT landing after the round's last token already ended the generation (during
    the policy's bookkeeping): the Done keeps the round's own reason, and the interrupt
    still reaches the caller (it was lost 1 in 8 times in `verify`)."""

    class InterruptAtTheEnd(FakeEngine):
        fired = False

        def truncate(self, n: int) -> None:
            super().truncate(n)
            # -n 9 at K 2: 1 ordinary token, 3, 3, then the last round's 2: its rollback
            if n == 2 + 9 - 1 and not self.fired:
                self.fired = True
                raise KeyboardInterrupt

    target = InterruptAtTheEnd(n_vocab=9, seed=0)
    drafter = ModelDrafter(FakeEngine(n_vocab=9, seed=0), GREEDY, 9)
    config = GenerateConfig(max_tokens=9, params=GREEDY, ignore_eos=True)
    steps: list[Step] = []
    events = []
    with pytest.raises(KeyboardInterrupt):
        for ev in generate(target, drafter, [1, 2], config, FixedK(2)):
            events.append(ev)
            if isinstance(ev, Step):
                steps.append(ev)
    done = events[-1]
    assert isinstance(done, Done) and len(done.tokens) == 9
    assert done.finish_reason == "length"  # the emitter had already finished
    assert target.tokens == [1, 2, *done.tokens][:-1]  # the caches stayed consistent


def test_a_weak_draft_under_auto_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """The weak demo draft's case on a clock the test controls (the real-model test checks
    only what holds at any speed): a cheap draft that rarely agrees with its target. A
    fake clock: a target pass costs 10 ms + 1 ms per scored token, a draft pass 3 ms (a
    third of the target's layers); the draft is an unrelated model (greedy agreement near
    1 / n_vocab). The controller falls back to ordinary decoding and stays there but for
    rare probes, and the output is ordinary decoding's."""
    import time

    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    target = FakeEngine(n_vocab=9, seed=0)
    draft = FakeEngine(n_vocab=9, seed=5)

    def timed(engine: FakeEngine, fixed: float, per_token: float) -> None:
        real = engine.decode

        def decode(tokens: list[int], all_logits: bool = False) -> np.ndarray:
            clock[0] += fixed + per_token * len(tokens)
            return real(tokens, all_logits)

        monkeypatch.setattr(engine, "decode", decode)

    timed(target, 0.010, 0.001)
    timed(draft, 0.003, 0.0)
    config = GenerateConfig(max_tokens=120, params=GREEDY, measure_ordinary=3, ignore_eos=True)
    done = list(generate(target, ModelDrafter(draft, GREEDY, 9), [1, 2], config, AutoK(16)))[-1]
    base = ordinary(FakeEngine(n_vocab=9, seed=0), [1, 2], max_tokens=120, params=GREEDY,
                    ignore_eos=True)  # fmt: skip
    assert done.tokens == base.tokens
    assert done.stats.acceptance_rate < 0.2  # 0.08 with these seeds
    history = done.stats.k_history
    assert history.count(0) > 0.8 * len(history), history  # 107 of 120 with these seeds
    # power: the same rounds with a draft that agrees are not spent in fallback
    same = FakeEngine(n_vocab=9, seed=0)
    timed(same, 0.003, 0.0)
    good = list(generate(target, ModelDrafter(same, GREEDY, 9), [1, 2], config, AutoK(16)))[-1]
    # (the first round is ordinary whatever the policy: the first token's latency)
    assert good.tokens == base.tokens and 0 not in good.stats.k_history[1:]


@pytest.mark.parametrize("policy", ["fixed", "auto"])
def test_the_first_token_is_an_ordinary_pass_before_any_draft_decode(
    monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    """A single stream's first round is K = 0 whatever the policy, and rides on the
    prompt's batch: its token comes from the decode that evaluates the prompt, before the
    draft decodes anything (prefill or timed pass), as llama-server's first token does.
    The timed start-up runs before the second round, whose Step carries its medians, and
    the draft catches up on the committed tokens in the second round's first depth, the
    first the model drafts. A fake clock: 10 ms per target decode, 3 ms per draft
    decode, nothing else."""
    import time

    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    target = FakeEngine(n_vocab=9, seed=0)
    draft = FakeEngine(n_vocab=9, seed=0, noise=0.5)
    log: list[str] = []

    def logged(engine: FakeEngine, name: str, seconds: float) -> None:
        real = engine.decode

        def decode(tokens: list[int], all_logits: bool = False) -> np.ndarray:
            log.append(f"{name}:{len(tokens)}")
            clock[0] += seconds
            return real(tokens, all_logits)

        monkeypatch.setattr(engine, "decode", decode)

    logged(target, "target", 0.010)
    logged(draft, "draft", 0.003)
    prompt = [1, 2, 3, 4, 5]
    config = GenerateConfig(max_tokens=30, params=GREEDY, measure_ordinary=3, ignore_eos=True)
    k_policy = FixedK(4) if policy == "fixed" else AutoK(8)
    events = generate(target, ModelDrafter(draft, GREEDY, 9), prompt, config, k_policy)
    assert isinstance(next(events), Prefilled)
    assert log == ["target:5"] and draft.tokens == []  # the draft's prefill is deferred
    first = next(events)
    assert isinstance(first, Step) and first.k == 0 and len(first.spans) == 1
    assert first.timed_ordinary_s is None and first.timed_draft_s is None
    second = next(events)
    assert isinstance(second, Step)
    # before the second round: 3 timed target passes (for the controller also one of a
    # K = 4 block's five rows, and its draft decodes where the draft's empty cache
    # stands: 3 of one token, then one of a catch-up's 17), then the first block: its
    # first depth evaluates every committed token (the prompt and the first token) at once
    start = ["target:1"] * 3
    if policy == "auto":
        start += ["target:5"] + ["draft:1"] * 3 + ["draft:17"]
    n = 1 + len(start)
    assert log[1:n] == start
    assert log[n] == "draft:6"
    assert second.k > 0 and second.timed_ordinary_s == pytest.approx(0.010)
    assert second.timed_draft_s == (pytest.approx(0.003) if policy == "auto" else None)
    done = list(events)[-1]
    assert isinstance(done, Done)
    s = done.stats
    # TTFT: one decode, the prompt's with the first round; the timed passes count in
    # neither the prefill nor the decoding
    assert s.ttft_s == pytest.approx(0.010)
    assert s.prefill_s == pytest.approx(0.010)
    assert s.k_history[0] == 0 and all(k > 0 for k in s.k_history[1:-1])
    base = ordinary(FakeEngine(n_vocab=9, seed=0), prompt, max_tokens=30, params=GREEDY,
                    ignore_eos=True)  # fmt: skip
    assert done.tokens == base.tokens


def test_a_one_token_generation_never_touches_the_draft() -> None:
    """-n 1: the only round is the ordinary first one, which rides on the prompt's decode,
    so the deferred draft prefill and the timed passes never run."""
    target, draft = FakeEngine(n_vocab=9, seed=0), FakeEngine(n_vocab=9, seed=0)
    config = GenerateConfig(max_tokens=1, params=GREEDY, measure_ordinary=3)
    events = list(generate(target, ModelDrafter(draft, GREEDY, 9), [1, 2, 3], config, FixedK(4)))
    assert draft.n_decode_calls == 0 and target.n_decode_calls == 1
    assert [e.k for e in events if isinstance(e, Step)] == [0]
    assert target.tokens == [1, 2, 3] and draft.tokens == []  # committed minus last
