"""A grammar exact under speculation (`specgen.grammar` on the per-request logits seam), on
a fake model with closed-form logits over a small byte-complete vocabulary (`TextEngine`).

The constrained target's law: at each position the grammar's mask (every token it does
not allow at -inf), then the warpers (llama.cpp's grammar-first order). The joint law of
the first tokens of speculative runs is checked against the product of those
conditionals by chi-square with fixed seeds, failing below ALPHA = 1e-4, alone and in the
scheduler's batches mixing grammars, settings and an unconstrained request. Each law
check is shown to reject a planted bug: q recorded unmasked while the draft drew from the
masked row, the matcher not rolled back after a rejection, the mask applied after the
warpers. A mask on p only leaves the output law exact (q is still the law the draft drew
from): the proposal test catches it, by the draft's law and by its proposing tokens the
grammar forbids.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from fakes import FakeBatchEngine, TextEngine
from reference import probs
from support.laws import chi2_pvalue
from support.planted import q_unmasked

from specgen import drafters, round
from specgen.drafters import Drafting, ModelDrafter
from specgen.events import Done, Step
from specgen.generate import FixedK, GenerateConfig, generate
from specgen.grammar import Matcher, compile_grammar, tokenizer_for
from specgen.grammarspec import GrammarSpec
from specgen.sampling import SamplingParams, warp_rows
from specgen.sched.jobs import Job
from specgen.sched.scheduler import Scheduler

ALPHA = 1e-4
PROMPT = [7, 1, 7]
#: alternatives sharing prefixes ("a", "ab", "abc"), a bounded repetition, an enum
LARK = 'start: ("a" | "ab" | "abc") "x"{1,2} ("c" | "}" | "cx")'
SPEC = GrammarSpec("lark", LARK)
SETTINGS = [
    SamplingParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.0),
    SamplingParams(temp=0.8, top_k=2, top_p=1.0, min_p=0.0),
    SamplingParams(temp=1.3, top_k=0, top_p=0.9, min_p=0.05),
]
N_TOKENS = 4
# 1.5x the 200 runs on which each planted bug fails (p 0 or 3e-34), and as many as the
# lazy grammar's and the two spellings' planted bugs fail on (p 0 at 300, measured with
# these seeds 2026-12-03); was 1,000, then 500
N_SAMPLES = 300


def engines(noise: float = 1.0) -> tuple[TextEngine, TextEngine]:
    return TextEngine(seed=0, scale=1.0), TextEngine(seed=0, scale=1.0, noise=noise)


def matcher(spec: GrammarSpec = SPEC) -> Matcher:
    return compile_grammar(spec, tokenizer_for(TextEngine())).matcher()


#: the real methods, for the reference laws while a planted bug replaces them
REAL_SYNC, REAL_MASK = Matcher.sync, Matcher.mask


def law_of_first(n, model, prompt, params, spec=SPEC):
    """{tokens: probability} of the first n tokens (fewer when the grammar completes, or
    when it may end and the end-of-generation token 0 is drawn) under the constrained
    target: mask, then warp, position by position."""
    m = matcher(spec)
    law: dict[tuple[int, ...], float] = {}

    def walk(out: list[int], pr: float) -> None:
        assert REAL_SYNC(m, out)
        if len(out) == n or m.stopped:
            law[tuple(out)] = law.get(tuple(out), 0.0) + pr
            return
        z = REAL_MASK(m, model.logits_after(prompt + out))
        p = probs(z, params)
        for x in np.flatnonzero(p > 0):
            if x == 0:  # the end of generation: not a token of the output
                law[tuple(out)] = law.get(tuple(out), 0.0) + pr * float(p[x])
            else:
                walk([*out, int(x)], pr * float(p[x]))

    walk([], 1.0)
    return law


#: both acceptance rules: token-wise, and block verification (the default when sampling)
RULES = ("token", "block")


def output_pvalue(params, k=2, n=N_SAMPLES, spec=SPEC, check_accepted=True, rule="token"):
    """Speculative runs (a noisy draft, K = 2, acceptance `rule`) against the constrained
    target's law; with
    `check_accepted`, the runs must also have accepted proposals (planted bugs may make
    every proposal fail: their law is checked all the same)."""
    target, draft = engines()
    drafter = ModelDrafter(draft, params, target.n_vocab)
    counts: Counter = Counter()
    accepted = 0
    for s in range(n):
        config = GenerateConfig(
            max_tokens=N_TOKENS, params=params, seed=s, grammar=spec, verify_rule=rule
        )
        done = list(generate(target, drafter, PROMPT, config, FixedK(k)))[-1]
        counts[tuple(done.tokens)] += 1
        accepted += done.stats.n_accepted
    assert accepted > n / 2 or not check_accepted  # proposals were accepted, inside blocks
    return chi2_pvalue(counts, law_of_first(N_TOKENS, target, PROMPT, params, spec))


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("params", SETTINGS, ids=["whole", "top-k", "top-p-min-p"])
def test_speculative_output_follows_the_constrained_targets_joint_law(params, rule):
    assert output_pvalue(params, rule=rule) > ALPHA


def test_the_output_always_matches_the_grammar_and_stops_when_complete():
    target, draft = engines()
    params = SETTINGS[0]
    for s in range(40):
        config = GenerateConfig(max_tokens=30, params=params, seed=s, grammar=SPEC)
        done = list(generate(target, ModelDrafter(draft, params, 264), PROMPT, config, FixedK(3)))
        end = done[-1]
        # "stop": the grammar complete; "eos": it could go on and the model ended it
        assert isinstance(end, Done) and end.finish_reason in ("stop", "eos")
        m = matcher()
        assert m.sync(list(end.tokens)) and m.accepting
        assert m.stopped or end.finish_reason == "eos"


# -- planted bugs ------------------------------------------------------------------------


def no_rollback(self, generated):
    """Planted bug: the matcher only moves forward (never rolled back after a rejection)."""
    for t in generated[len(self.tokens) :]:
        if not self._consume(int(t)):
            return False
    return True


class MaskAfterWarp:
    """Planted bug: the warpers run on the raw rows, the mask after them (renormalised)."""

    def __init__(self, monkeypatch):
        self.masks: list[np.ndarray] = []
        real_mask, real_warp = Matcher.mask, warp_rows

        def mask(m, row):
            self.masks.append(np.isfinite(real_mask(m, row)))
            return np.asarray(row, dtype=np.float32).copy()

        def warp(logits, params):
            from specgen.sampling import Dists

            keep = np.stack(self.masks[-logits.shape[0] :])
            self.masks.clear()
            p = real_warp(logits, params).to_dense() * keep
            empty = p.sum(axis=1) == 0
            p[empty] = keep[empty]  # nothing left: uniform over what the grammar allows
            return Dists(None, p / p.sum(axis=1, keepdims=True), p.shape[1])

        monkeypatch.setattr(Matcher, "mask", mask)
        for module in ("specgen.stages", "specgen.drafters"):
            monkeypatch.setattr(f"{module}.warp_rows", warp)


# the planted q-unmasked can report q(x) = 0 for a token it drew: block's p/q divides by 0
@pytest.mark.filterwarnings("ignore:divide by zero encountered in divide:RuntimeWarning")
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("bug", ["q-unmasked", "no-rollback", "mask-after-warp"])
def test_each_planted_bug_fails_the_joint_law(monkeypatch, bug, rule):
    params = SETTINGS[1]
    if bug == "q-unmasked":
        monkeypatch.setattr(Drafting, "feed", q_unmasked)
    elif bug == "no-rollback":
        monkeypatch.setattr(Matcher, "sync", no_rollback)
    else:
        MaskAfterWarp(monkeypatch)
    # 200 runs suffice (measured with these seeds at 150: p-value 0, a sequence of
    # probability 0, for no-rollback and mask-after-warp; 3e-34 for q-unmasked)
    assert output_pvalue(params, n=200, check_accepted=False, rule=rule) < ALPHA


@pytest.mark.parametrize("planted", [False, True], ids=["walks", "walk-ignores-the-grammar"])
def test_rows_that_walk_for_their_top_k_keep_the_joint_law(monkeypatch, planted):
    """Every sampled row, the target's and the draft's, looks for its top-k allowed tokens
    by asking (`GrammarProcessor.top_k_rows` with `_walks` forced) wherever no mask is at
    hand; planted: the walk keeps the first k candidates, allowed or not."""
    from specgen import grammarrows
    from specgen.grammarrows import GrammarProcessor

    monkeypatch.setattr(GrammarProcessor, "_walks", lambda self: True)
    if planted:
        monkeypatch.setattr(grammarrows, "first_allowed", lambda ids, zs, k, a: list(ids[:k]))
    pvalue = output_pvalue(SETTINGS[1], n=200 if planted else N_SAMPLES, check_accepted=not planted)
    assert (pvalue < ALPHA) if planted else (pvalue > ALPHA)


# -- the draft's proposals -----------------------------------------------------------------


def proposal_check(params, n=600):  # twice the 300 its planted bug fails on
    """Blocks of three proposals against the constrained DRAFT's joint law: (p-value,
    whether every proposal was a token the grammar allows)."""
    from specgen.grammarrows import GrammarProcessor

    _, draft = engines()
    drafter = ModelDrafter(draft, params, draft.n_vocab)
    g = compile_grammar(SPEC, tokenizer_for(draft))
    drafters.attach_grammar(drafter, GrammarProcessor(g, len(PROMPT)))
    counts: Counter = Counter()
    rng = np.random.default_rng(0)
    allowed = True
    m = matcher()
    for _ in range(n):
        drafter.rollback(PROMPT)
        x = drafter.draft(PROMPT, 3, rng).tokens.tolist()
        counts[tuple(x)] += 1
        allowed &= m.sync(x)
    return chi2_pvalue(counts, law_of_first(3, draft, PROMPT, params)), allowed


def test_the_draft_proposes_from_the_masked_draft_law(monkeypatch):
    params = SETTINGS[0]
    pvalue, allowed = proposal_check(params)
    assert pvalue > ALPHA and allowed
    # planted: the mask on p only (the draft's rows left raw)
    monkeypatch.setattr(drafters, "attach_grammar", lambda d, g: None)
    pvalue, allowed = proposal_check(params, n=300)
    assert pvalue < ALPHA and not allowed


# -- greedy ------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_speculative_equals_ordinary_constrained_decoding(k):
    greedy = SamplingParams(temp=0.0)
    target, draft = engines(noise=1.5)
    config = GenerateConfig(max_tokens=20, params=greedy, grammar=SPEC)
    base = list(generate(target, None, PROMPT, config))[-1]
    spec = list(generate(target, ModelDrafter(draft, greedy, 264), PROMPT, config, FixedK(k)))
    assert spec[-1].tokens == base.tokens and spec[-1].finish_reason == "stop"
    assert matcher().sync(list(base.tokens))


@pytest.mark.parametrize("k", [0, 3])
def test_an_end_the_grammar_forces_is_its_stop_not_the_models_eos(k):
    """The empty text's grammar allows nothing but the end from its first position
    (llguidance does not report it stopped before a token): the end is the grammar's
    ("stop"), ordinary or speculative (the fast twin of `test_grammar_models`' test)."""
    greedy = SamplingParams(temp=0.0)
    target, draft = engines()
    drafter = ModelDrafter(draft, greedy, 264) if k else None
    config = GenerateConfig(max_tokens=8, params=greedy, grammar=GrammarSpec("gbnf", "root ::= "))
    done = list(generate(target, drafter, PROMPT, config, FixedK(k)))[-1]
    assert (done.text, done.tokens, done.finish_reason) == ("", (), "stop")


# -- forced tokens: the grammar as a drafter -----------------------------------------------


def test_forced_positions_join_the_block_with_a_one_hot_q_and_no_draft_row():
    # after "ab", "cde" is forced in bytes: one canonical token at a time, no draft row
    spec = GrammarSpec("lark", 'start: ("ab" | "a") "c" "x" "}" ("a" | "b")')
    target, draft = engines()
    greedy = SamplingParams(temp=0.0)
    drafter = ModelDrafter(draft, greedy, 264)
    config = GenerateConfig(max_tokens=20, params=greedy, grammar=spec)
    steps = list(generate(target, drafter, PROMPT, config, FixedK(6)))
    end = steps[-1]
    assert end.finish_reason == "stop"
    by = Counter()
    for s in steps:
        if isinstance(s, Step):
            for src, n in s.n_drafted_by.items():
                by[src] += n
    assert by["grammar"] >= 2
    base = list(generate(target, None, PROMPT, config))[-1]
    assert base.tokens == end.tokens


# -- the scheduler: slots with different grammars and settings in one batch ---------------

BATCH = [
    (SETTINGS[0], SPEC),
    (SETTINGS[1], GrammarSpec("lark", 'start: ("b" | "ab") ("x" | "c"){2}')),
    (SETTINGS[2], SPEC),
    (SamplingParams(temp=1.0, top_k=3, top_p=1.0, min_p=0.0), None),
]
BATCH_PROMPTS = ([7, 1], [1], [7, 7, 1], [2, 1])
N_PER_SETTING = 250  # the planted bug fails on 150 per setting (was 500)


def unconstrained_law(n, model, prompt, params):
    law: dict[tuple[int, ...], float] = {}

    def walk(out, pr):
        if len(out) == n:
            law[tuple(out)] = pr
            return
        p = probs(model.logits_after(prompt + out), params)
        for x in np.flatnonzero(p > 1e-12):
            walk([*out, int(x)], pr * float(p[x]))

    walk([], 1.0)
    return law


def batch_pvalues(n=N_PER_SETTING):
    t, d = engines()
    target, draft = FakeBatchEngine(4, 64, model=t), FakeBatchEngine(4, 64, model=d)
    sched = Scheduler(
        target, ModelDrafter(draft, SETTINGS[0], 264), n_parallel=4, queue_max=10_000,
        draft_max=2,
    )  # fmt: skip
    sinks = []
    for i in range(n * len(BATCH)):
        s = i % len(BATCH)
        params, spec = BATCH[s]
        rule = RULES[i // len(BATCH) % 2]  # both rules in every setting and batch
        config = GenerateConfig(
            3, params, ignore_eos=True, seed=30_000 + i, grammar=spec, verify_rule=rule
        )
        events: list = []
        sched.submit(Job("job", list(BATCH_PROMPTS[s]), config), events.append)
        sinks.append((s, events))
    sched.run_until_idle()
    counts: list[Counter] = [Counter() for _ in BATCH]
    for s, events in sinks:
        done = events[-1]
        # a failed job (a planted bug can leave a row with nothing allowed) is an outcome
        # the constrained target never has: its setting's p-value is then 0
        counts[s][tuple(done.tokens[:3]) if isinstance(done, Done) else ("failed",)] += 1
    out = []
    for s, (params, spec) in enumerate(BATCH):
        if spec is None:
            law = unconstrained_law(3, target.model, BATCH_PROMPTS[s], params)
        else:
            law = law_of_first(3, target.model, BATCH_PROMPTS[s], params, spec)
        out.append(chi2_pvalue(counts[s], law))
    return out


def test_every_slot_in_a_mixed_batch_follows_its_own_constrained_law():
    assert min(batch_pvalues()) > ALPHA


def test_no_rollback_fails_the_batched_check(monkeypatch):
    """150 requests per slot suffice: two of the four settings then emit sequences of
    probability 0 (p-value 0, measured with these seeds)."""
    monkeypatch.setattr(Matcher, "sync", no_rollback)
    assert min(batch_pvalues(150)) < ALPHA


def test_a_drafter_reused_without_a_grammar_keeps_none():
    target, draft = engines()
    drafter = ModelDrafter(draft, SETTINGS[0], 264)
    list(generate(target, drafter, PROMPT, GenerateConfig(4, SETTINGS[0], grammar=SPEC)))
    assert drafter.grammar is not None
    list(generate(target, drafter, PROMPT, GenerateConfig(4, SETTINGS[0])))
    assert drafter.grammar is None
    assert round is not None and replace is not None


# -- forced positions need no target row ---------------------------------------------------

#: "c", "x" and "}" forced one token at a time after the first choice (FORCED_SPEC), and
#: forced bytes the mask lets several tokens spell (TWO_WAYS: after "x" the byte "a" is
#: forced, but "a", "ab" and the byte token for "a" are all allowed)
FORCED_SPEC = GrammarSpec("lark", 'start: ("ab" | "a") "c" "x" "}" ("a" | "b")')
TWO_WAYS = GrammarSpec("lark", 'start: ("x" | "}") "a" /[bc]{1,2}/')


def forced_rows(contexts, prompt, spec):
    """The rows among `contexts` (what each scored the next token after) at positions where
    the grammar allows one token alone: rows the decode should not have computed."""
    m = matcher(spec)
    return [c for c in contexts if m.sync(list(c[len(prompt) :])) and m.single() is not None]


def spec_run(target, spec, params, k, seed=0, logprobs=None):
    draft = TextEngine(seed=0, scale=1.0, noise=1.0)
    drafter = ModelDrafter(draft, params, target.n_vocab) if k else None
    config = GenerateConfig(20, params, seed=seed, grammar=spec, logprobs=logprobs)
    return list(generate(target, drafter, PROMPT, config, FixedK(k)))


@pytest.mark.parametrize("params", [SamplingParams(temp=0.0), SETTINGS[1]], ids=["greedy", "temp"])
@pytest.mark.parametrize("k", [0, 6])
def test_a_position_the_grammar_forces_gets_no_logits_row(params, k):
    target = TextEngine(seed=0, scale=1.0)
    events = spec_run(target, FORCED_SPEC, params, k)
    assert events[-1].finish_reason == "stop"
    assert not forced_rows(target.row_contexts, PROMPT, FORCED_SPEC)
    if k:  # the grammar proposed the forced tokens, for free
        steps = [e for e in events if isinstance(e, Step)]
        assert sum(s.n_drafted_by.get("grammar", 0) for s in steps) >= 2
    # the same run with log-probabilities asked for computes every row: the same tokens
    # (the law does not depend on the skipped rows), and its forced rows on top
    every = TextEngine(seed=0, scale=1.0)
    with_rows = spec_run(every, FORCED_SPEC, params, k, logprobs=0)
    assert with_rows[-1].tokens == events[-1].tokens
    assert forced_rows(every.row_contexts, PROMPT, FORCED_SPEC)
    assert len(every.row_contexts) > len(target.row_contexts)


def test_a_batch_computes_no_row_where_the_grammar_forces():
    t, d = engines()
    target, draft = FakeBatchEngine(4, 64, model=t), FakeBatchEngine(4, 64, model=d)
    sched = Scheduler(
        target, ModelDrafter(draft, SETTINGS[0], 264), n_parallel=4, queue_max=16, draft_max=4
    )
    sinks: list[list] = []
    for i in range(8):
        params = [*SETTINGS, SamplingParams(temp=0.0)][i % 4]
        config = GenerateConfig(12, params, seed=i, grammar=FORCED_SPEC)
        sinks.append([])
        sched.submit(Job("job", list(PROMPT), config), sinks[-1].append)
    sched.run_until_idle()
    assert all(isinstance(events[-1], Done) for events in sinks)
    assert not forced_rows([c for _, c in target.row_contexts], PROMPT, FORCED_SPEC)
    assert any(n_rows < n for batch in target.batches for _, n, n_rows in batch)


def two_ways_single(m):
    """Planted bug: where bytes are forced but the mask allows several tokens, the first
    token of their canonical tokenization treated as the only one (its row skipped, p
    taken as one-hot on it)."""
    if m.n_allowed() == 1:
        return REAL_SINGLE(m)
    forced = m._m.compute_ff_bytes()
    return TextEngine().tokenize(forced)[0] if forced else None


REAL_SINGLE = Matcher.single


def test_forced_bytes_several_tokens_could_spell_keep_their_rows_and_the_law(monkeypatch):
    params = SETTINGS[0]
    m = matcher(TWO_WAYS)
    assert m.sync([7]) and m.n_allowed() > 1 and m._m.compute_ff_bytes() == b"a"
    target = TextEngine(seed=0, scale=1.0)
    spec_run(target, TWO_WAYS, params, 2)
    # the row after the first token ("x" or "}", as a letter or a byte token) was computed
    assert any(len(c) == len(PROMPT) + 1 for c in target.row_contexts)
    assert output_pvalue(params, spec=TWO_WAYS, check_accepted=False) > ALPHA
    monkeypatch.setattr(Matcher, "single", two_ways_single)
    assert output_pvalue(params, n=300, spec=TWO_WAYS, check_accepted=False) < ALPHA


# -- a lazy grammar: free text, then a structure from a trigger on (tool_choice "auto") -----

#: free text over a, b, c until the trigger "x", then "a" or "ab" and "}": the shape of
#: `specgen.server.callgrammar.call_grammar`'s auto grammar (a lazy lexeme ending at the tag)
LAZY = GrammarSpec(
    "lark",
    '%llguidance {}\nstart: TEXT | call_open ("a" | "ab") "}"\n'
    'call_open[lazy]: TEXT "x"\nTEXT: /[abc]*/\n',
)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the bug's empty rows
def test_a_lazy_grammar_keeps_the_constrained_law_and_a_planted_bug_breaks_it(monkeypatch):
    """Speculative runs under the lazy grammar follow the constrained target's joint law
    (free positions and positions after the trigger alike); the matcher not rolled back
    after a rejection breaks it."""
    params = SETTINGS[0]
    law = law_of_first(N_TOKENS, engines()[0], PROMPT, params, LAZY)
    after_trigger = sum(p for seq, p in law.items() if 7 in seq or 8 + ord("x") in seq)
    assert after_trigger > 0.1  # the trigger is reached often enough to be tested
    assert output_pvalue(params, spec=LAZY) > ALPHA
    monkeypatch.setattr(Matcher, "sync", no_rollback)
    assert output_pvalue(params, n=300, spec=LAZY, check_accepted=False) < ALPHA  # p 0


# -- the grammar's lead: forced tokens chained before drafting, whatever K is ------------


def test_the_grammar_leads_a_round_at_k_0_for_free():
    """With a drafter and K = 0 (the controller's choice when drafting does not pay), the
    tokens the grammar allows alone after the committed ones still join the round, as its
    lead: fewer target passes than ordinary constrained decoding, no row at a forced
    position, no draft-model proposal, the same greedy output. Without a drafter
    (`--draft none`) decoding stays ordinary: one token per pass."""
    greedy = SamplingParams(temp=0.0)
    config = GenerateConfig(20, greedy, grammar=FORCED_SPEC)
    target, draft = TextEngine(seed=0, scale=1.0), TextEngine(seed=0, scale=1.0, noise=1.0)
    drafter = ModelDrafter(draft, greedy, target.n_vocab)
    led = list(generate(target, drafter, PROMPT, config, FixedK(0)))
    plain = list(generate(TextEngine(seed=0, scale=1.0), None, PROMPT, config))
    assert led[-1].tokens == plain[-1].tokens and led[-1].finish_reason == "stop"
    led_steps = [e for e in led if isinstance(e, Step)]
    plain_steps = [e for e in plain if isinstance(e, Step)]
    assert all(s.n_proposed == 0 for s in plain_steps)
    assert len(led_steps) < len(plain_steps)
    assert sum(s.n_drafted_by.get("grammar", 0) for s in led_steps) >= 2
    assert all(set(s.n_drafted_by) <= {"grammar"} and s.k == 0 for s in led_steps)
    assert not forced_rows(target.row_contexts, PROMPT, FORCED_SPEC)


def test_the_lead_keeps_the_constrained_law_and_a_planted_bug_breaks_it(monkeypatch):
    """Rounds at K = 0 with a drafter (every round a lead, if any, and the target's token)
    follow the constrained target's joint law; planted: the lead takes the first token
    of a forced string where the mask allows another spelling too."""
    params = SETTINGS[1]
    assert output_pvalue(params, k=0, check_accepted=False) > ALPHA
    assert output_pvalue(params, k=0, spec=TWO_WAYS, check_accepted=False) > ALPHA
    monkeypatch.setattr(Matcher, "single", two_ways_single)
    assert output_pvalue(params, k=0, n=300, spec=TWO_WAYS, check_accepted=False) < ALPHA


# -- sole tokens inside a block are free of K ----------------------------------------------


def test_tokens_the_grammar_allows_alone_do_not_count_against_k(monkeypatch):
    from specgen.grammarrows import GrammarProcessor

    _, draft = engines()
    params = SETTINGS[0]
    drafter = ModelDrafter(draft, params, draft.n_vocab)
    g = compile_grammar(FORCED_SPEC, tokenizer_for(draft))
    drafters.attach_grammar(drafter, GrammarProcessor(g, len(PROMPT)))
    rng = np.random.default_rng(0)
    m = matcher(FORCED_SPEC)
    after_drawn = 0
    for room in (8, 8, 8, 8, 3, 2):
        drafter.rollback(PROMPT)
        block = drafter.draft(PROMPT, 2, rng, room)
        x = block.tokens.tolist()
        assert m.sync(x) and len(x) <= room
        assert len(x) - len(block.sole) <= 2  # the tokens K was chosen for, at most 2
        after_drawn += any(i > 0 for i in block.sole)  # sole tokens after a drawn one
        if room == 2:  # room for K tokens only: the block is what K = 2 was before
            assert len(x) <= 2
    assert after_drawn >= 2
    # end to end: the same greedy output as ordinary constrained decoding, in fewer rounds
    # than when the block's sole tokens count against K (planted: no room beyond K)
    greedy = SamplingParams(temp=0.0)
    target, draft = engines(noise=0.0)  # a draft that agrees: every block accepted whole
    spec = GrammarSpec("lark", 'start: ("a" | "b") ("cx}" ("a" | "b")){3}')
    config = GenerateConfig(max_tokens=20, params=greedy, grammar=spec)
    base = list(generate(target, None, PROMPT, config))[-1]
    assert base.finish_reason == "stop"

    def rounds():
        events = list(generate(target, ModelDrafter(draft, greedy, 264), PROMPT, config, FixedK(2)))
        assert events[-1].tokens == base.tokens
        return sum(isinstance(e, Step) for e in events)

    free = rounds()
    monkeypatch.setattr(round.Sequence, "block_room", lambda self: 0)
    assert free < rounds()
