"""Logit bias and penalties (`specgen.constraints`) exact under speculation, on fakes with
closed-form logits.

The processing itself is checked against `reference_process`, a plain transcription of
llama.cpp's `llama_sampler_logit_bias_apply` then `llama_sampler_penalties_apply` (one
token at a time, float32). The laws are statistical: the joint law of the first four
emitted tokens (several rounds of K = 2, so tokens repeat inside a block and rounds
follow each other) against the product of the constrained target's conditionals, by
chi-square with fixed seeds, failing below ALPHA = 1e-4 (a correct loop fails spuriously
with probability 1e-4 per test; the seeds make every run identical). Each law check is
shown to reject a planted bug: penalties counted from the committed tokens only, and
penalties updated once per step (the history gains one token per round). A bias on p
only leaves the output law exact (q is still the law x was drawn from, only a worse
proposal): what it breaks is that q is the constrained draft's law, which the proposal
test checks, and a draft that draws from its raw row while reporting the processed q
breaks the output law.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from fakes import FakeBatchEngine, FakeEngine
from reference import probs
from support.laws import chi2_pvalue
from support.planted import CommittedOnly

from specgen import drafters, round
from specgen.constraints import BiasPenalties, Constraints, processor_for
from specgen.drafters import Drafting, ModelDrafter
from specgen.errors import ConfigError
from specgen.events import Done, Step
from specgen.generate import FixedK, GenerateConfig, generate
from specgen.sampling import Dists, SamplingParams, draw, warp_rows
from specgen.sched.jobs import Job
from specgen.sched.scheduler import Scheduler

ALPHA = 1e-4
V = 4
PROMPT = [1, 3, 1]
WHOLE = SamplingParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.0)
GREEDY = SamplingParams(temp=0.0)

#: strong settings, so a wrong history moves the law far
BIAS = Constraints(logit_bias=((0, 1.5), (2, -100.0)))
REPEAT = Constraints(repeat_penalty=2.5, repeat_last_n=3)
FREQ_PRESENCE = Constraints(frequency_penalty=1.2, presence_penalty=0.8, repeat_last_n=-1)
ALL = Constraints(
    logit_bias=((3, 1.0),), repeat_penalty=1.5, frequency_penalty=0.6, presence_penalty=0.4
)


def reference_process(z, history, c: Constraints):
    """llama.cpp's logit bias then penalties on one row, token by token (float32)."""
    z = np.array(z, dtype=np.float32)
    for t, b in c.logit_bias:
        z[t] += np.float32(b)
    if c.penalizes:
        window = list(history) if c.repeat_last_n < 0 else list(history)[-c.repeat_last_n :]
        for t, count in Counter(window).items():
            if z[t] <= 0:
                z[t] *= np.float32(c.repeat_penalty)
            else:
                z[t] /= np.float32(c.repeat_penalty)
            z[t] -= np.float32(count) * np.float32(c.frequency_penalty) + np.float32(
                c.presence_penalty
            )
    return z


# -- the processing itself -------------------------------------------------------------


@pytest.mark.parametrize("c", [BIAS, REPEAT, FREQ_PRESENCE, ALL])
def test_rows_and_row_follow_llama_cpp_position_by_position(c):
    rng = np.random.default_rng(0)
    n_vocab = 50
    proc = processor_for(c, n_vocab)
    assert proc is not None
    for _ in range(30):
        context = rng.integers(0, 8, size=int(rng.integers(1, 12))).tolist()
        block = rng.integers(0, 8, size=4).tolist()  # small ids: repeats inside the block
        raw = (rng.standard_normal((5, n_vocab)) * 3).astype(np.float32)
        before = raw.copy()
        out = proc.rows(raw, context, block)
        assert np.array_equal(raw, before)  # the raw rows are never written to
        for i in range(5):
            want = reference_process(raw[i], context + block[:i], c)
            np.testing.assert_array_equal(out[i], want)
            np.testing.assert_array_equal(proc.row(raw[i], context, block[:i]), want)
        # fewer rows than block + 1 (a round scored without its bonus row)
        np.testing.assert_array_equal(proc.rows(raw[:4], context, block), out[:4])


