"""Hybrid drafting (prompt lookup, then the draft model): the block's makeup and q rows
exactly, the record, and the whole loop's law (chi-square, fixed seed, p > 1e-4, the
test_loop harness) with mixed one-hot and model rows under both acceptance rules."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from fakes import FakeEngine
from reference import probs
from scipy import stats
from support.planted import on_block

from specgen.drafters import ModelDrafter
from specgen.engine import Block
from specgen.events import Done
from specgen.generate import FixedK, GenerateConfig, generate
from specgen.hybrid import HybridDrafter, LookupRecord, Rate
from specgen.ngram import NgramDrafter
from specgen.sampling import Dists, SamplingParams, warp_rows

GREEDY = SamplingParams(temp=0.0)
SAMPLED = SamplingParams(temp=0.9, top_k=4, top_p=0.95, min_p=0.0)
DENSE = SamplingParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.0)
V = 6


def hybrid(params, noise=1.0, seed=0):
    draft = FakeEngine(n_vocab=V, seed=seed, scale=1.0, noise=noise, n_ctx=4096)
    return HybridDrafter(ModelDrafter(draft, params, V))


def test_lookup_first_then_the_model_where_the_copy_runs_out():
    d = hybrid(SAMPLED)
    context = [1, 2, 3, 4, 1, 2]  # "1 2" matched at 0: the copy is 3, 4, 1, 2
    d.prefill(context)
    block = d.draft(context, 6, np.random.default_rng(0))
    assert block.tokens[:4].tolist() == [3, 4, 1, 2]
    assert block.sources == ("lookup",) * 4 + ("draft",) * 2
    assert block.q.at(block.tokens)[:4].tolist() == [1.0] * 4  # one-hot rows
    # the model's rows are its warped rows after the context and the lookup tokens
    ctx = context + block.tokens[:4].tolist()
    for i in (4, 5):
        want = warp_rows(d.model.engine.logits_after(ctx)[None, :], SAMPLED)
        np.testing.assert_allclose(block.q[i : i + 1].to_dense(), want.to_dense())
        ctx.append(int(block.tokens[i]))


# every (0, x) pair of 1..5 occurs earlier, the suffix (5, 0) does not: the block starts
# with the model, and whichever x_1 in 1..5 it draws starts a copy of "0 x_1 0 ..."
STARTS_A_COPY = [0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0]


def test_the_model_starts_a_copy_and_the_lookup_finishes_the_block():
    d = hybrid(SAMPLED)
    context = STARTS_A_COPY
    d.prefill(context)
    for seed in range(40):
        block = d.draft(context, 5, np.random.default_rng(seed))
        toks = block.tokens.tolist()
        if toks[0] == 0:
            continue  # "0 0" occurs nowhere: the model goes on
        j = context.index(toks[0]) - 1  # where "0 x_1" occurs
        assert toks[1:] == context[j + 2 : j + 6][:4]
        assert block.sources == ("draft",) + ("lookup",) * (len(toks) - 1)
        assert block.q.at(block.tokens)[1:].tolist() == [1.0] * (len(toks) - 1)
        want = warp_rows(d.model.engine.logits_after(context)[None, :], SAMPLED)
        np.testing.assert_allclose(block.q[:1].to_dense(), want.to_dense())
        d.rollback(context)
        break
    else:
        raise AssertionError("the model never drew a token in 1..5")


def test_the_record_scores_a_lookup_after_model_tokens_where_the_round_reached_it():
    d = hybrid(GREEDY, noise=0.0)  # the draft is the target: deterministic
    context = STARTS_A_COPY
    d.prefill(context)
    block = d.draft(context, 4, np.random.default_rng(0))
    x1, tail = int(block.tokens[0]), block.tokens[1:].tolist()
    assert block.sources == ("draft",) + ("lookup",) * 3 and x1 != 0
    d.record.lookup.clear()
    d.rollback(context + [x1, tail[0], 9])  # the tail's second token was rejected
    assert d.record.lookup[2].accepted == pytest.approx(1.0)
    assert d.record.lookup[2].tested == pytest.approx(2.0)
    d.draft(context, 4, np.random.default_rng(0))
    d.record.lookup.clear()
    d.rollback(context + [9])  # x_1 rejected: the tail was never reached, nothing tested
    assert 2 not in d.record.lookup


def test_dense_model_rows_make_the_lookup_rows_dense():
    d = hybrid(DENSE)
    context = [1, 2, 3, 1, 2]
    d.prefill(context)
    block = d.draft(context, 5, np.random.default_rng(0))
    assert block.q.dense and block.sources == ("lookup",) * 3 + ("draft",) * 2
    np.testing.assert_allclose(block.q.to_dense()[:3], np.eye(V)[[3, 1, 2]])


def test_short_or_untrusted_matches_leave_the_block_to_the_model():
    d = hybrid(SAMPLED)
    context = [5, 1, 2, 3, 1]  # only a 1-token match: below min_match
    d.prefill(context)
    assert d.draft(context, 4, np.random.default_rng(0)).sources == ("draft",) * 4
    d.record.lookup[2] = Rate(accepted=0.0, tested=20.0)  # lookups after 2-grams failed
    context = [1, 2, 3, 1, 2]
    assert d.draft(context, 4, np.random.default_rng(0)).sources == ("draft",) * 4


def test_record_scores_the_lookup_against_committed_text_even_when_unused():
    d = hybrid(SAMPLED)
    context = [1, 2, 3, 4, 1, 2]
    d.prefill(context)
    d.record.lookup[2] = Rate(accepted=0.0, tested=20.0)
    block = d.draft(context, 3, np.random.default_rng(0))
    assert "lookup" not in block.sources
    before = d.record.lookup[2].value
    d.rollback(context + [3, 4, 9])  # the lookup (3, 4, 1) would have matched twice
    rate = d.record.lookup[2]
    assert rate.accepted == pytest.approx(2.0) and rate.tested == pytest.approx(18 + 3)
    assert rate.value > before


def test_record_trusts_lookup_at_least_as_good_as_the_model():
    r = LookupRecord()
    assert r.trusts(3)  # equal priors: try it
    r.model.add(9, 10)
    r.lookup[3] = Rate()
    r.lookup[3].add(5, 10)
    assert not r.trusts(3)
    r.lookup[3].add(30, 30)
    assert r.trusts(3)
    # a model copying a passage is nearly always right, and so is the lookup: the free
    # one is used even though its record, with fewer tokens tested, is a little lower
    r = LookupRecord()
    for _ in range(20):
        r.model.add(8, 8)
        r.lookup.setdefault(4, Rate()).add(9, 10)
    assert r.lookup[4].value < r.model.value and r.trusts(4)


def test_record_tries_a_match_length_it_has_not_scored_yet():
    r = LookupRecord()
    for _ in range(5):
        r.model.add(16, 16)  # a model right for a few blocks: the prior alone is far below
    assert Rate().value < r.model.value - 0.15
    assert r.trusts(2)  # never scored: tried
    r.lookup[2] = Rate()
    r.lookup[2].add(0, 3)
    assert not r.trusts(2)  # scored, and poor


def run(target, drafter, prompt, k, **cfg):
    events = list(generate(target, drafter, prompt, GenerateConfig(**cfg), FixedK(k)))
    assert isinstance(events[-1], Done)
    return events[-1]


@pytest.mark.parametrize("k", [2, 5])
def test_greedy_hybrid_equals_ordinary(k):
    target = FakeEngine(n_vocab=V, seed=0, n_ctx=4096)
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    base = run(target, None, prompt, 0, max_tokens=60, params=GREEDY)
    done = run(target, hybrid(GREEDY, noise=1.5), prompt, k, max_tokens=60, params=GREEDY)
    assert done.tokens == base.tokens
    assert done.stats.n_drafted_by.get("lookup", 0) > 0


def speculating_from_the_first_round(target, drafter, prompt, config, policy):
    """The loop's events with a first round that may speculate (`generate`'s
    ordinary_first=False, as `specgen verify` runs it), so the prompt alone decides the
    first block."""
    return list(generate(target, drafter, prompt, config, policy, ordinary_first=False))


@pytest.mark.parametrize(
    ("params", "rule"),
    [(SAMPLED, "token"), (SAMPLED, "block"), (DENSE, "block")],
)
def test_hybrid_loop_samples_the_targets_joint_distribution(params, rule):
    """First three tokens after a prompt whose suffix repeats: the first round's block is
    one lookup token (the copy runs out after it) then two model tokens. The exact law
    is the product of the target's warped conditionals."""
    target = FakeEngine(n_vocab=V, seed=0, scale=1.0)
    prompt = [2, 1, 1, 1]  # "1 1" matched at 1: the copy is the last 1
    law = {}
    for seq in itertools.product(range(V), repeat=3):
        ctx, pr = list(prompt), 1.0
        for x in seq:
            pr *= probs(target.logits_after(ctx), params)[x]
            ctx.append(x)
        law[seq] = pr
    counts = dict.fromkeys(law, 0)
    drafter = hybrid(params)
    # 600 runs: its planted bug (a lookup row with the wrong q, below) fails at p = 0 in
    # float64 already at 500 (was 2,000, then 1,000)
    n, mixed = 600, 0
    cfg = {"max_tokens": 4, "params": params, "verify_rule": rule, "trace": True}
    for s in range(n):
        drafter.record = LookupRecord()  # a fresh record trusts the first match
        config = GenerateConfig(seed=s, **cfg)
        events = speculating_from_the_first_round(target, drafter, prompt, config, FixedK(3))
        done = events[-1]
        counts[tuple(done.tokens[:3])] += 1
        mixed += sum(
            set(e.trace.sources) == {"lookup", "draft"} for e in events if hasattr(e, "trace")
        )
    assert mixed >= n  # every run verified at least one mixed block
    keys = sorted(law)
    exp = np.array([law[k] for k in keys]) * n
    obs = np.array([counts[k] for k in keys], dtype=float)
    assert obs[exp == 0].sum() == 0
    big = exp >= 5
    small = (exp > 0) & ~big
    obs_p = np.append(obs[big], obs[small].sum()) if small.any() else obs[big]
    exp_p = np.append(exp[big], exp[small].sum()) if small.any() else exp[big]
    assert stats.chisquare(obs_p, exp_p).pvalue > 1e-4


