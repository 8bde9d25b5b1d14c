"""vLLM's ``min_tokens`` (`specgen.constraints.MinTokens`, `Emitter`'s stop strings), on
fakes: the processing and the stop-string rule exactly, the law statistically.

The law: speculative runs on a fake whose end-of-generation token is likely at every
position (about one in four), four tokens at most, against the target's law with that
token held back at the first `min_tokens` positions (`law_with_end`), by chi-square with
fixed seeds, failing below ALPHA = 1e-4 (a correct loop fails spuriously with probability
1e-4 per check; the seeds make every run identical). Blocks of K = 2 from the first round
on straddle the boundary, so a mask decided per call instead of per row moves the law.
Each check is shown to reject three planted bugs: the mask one position too long, the
mask decided by a call's first row for all its rows, and the draft's rows masked but not
the target's.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from fakes import FakeBatchEngine, FakeEngine
from reference import probs
from support.laws import chi2_pvalue

from specgen import round
from specgen.constraints import Constraints, MinTokens, eog_ids
from specgen.drafters import ModelDrafter, attach_min_tokens
from specgen.emit import Emitter
from specgen.errors import ConfigError
from specgen.events import Done
from specgen.generate import FixedK, GenerateConfig, generate
from specgen.grammarspec import GrammarSpec
from specgen.sampling import SamplingParams
from specgen.sched.jobs import Job
from specgen.sched.scheduler import Scheduler

ALPHA = 1e-4
V, EOS = 4, 0
PROMPT = [1, 3, 1]
#: the end made likely (a bias, so the mask is chained with another processor), so that a
#: wrong mask at any position moves the law far
EOS_BIAS = 1.5
WHOLE = SamplingParams(
    temp=1.0, top_k=0, top_p=1.0, min_p=0.0,
    constraints=Constraints(logit_bias=((EOS, EOS_BIAS),)),
)  # fmt: skip
N_TOKENS = 4
#: runs per check: the planted bugs fail at p = 2e-69 (off-by-one), 8e-39 (whole-call) and
#: 0 (target-unmasked) with these seeds (measured 2026-12-06)
N_SAMPLES = 400


# -- the processing and the stop rule (exact) ------------------------------------------


def test_rows_hold_the_ids_back_at_the_first_min_tokens_positions_only():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((4, 6)).astype(np.float32)
    proc = MinTokens([5, 2, 5], n_prompt=3, min_tokens=3)
    # context of 4: row 0 scores generated position 1, so rows 0-1 (positions 1, 2) held
    out = proc.rows(logits, [9, 9, 9, 7], [1, 1, 1])
    assert np.isneginf(out[:2, [2, 5]]).all()
    np.testing.assert_array_equal(out[:2, [0, 1, 3, 4]], logits[:2, [0, 1, 3, 4]])
    np.testing.assert_array_equal(out[2:], logits[2:])
    assert not np.isneginf(logits).any()  # the raw rows are never written to
    # one row: position len(context) + len(block) - n_prompt
    row = logits[0]
    assert np.isneginf(proc.row(row, [9, 9, 9], [1, 1])[[2, 5]]).all()  # position 2
    assert proc.row(row, [9, 9, 9], [1, 1, 1]) is row  # position 3: past
    assert proc.rows(logits, [9, 9, 9, 7, 7, 7], []) is logits  # past: the rows themselves


def test_eog_ids_are_every_end_token_once_per_model():
    target = FakeEngine(n_vocab=V, eos=EOS)
    assert eog_ids(target) == (EOS,)
    target.eos = 2  # cached per model: not scanned again
    assert eog_ids(target) == (EOS,)
    assert eog_ids(FakeEngine(n_vocab=V)) == ()


PIECES = {1: b" is", 2: b" Lee", 3: b",", 4: b" and", 5: b" I", 6: b"'m", 7: b" a",
          8: b" student"}  # fmt: skip


def emit(tokens, **kw):
    e = Emitter(PIECES.__getitem__, lambda t: False, **kw)
    for t in tokens:
        e.push(t, False)
        if e.finish is not None:
            break
    return e.text, e.finish


def test_stop_strings_count_only_where_they_end_after_min_tokens():
    """vLLM's own case (tests/detokenizer/test_min_tokens.py): " is Lee, and I'm a student"
    with stop "e" ends at " is L" without min_tokens and at " is Lee, and I'm a stud" with
    min_tokens 5."""
    toks = [1, 2, 3, 4, 5, 6, 7, 8]
    assert emit(toks, stop=("e",)) == (" is L", "stop")
    assert emit(toks, stop=("e",), min_tokens=5) == (" is Lee, and I'm a stud", "stop")
    # a stop string begun inside the first min_tokens and ended after them counts
    assert emit(toks, stop=("I'm",), min_tokens=5) == (" is Lee, and ", "stop")
    # one that ended inside them does not, even when text after it is held
    assert emit(toks, stop=(",", ", and I'm x"), min_tokens=3) == (
        " is Lee, and I'm a student",
        None,
    )
    assert emit(toks, stop=(",",), min_tokens=2) == (" is Lee", "stop")


def test_settings_refuse_what_min_tokens_cannot_mean():
    GenerateConfig(max_tokens=4, min_tokens=4)
    with pytest.raises(ConfigError, match="min_tokens 5 is more than the 4 tokens"):
        GenerateConfig(max_tokens=4, min_tokens=5)
    with pytest.raises(ConfigError, match="min_tokens must be 0 or more"):
        GenerateConfig(min_tokens=-1)
    with pytest.raises(ConfigError, match="min_tokens cannot be used with a grammar"):
        GenerateConfig(min_tokens=2, grammar=GrammarSpec("regex", "a+"))


# -- the law (statistical) ---------------------------------------------------------------


def law_with_end(target, prompt, params, min_tokens, n=N_TOKENS):
    """{emitted tokens: probability} under the target with EOS held back at the first
    `min_tokens` positions: a run ends at EOS (not emitted) or after n tokens."""
    law: dict[tuple[int, ...], float] = {}

    def walk(seq: tuple[int, ...], pr: float) -> None:
        if len(seq) == n:
            law[seq] = law.get(seq, 0.0) + pr
            return
        z = np.array(target.logits_after(list(prompt) + list(seq)), dtype=np.float32)
        z[EOS] = -np.inf if len(seq) < min_tokens else z[EOS] + np.float32(EOS_BIAS)
        p = probs(z, params)
        if p[EOS] > 0:
            law[seq] = law.get(seq, 0.0) + pr * p[EOS]
        for x in range(V):
            if x != EOS and p[x] > 0:
                walk((*seq, x), pr * p[x])

    walk((), 1.0)
    return law


#: both acceptance rules: token-wise, and block verification (the default when sampling)
RULES = ("token", "block")


def single_pvalue(min_tokens, n=N_SAMPLES, rule="token"):
    target = FakeEngine(n_vocab=V, seed=0, scale=1.0, eos=EOS)
    draft = FakeEngine(n_vocab=V, seed=0, scale=1.0, noise=1.0, eos=EOS)
    drafter = ModelDrafter(draft, WHOLE, V)
    counts: Counter = Counter()
    accepted = 0
    for s in range(n):
        config = GenerateConfig(N_TOKENS, WHOLE, seed=s, min_tokens=min_tokens, verify_rule=rule)
        done = list(generate(target, drafter, PROMPT, config, FixedK(2), ordinary_first=False))[-1]
        counts[tuple(done.tokens)] += 1
        accepted += done.stats.n_accepted
    assert accepted > n / 2  # blocks were accepted, across the boundary
    return chi2_pvalue(counts, law_with_end(target, PROMPT, WHOLE, min_tokens))


def off_by_one(self, first, n):
    return max(0, min(n, self.min_tokens + 1 - first))


def whole_call(self, first, n):
    return n if first < self.min_tokens else 0


def target_unmasked(self, config, target, drafter, n_prompt):
    attach_min_tokens(drafter, None)
    if config.min_tokens > 0:
        ids = (*eog_ids(target), *config.stop_token_ids)
        attach_min_tokens(drafter, MinTokens(ids, n_prompt, config.min_tokens))


def plant(monkeypatch, bug):
    if bug == "target-unmasked":
        monkeypatch.setattr(round.Sequence, "_attach_min_tokens", target_unmasked)
    else:
        monkeypatch.setattr(MinTokens, "_held", off_by_one if bug == "off-by-one" else whole_call)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("min_tokens", [0, 2, 3])
def test_speculative_output_follows_the_targets_law_with_the_end_held_back(min_tokens, rule):
    assert single_pvalue(min_tokens, rule=rule) > ALPHA


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("bug", ["off-by-one", "whole-call", "target-unmasked"])
def test_each_planted_bug_fails_the_law(monkeypatch, bug, rule):
    plant(monkeypatch, bug)
    assert single_pvalue(2, rule=rule) < ALPHA


#: a batch mixes (prompt, min_tokens) settings, each its own law
BATCH = (([1, 3, 1], 2), ([2], 0), ([0, 3], 3), ([3, 3], 1))
#: requests per setting: the planted bugs fail at p = 7e-89 (off-by-one), 5e-16
#: (whole-call) and 0 (target-unmasked) with these seeds (measured 2026-12-06)
N_PER_SETTING = 200


def batch_pvalues(n_per_setting=N_PER_SETTING):
    """`n_per_setting` requests per setting interleaved on the server's scheduler (four
    slots, K = 3 at most), every batch mixing settings and seeds."""
    target = FakeBatchEngine(4, 64, n_vocab=V, seed=0, scale=1.0, eos=EOS)
    draft = FakeBatchEngine(4, 64, n_vocab=V, seed=0, scale=1.0, noise=1.0, eos=EOS)
    sched = Scheduler(
        target, ModelDrafter(draft, WHOLE, V), n_parallel=4, queue_max=10_000, draft_max=3
    )
    sinks = []
    for i in range(n_per_setting * len(BATCH)):
        s = i % len(BATCH)
        prompt, m = BATCH[s]
        rule = RULES[i // len(BATCH) % 2]  # both rules in every setting and batch
        config = GenerateConfig(N_TOKENS, WHOLE, seed=30_000 + i, min_tokens=m, verify_rule=rule)
        events: list = []
        sched.submit(Job("job", list(prompt), config), events.append)
        sinks.append((s, events))
    sched.run_until_idle()
    assert max(len(b) for b in target.batches) == 4
    counts: list[Counter] = [Counter() for _ in BATCH]
    for s, events in sinks:
        done = events[-1]
        assert isinstance(done, Done)
        counts[s][tuple(done.tokens)] += 1
    return [
        chi2_pvalue(counts[s], law_with_end(target.model, prompt, WHOLE, m))
        for s, (prompt, m) in enumerate(BATCH)
    ]


def test_every_request_in_a_mixed_batch_follows_its_own_law():
    assert min(batch_pvalues()) > ALPHA


@pytest.mark.parametrize("bug", ["off-by-one", "whole-call", "target-unmasked"])
def test_each_planted_bug_fails_the_batched_law(monkeypatch, bug):
    plant(monkeypatch, bug)
    assert min(batch_pvalues()) < ALPHA


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_speculative_equals_ordinary_decoding_with_min_tokens(k):
    """Greedy with the end held back: speculation gives ordinary decoding's tokens, and
    the setting changes them (the target's argmax is its end token early on)."""
    target = FakeEngine(n_vocab=9, seed=3, eos=EOS)
    draft = FakeEngine(n_vocab=9, seed=3, noise=1.5, eos=EOS)
    greedy = SamplingParams(temp=0.0)
    prompt = next(
        [a, b] for a in range(1, 9) for b in range(1, 9)
        if int(np.argmax(target.logits_after([a, b]))) == EOS
    )  # fmt: skip
    config = GenerateConfig(max_tokens=30, params=greedy, min_tokens=12)
    base = list(generate(target, None, prompt, config))[-1]
    plain = list(generate(target, None, prompt, GenerateConfig(30, greedy)))[-1]
    assert plain.tokens == () and plain.finish_reason == "eos"
    assert len(base.tokens) >= 12 and EOS not in base.tokens[:12]
    spec = list(generate(target, ModelDrafter(draft, greedy, 9), prompt, config, FixedK(k)))
    assert spec[-1].tokens == base.tokens
    assert spec[-1].stats.n_accepted > 0


def test_the_python_api_takes_min_tokens_for_the_call():
    """`Pair.generate(min_tokens=...)` holds the end back as the server's field does, and
    refuses what the setting cannot mean, naming it."""
    from specgen import Pair

    target = FakeEngine(n_vocab=9, seed=3, eos=EOS)
    draft = FakeEngine(n_vocab=9, seed=3, noise=1.5, eos=EOS)
    prompt = next(
        [a, b] for a in range(1, 9) for b in range(1, 9)
        if int(np.argmax(target.logits_after([a, b]))) == EOS
    )  # fmt: skip
    pair = Pair.of(target, ModelDrafter(draft, SamplingParams(temp=0.0), 9))
    args = {"temperature": 0, "max_tokens": 30, "draft_max": 3}
    assert pair.generate(prompt, **args).tokens == ()  # the target's argmax is its end
    held = pair.generate(prompt, min_tokens=12, **args)
    assert len(held.tokens) >= 12 and EOS not in held.tokens[:12]
    with pytest.raises(ConfigError, match="^min_tokens 31 is more than the 30 tokens"):
        pair.generate(prompt, min_tokens=31, **args)
    with pytest.raises(ConfigError, match="^min_tokens must be an integer"):
        pair.generate(prompt, min_tokens="many", **args)