def test_nothing_set_is_no_processor_and_the_settings_are_validated():
    assert processor_for(Constraints(), 10) is None
    assert processor_for(Constraints(repeat_penalty=1.3, repeat_last_n=0), 10) is None
    assert Constraints(logit_bias={5: 1.0, 2: -2.0}).logit_bias == ((2, -2.0), (5, 1.0))
    assert Constraints(logit_bias=[(5, 1.0), (5, 2.0)]).logit_bias == ((5, 3.0),)
    assert hash(SamplingParams(constraints=ALL)) == hash(SamplingParams(constraints=ALL))
    for kwargs, flag in [
        ({"repeat_penalty": 0.0}, "--repeat-penalty"),
        ({"repeat_penalty": 1e-300}, "--repeat-penalty must be in \\[0.01, 100\\]"),
        ({"repeat_penalty": 1e308}, "--repeat-penalty"),
        ({"repeat_last_n": -2}, "--repeat-last-n"),
        ({"presence_penalty": 2.5}, "--presence-penalty"),
        ({"frequency_penalty": -3.0}, "--frequency-penalty"),
        ({"logit_bias": {1: 101.0}}, "--logit-bias"),
        ({"logit_bias": {-1: 1.0}}, "--logit-bias"),
    ]:
        with pytest.raises(ConfigError, match=flag):
            Constraints(**kwargs)
    with pytest.raises(ConfigError, match="vocabulary has 10 tokens"):
        processor_for(Constraints(logit_bias={10: 1.0}), 10)
    # past int64 (a request's JSON number): the same error, not numpy's OverflowError
    with pytest.raises(ConfigError, match=f"token {2**70} but the vocabulary has 10"):
        processor_for(Constraints(logit_bias={2**70: 1.0, 3: 1.0}), 10)
    assert Constraints(logit_bias={1: -np.inf}).logit_bias == ((1, -np.inf),)


# -- laws ------------------------------------------------------------------------------


def law_of_first(n, target, prompt, params):
    """{tokens: probability} of the first n tokens under the constrained target."""
    c = params.constraints
    law = {}
    for seq in itertools.product(range(V), repeat=n):
        ctx, pr = list(prompt), 1.0
        for x in seq:
            z = reference_process(target.logits_after(ctx), ctx, c)
            pr *= probs(z, params)[x]
            if pr == 0.0:
                break
            ctx.append(x)
        law[seq] = pr
    return law


# as many runs as the planted bugs below fail on (committed-only, once-per-step, q not the
# draw: p = 0, 2e-18 and 1e-38 at 400, measured with these seeds 2026-12-03; the check ran
# 1,500, then 600)
N_SAMPLES = 400
N_TOKENS = 4


#: both acceptance rules: token-wise, and block verification (the default when sampling)
RULES = ("token", "block")


def output_pvalue(params, k=2, n=N_SAMPLES, rule="token"):
    """Speculative runs (a noisy draft model, K = 2 from the first round on: a round emits
    up to 3 tokens, so the four tokens span two rounds or more) under the acceptance `rule`
    against the constrained target's law of four tokens. The first round speculates
    (`ordinary_first=False`), so that rounds commit several tokens between two calls as
    often as possible."""
    target = FakeEngine(n_vocab=V, seed=0, scale=1.0)
    draft = FakeEngine(n_vocab=V, seed=0, scale=1.0, noise=1.0)
    drafter = ModelDrafter(draft, params, V)
    counts: Counter = Counter()
    accepted = 0
    for s in range(n):
        config = GenerateConfig(
            max_tokens=N_TOKENS, params=params, ignore_eos=True, seed=s, verify_rule=rule
        )
        done = list(generate(target, drafter, PROMPT, config, FixedK(k), ordinary_first=False))[-1]
        counts[tuple(done.tokens)] += 1
        accepted += done.stats.n_accepted
    assert accepted > n / 2  # proposals were accepted, inside blocks
    return chi2_pvalue(counts, law_of_first(N_TOKENS, target, PROMPT, params))