def _joint_law(target, prompt, params, depth):
    law = {}
    for seq in itertools.product(range(V), repeat=depth):
        ctx, pr = list(prompt), 1.0
        for x in seq:
            pr *= probs(target.logits_after(ctx), params)[x]
            ctx.append(x)
        law[seq] = pr
    return law


def _chisquare_p(law, counts, n):
    keys = sorted(law)
    exp = np.array([law[k] for k in keys]) * n
    obs = np.array([counts.get(k, 0) for k in keys], dtype=float)
    if obs[exp == 0].sum():
        return 0.0
    big = exp >= 5
    small = (exp > 0) & ~big
    obs_p = np.append(obs[big], obs[small].sum()) if small.any() else obs[big]
    exp_p = np.append(exp[big], exp[small].sum()) if small.any() else exp[big]
    return float(stats.chisquare(obs_p, exp_p).pvalue)


def _sample_after_a_started_copy(drafter, params, rule, n=600):
    """(law, counts, blocks that started with the model and ended by lookup): the first
    three tokens after `STARTS_A_COPY` from the loop at K 4, seeds 0..n-1."""
    target = FakeEngine(n_vocab=V, seed=0, scale=1.0)
    prompt = STARTS_A_COPY
    counts: dict[tuple[int, ...], int] = {}
    started = 0
    cfg = {"max_tokens": 3, "params": params, "verify_rule": rule, "trace": True}
    for s in range(n):
        drafter.record = LookupRecord()  # a fresh record trusts the first match
        config = GenerateConfig(seed=s, **cfg)
        events = speculating_from_the_first_round(target, drafter, prompt, config, FixedK(4))
        key = tuple(events[-1].tokens[:3])
        counts[key] = counts.get(key, 0) + 1
        started += sum(
            e.trace.sources[:2] == ("draft", "lookup") for e in events if hasattr(e, "trace")
        )
    return _joint_law(target, prompt, params, 3), counts, started