SETTINGS = [
    SamplingParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.0, constraints=BIAS),
    SamplingParams(temp=0.8, top_k=3, top_p=1.0, min_p=0.0, constraints=REPEAT),
    SamplingParams(temp=1.2, top_k=0, top_p=0.9, min_p=0.0, constraints=FREQ_PRESENCE),
    SamplingParams(temp=0.7, top_k=3, top_p=0.95, min_p=0.1, constraints=ALL),
]


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("params", SETTINGS, ids=["bias", "repeat", "freq-presence", "all"])
def test_speculative_output_follows_the_constrained_targets_joint_law(params, rule):
    assert output_pvalue(params, rule=rule) > ALPHA


class OncePerStep(BiasPenalties):
    """Planted bug: the penalties' history gains one token per round (the last committed),
    however many the round committed."""

    def __init__(self, *args):
        super().__init__(*args)
        self.hist: list[int] | None = None
        self.seen = 0

    def _own(self, context):
        if self.hist is None:
            self.hist = list(context)
        elif len(context) > self.seen:
            self.hist.append(context[-1])
        self.seen = len(context)
        return self.hist

    def rows(self, logits, context, block):
        return super().rows(logits, self._own(context), block)

    def row(self, logits, context, block):
        return super().row(logits, self._own(context), block)


_feed = Drafting.feed


def draw_raw(self, row):
    """Planted bug: the draft draws from its raw row but reports the processed q."""
    d = self.drafter
    if d.processor is None:  # nothing to process: nothing differs
        return _feed(self, row)
    raw = d._align(row)
    q_i = warp_rows(d.processor.row(raw, self.context, self.tokens)[None, :], d.params)
    ids, probs_ = warp_rows(raw[None, :], d.params).row(0)
    self.pending = []
    self.tokens.append(draw(ids, probs_, self.rng))
    self.rows.append(q_i)
    if len(self.tokens) < self.k:
        self.pending = [self.tokens[-1]]


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("bug", ["committed-only", "once-per-step", "q-not-the-draw"])
def test_each_planted_bug_fails_the_joint_law(monkeypatch, bug, rule):
    params = SETTINGS[3] if bug != "q-not-the-draw" else SETTINGS[0]
    if bug == "q-not-the-draw":
        monkeypatch.setattr(Drafting, "feed", draw_raw)
    else:
        planted = CommittedOnly if bug == "committed-only" else OncePerStep
        for module in (round, drafters):
            monkeypatch.setattr(module, "processor_for", lambda c, v, p=planted: p(c, v))
    assert output_pvalue(params, n=N_SAMPLES, rule=rule) < ALPHA  # far below: 1e-76 or 0


def proposal_check(params, n=600):  # twice the 300 its planted bug fails on (p 0)
    """Blocks of three proposals against the constrained DRAFT's joint law: (p-value,
    whether every reported q row equals the constrained draft's row at its position)."""
    c = params.constraints
    draft = FakeEngine(n_vocab=V, seed=0, scale=1.0, noise=1.0)
    drafter = ModelDrafter(draft, params, V)
    counts: Counter = Counter()
    rng = np.random.default_rng(0)
    rows_match = True
    for _ in range(n):
        drafter.rollback(PROMPT)
        block = drafter.draft(PROMPT, 3, rng)
        x = block.tokens.tolist()
        counts[tuple(x)] += 1
        for i in range(3):
            ctx = PROMPT + x[:i]
            want = probs(reference_process(draft.logits_after(ctx), ctx, c), params)
            rows_match &= bool(np.allclose(block.q[i : i + 1].to_dense()[0], want, atol=1e-12))
    return chi2_pvalue(counts, law_of_first(3, draft, PROMPT, params)), rows_match