@pytest.mark.parametrize(("params", "rule"), [(SAMPLED, "token"), (SAMPLED, "block")])
def test_lookup_after_model_tokens_keeps_the_targets_joint_distribution(params, rule):
    """Blocks of a model token then lookup tokens (`STARTS_A_COPY`): the first three
    tokens' law is the product of the target's warped conditionals (p > 1e-4)."""
    law, counts, started = _sample_after_a_started_copy(hybrid(params), params, rule)
    assert started >= 300  # most runs verified a model-then-lookup block
    # 600 runs: as many as its planted bug (below) fails on (was 2,000, then 1,000)
    assert _chisquare_p(law, counts, 600) > 1e-4


def test_a_lookup_after_model_tokens_with_the_wrong_q_is_detected():
    """The test above has power: the lookup tokens after a model token given the model's
    warped rows as q (not the law they were proposed from) fail it."""

    class Mislabeled(HybridDrafter):
        def begin(self, context, k, rng, room=None):
            return on_block(super().begin(context, k, rng, room), lambda b: self._bad(context, b))

        def _bad(self, context, block):
            if block.sources[:2] != ("draft", "lookup"):
                return block
            ctx, rows = list(context), [block.q[:1]]
            for i in range(1, len(block.tokens)):
                ctx.append(int(block.tokens[i - 1]))
                rows.append(warp_rows(self.model.engine.logits_after(ctx)[None, :], SAMPLED))
            return Block(block.tokens, Dists.concat(rows, V), block.sources)

    model = ModelDrafter(FakeEngine(n_vocab=V, seed=0, scale=1.0, noise=1.0), SAMPLED, V)
    # measured with these seeds 2026-12-03: p = 1e-9 at 600 runs (3e-126 at 1,000)
    law, counts, _ = _sample_after_a_started_copy(Mislabeled(model), SAMPLED, "token", n=600)
    assert _chisquare_p(law, counts, 600) < 1e-4


def test_a_lookup_row_with_the_wrong_q_is_detected():
    """The test above has power: a lookup token whose q row claims the model's row
    instead of one-hot (q not the law it was drawn from) fails it."""

    class Mislabeled(HybridDrafter):
        def begin(self, context, k, rng, room=None):
            return on_block(super().begin(context, k, rng, room), lambda b: self._bad(context, b))

        def _bad(self, context, block):
            if block.sources[:1] == ("lookup",):
                row = warp_rows(self.model.engine.logits_after(context)[None, :], SAMPLED)
                q = Dists.concat([row, block.q[1:]], V)
                block = Block(block.tokens, q, block.sources)
            return block

    target = FakeEngine(n_vocab=V, seed=0, scale=1.0)
    prompt = [2, 1, 1, 1]
    drafter = Mislabeled(
        ModelDrafter(FakeEngine(n_vocab=V, seed=0, scale=1.0, noise=1.0), SAMPLED, V)
    )
    law = {x: probs(target.logits_after(prompt), SAMPLED)[x] for x in range(V)}
    counts = np.zeros(V)
    n = 500  # p-value 0.0 in float64 at 500 runs (measured with these seeds; was 1,000)
    for s in range(n):
        drafter.record = LookupRecord()
        config = GenerateConfig(max_tokens=1 + 1, params=SAMPLED, seed=s)
        done = speculating_from_the_first_round(target, drafter, prompt, config, FixedK(3))[-1]
        counts[done.tokens[0]] += 1
    exp = np.array([law[x] for x in range(V)]) * n
    mask = exp > 0
    assert stats.chisquare(counts[mask], exp[mask]).pvalue < 1e-4


def test_spans_and_stats_say_which_source_proposed_each_token():
    target = FakeEngine(n_vocab=V, seed=0, n_ctx=4096)
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    events = list(
        generate(
            target,
            hybrid(GREEDY, noise=1.5),
            prompt,
            GenerateConfig(max_tokens=40, params=GREEDY, trace=True),
            FixedK(4),
        )
    )
    steps = [e for e in events if hasattr(e, "spans")]
    spans = [sp for st in steps for sp in st.spans]
    assert {sp.source for sp in spans} <= {"draft", "lookup", "target"}
    assert all(sp.from_draft == (sp.source != "target") for sp in spans)
    stats_ = events[-1].stats
    by_span = {src: sum(sp.source == src for sp in spans) for src in ("draft", "lookup")}
    assert stats_.n_accepted_by == {s: c for s, c in by_span.items() if c}
    assert sum(stats_.n_drafted_by.values()) == stats_.n_drafted
    assert all(st.trace.sources == tuple(st.trace.sources) for st in steps)
    assert stats_.to_dict()["n_accepted_by"] == stats_.n_accepted_by


# -- the flags: values, defaults and the one-line refusals ---------------------------------


def test_resolve_verify_and_lookup_defaults_and_refusals():
    from pathlib import Path

    from specgen.errors import ConfigError
    from specgen.flags import ModelFlags, SamplingFlags
    from specgen.session import resolve_lookup, resolve_verify

    assert resolve_verify(None, GREEDY) == "token"  # the rules coincide when greedy
    assert resolve_verify(None, SAMPLED) == "block"
    assert resolve_verify("token", SAMPLED) == "token"
    assert resolve_verify("block", GREEDY) == "block"
    assert SamplingFlags(temp=0.0).verify_rule == "token"
    assert SamplingFlags(temp=0.8).verify_rule == "block"
    draft = Path("small.gguf")
    assert resolve_lookup(None, draft) and not resolve_lookup("off", draft)
    assert resolve_lookup(None, "ngram") is False  # the default says nothing there
    for draft_name in ("ngram", "none"):
        with pytest.raises(ConfigError, match="--lookup needs a draft model"):
            ModelFlags(target="t.gguf", draft=draft_name, lookup="on")
    with pytest.raises(ConfigError, match="--verify must be"):
        SamplingFlags(verify="fast")
    with pytest.raises(ConfigError, match="--lookup must be"):
        ModelFlags(lookup="yes")