def test_the_draft_proposes_from_the_constrained_draft_law_and_reports_it(monkeypatch):
    params = replace(SETTINGS[3], constraints=replace(ALL, logit_bias=((2, -100.0),)))
    pvalue, rows_match = proposal_check(params)
    assert pvalue > ALPHA and rows_match
    # planted: bias (and penalties) on p only, the draft's rows left raw
    monkeypatch.setattr(drafters, "processor_for", lambda c, v: None)
    pvalue, rows_match = proposal_check(params, n=300)  # p-value 0 from 200 blocks on
    assert pvalue < ALPHA and not rows_match


@pytest.mark.parametrize("c", [BIAS, REPEAT, FREQ_PRESENCE, ALL])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_speculative_equals_ordinary_decoding_with_the_same_setting(c, k):
    params = replace(GREEDY, constraints=c)
    target = FakeEngine(n_vocab=9, seed=0)
    draft = FakeEngine(n_vocab=9, seed=0, noise=1.5)
    config = GenerateConfig(max_tokens=40, params=params)
    base = list(generate(target, None, [2, 2, 5], config))[-1]
    plain = list(generate(target, None, [2, 2, 5], GenerateConfig(max_tokens=40, params=GREEDY)))
    assert base.tokens != plain[-1].tokens  # the setting changes the text
    spec = list(generate(target, ModelDrafter(draft, params, 9), [2, 2, 5], config, FixedK(k)))
    assert spec[-1].tokens == base.tokens
    assert spec[-1].stats.n_accepted > 0


# -- the server's scheduler: slots with different settings in one batch -----------------

BATCH_SETTINGS = (WHOLE, SETTINGS[0], SETTINGS[1], SETTINGS[3])
BATCH_PROMPTS = ([1, 2], [3], [0, 3, 2], [2, 2])
# as many as the planted bugs fail on: at 250, committed-only and once-per-step p = 0 (a
# sequence of probability 0), q not the draw 9e-42 (measured with these seeds 2026-12-03;
# was 1,000, then 400)
N_PER_SETTING = 250