# a prompt with no n-gram of its own repeated, and a prediction holding its suffix "2 3":
# the prediction is the only thing prompt lookup can copy (5, 0, 4 after the match)
PREDICTED_PROMPT = [1, 2, 3]
PREDICTION = (2, 3, 5, 0, 4)


class _PredictedAsAPrior(NgramDrafter):
    """A planted bug: the prediction's tokens given a soft q (a prior spread over the
    vocabulary, as if the prediction were only likely), where they were proposed
    deterministically (one-hot)."""

    def draft(self, context, k, rng, room=None):
        b = super().draft(context, k, rng, room)
        soft = 0.5 * b.q.to_dense() + 0.5 / V
        return Block(b.tokens, Dists(None, soft, V), b.sources)


def _sample_with_a_prediction(drafter, rule, n=600):
    """(law, counts, runs whose first block was the prediction's copy): the first three
    tokens after `PREDICTED_PROMPT` from the loop at K 3 with `PREDICTION`, seeds 0..n-1."""
    target = FakeEngine(n_vocab=V, seed=0, scale=1.0)
    counts: dict[tuple[int, ...], int] = {}
    copied = 0
    # 4 tokens at most: room for K = 3 and its bonus token in the first round
    cfg = {"max_tokens": 4, "params": SAMPLED, "verify_rule": rule, "trace": True}
    for s in range(n):
        if isinstance(drafter, HybridDrafter):
            drafter.record = LookupRecord()  # a fresh record trusts the first match
        config = GenerateConfig(seed=s, prediction=PREDICTION, **cfg)
        events = speculating_from_the_first_round(
            target, drafter, list(PREDICTED_PROMPT), config, FixedK(3)
        )
        key = tuple(events[-1].tokens[:3])
        counts[key] = counts.get(key, 0) + 1
        first = next(e.trace for e in events if getattr(e, "trace", None) is not None)
        copied += first.drafted == PREDICTION[2:]
    return _joint_law(target, PREDICTED_PROMPT, SAMPLED, 3), counts, copied


@pytest.mark.parametrize(
    ("kind", "rule"), [("ngram", "token"), ("ngram", "block"), ("hybrid", "token")]
)
def test_a_predicted_output_is_drafted_and_keeps_the_targets_joint_distribution(kind, rule):
    """`GenerateConfig.prediction` (OpenAI's Predicted Outputs): the first block copies
    the prediction after the prompt's suffix in every run, and the first three tokens'
    law is still the product of the target's warped conditionals (p > 1e-4)."""
    drafter = NgramDrafter(V) if kind == "ngram" else hybrid(SAMPLED)
    law, counts, copied = _sample_with_a_prediction(drafter, rule)
    assert copied == 600
    assert _chisquare_p(law, counts, 600) > 1e-4


def test_a_prediction_given_a_soft_q_is_detected():
    """The test above has power: prediction tokens tested against a q they were not
    drawn from fail it (p = 3e-72 with these seeds, 2026-12-07)."""
    law, counts, copied = _sample_with_a_prediction(_PredictedAsAPrior(V), "token")
    assert copied == 600
    assert _chisquare_p(law, counts, 600) < 1e-4


def test_without_a_prediction_the_prompt_alone_is_matched():
    """The same prompt with no prediction (the next generation on the same drafter): no
    copy, so a drafter keeps no prediction from the generation before."""
    target = FakeEngine(n_vocab=V, seed=0, scale=1.0)
    drafter = NgramDrafter(V)
    for prediction in (PREDICTION, ()):
        config = GenerateConfig(max_tokens=3, params=SAMPLED, seed=0, prediction=prediction)
        done = list(generate(target, drafter, list(PREDICTED_PROMPT), config, FixedK(3)))[-1]
        assert isinstance(done, Done)
        assert set(done.stats.n_drafted_by) == ({"prediction"} if prediction else set())


def test_a_drafter_with_a_prediction_keeps_its_scores_out_of_the_pool():
    """The pool values other requests' first lookups: a request's matches in its own
    prediction score there only once the prediction is gone (the next generation)."""
    draft = FakeEngine(n_vocab=V, seed=0, scale=1.0, noise=1.0, n_ctx=4096)
    pool = LookupRecord()
    d = HybridDrafter(ModelDrafter(draft, SAMPLED, V), pool=pool)
    for prediction, scored in ((PREDICTION, False), ((), True)):
        context = list(PREDICTED_PROMPT) + [1, 2]  # "1 2" earlier too: a match either way
        d.prefill(context)
        d.index.predict(prediction)
        d.draft(context, 3, np.random.default_rng(0))
        d.rollback(context + [3, 5, 0])
        assert d.record.lookup and bool(pool.lookup) == scored