def batch_pvalues(n_per_setting=N_PER_SETTING):
    """`n_per_setting` requests per setting interleaved, so every batch mixes settings and
    seeds; the four tokens (an ordinary first step, then x_1, x_2 of a block of K = 2 and
    what follows: a step after a block that committed several tokens, where penalties
    updated once per step go wrong) of each setting against its constrained law."""
    target = FakeBatchEngine(4, 64, n_vocab=V, seed=0)
    draft = FakeBatchEngine(4, 64, n_vocab=V, seed=0, noise=1.0)
    sched = Scheduler(
        target, ModelDrafter(draft, GREEDY, V), n_parallel=4, queue_max=10_000, draft_max=3
    )
    sinks = []
    for i in range(n_per_setting * len(BATCH_SETTINGS)):
        s = i % len(BATCH_SETTINGS)
        rule = RULES[i // len(BATCH_SETTINGS) % 2]  # both rules in every setting and batch
        config = GenerateConfig(
            4, BATCH_SETTINGS[s], ignore_eos=True, seed=20_000 + i, verify_rule=rule
        )
        events: list = []
        sched.submit(Job("job", list(BATCH_PROMPTS[s]), config), events.append)
        sinks.append((s, events))
    sched.run_until_idle()
    assert max(len(b) for b in target.batches) == 4
    counts: list[Counter] = [Counter() for _ in BATCH_SETTINGS]
    for s, events in sinks:
        done = events[-1]
        assert isinstance(done, Done) and len(done.tokens) == 4
        assert any(e.k == 2 for e in events if isinstance(e, Step))
        counts[s][tuple(done.tokens)] += 1
    return [
        chi2_pvalue(counts[s], law_of_first(4, target.model, BATCH_PROMPTS[s], params))
        for s, params in enumerate(BATCH_SETTINGS)
    ]


def test_every_setting_in_a_mixed_batch_follows_its_constrained_law():
    assert min(batch_pvalues()) > ALPHA


# the planted q-not-the-draw reports q(x) = 0 for tokens it drew: p/q divides by 0
@pytest.mark.filterwarnings("ignore:.*encountered in divide:RuntimeWarning")
@pytest.mark.parametrize("bug", ["committed-only", "once-per-step", "q-not-the-draw"])
def test_each_planted_bug_fails_the_batched_check(monkeypatch, bug):
    """The mixed-batch check has power against each kind: penalties counted from the
    committed tokens only, penalties updated once per step, a draft drawing from its raw
    row while reporting the processed q (bias and penalties on p's side only). On 150
    requests per setting: p = 0, 0 and 6e-13 (measured with these seeds 2026-12-03)."""
    if bug == "q-not-the-draw":
        monkeypatch.setattr(Drafting, "feed", draw_raw)
    else:
        planted = CommittedOnly if bug == "committed-only" else OncePerStep
        for module in (round, drafters):
            monkeypatch.setattr(module, "processor_for", lambda c, v, p=planted: p(c, v))
    assert min(batch_pvalues(150)) < ALPHA


def test_dists_unchanged_without_constraints():
    """No constraint: the target's rows are used as they are (no copy)."""
    logits = np.random.default_rng(0).standard_normal((3, V)).astype(np.float32)
    from specgen.stages import target_distributions

    v = target_distributions(logits, GREEDY)
    assert v.rows is logits
    w = target_distributions(logits, WHOLE)
    assert isinstance(w.p, Dists) and w.rows is logits


def test_hybrid_blocks_process_each_model_row_after_the_lookup_tokens_before_it():
    """Prompt lookup's tokens are one-hot (nothing to process); each model row after them
    is processed with the history context + every earlier proposal, lookup ones included."""
    from specgen.hybrid import HybridDrafter

    params = replace(SETTINGS[3], top_k=0)
    c = params.constraints
    draft = FakeEngine(n_vocab=V, seed=0, scale=1.0, noise=1.0)
    hybrid = HybridDrafter(ModelDrafter(draft, params, V), min_match=1)
    rng = np.random.default_rng(3)
    mixed = 0
    for _ in range(40):
        context = rng.integers(0, V, size=int(rng.integers(4, 12))).tolist()
        hybrid.prefill(context)
        block = hybrid.draft(context, 5, rng)
        x = block.tokens.tolist()
        sources = [block.source(i) for i in range(len(x))]
        mixed += "lookup" in sources and "draft" in sources
        for i, src in enumerate(sources):
            q = block.q[i : i + 1].to_dense()[0]
            if src == "lookup":
                assert q[x[i]] == 1.0
            else:
                h = context + x[:i]
                np.testing.assert_allclose(
                    q, probs(reference_process(draft.logits_after(h), h, c), params), atol=1e-12
                )
        hybrid.rollback(context)
    assert mixed > 0  # blocks where lookup and the model both proposed


def test_flags_parse_as_llama_cpp_writes_them_and_bench_url_refuses_them():
    from typer.testing import CliRunner

    from specgen.cli.app import app
    from specgen.flags import SamplingFlags
    from specgen.logitbias import parse_logit_bias

    assert parse_logit_bias(["15043+1", "15043-inf", "7-0.5"]) == (
        (15043, 1.0),
        (15043, -np.inf),
        (7, -0.5),
    )
    assert parse_logit_bias({"7042": -100}) == ((7042, -100.0),)
    for bad in (["15043"], ["+1"], ["15043*2"], ["15043+x"], [(True, 1.0)]):
        with pytest.raises(ConfigError, match="--logit-bias"):
            parse_logit_bias(bad)
    flags = SamplingFlags(logit_bias=["5+2", "5+1"], repeat_penalty=1.1, repeat_last_n=-1)
    assert flags.params().constraints == Constraints(((5, 3.0),), 1.1, -1)
    res = CliRunner().invoke(app, ["bench", "--url", "http://127.0.0.1:9", "-l", "5+1"])
    assert res.exit_code == 1 and "--logit-bias is not sent by bench --url" in str(res.exception)
    res = CliRunner().invoke(app, ["bench", "--url", "http://127.0.0.1:9", "-j", "{}"])
    said = str(res.exception)
    assert res.exit_code == 1 and "--json-schema is not sent by bench --url" in said
    assert "--prompts file their own json_schema" in said and "on the servers" not in said
