"""Sampled rows under top-k with a grammar, without the full-vocabulary mask:
`first_allowed` (exact cases), `GrammarProcessor.top_k_rows` against the
masked rows (`rows`) on every state of seeded walks, rows with ties and -inf logits, under
several settings: the same p to the bit, batched and one row at a time; and the choice
between a mask and a walk (`RowCosts`). Each comparison fails on a planted bug. The
constrained law with every row walking is checked in test_grammar_exact.py."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import TextEngine

from specgen import grammarrows
from specgen.drafters import ModelDrafter
from specgen.grammar import GrammarTokenizer, compile_grammar, tokenizer_for
from specgen.grammarrows import GrammarProcessor, RowCosts, first_allowed
from specgen.grammarspec import GrammarSpec
from specgen.sampling import SamplingParams, warp_rows

SPECS = [
    # alternatives sharing prefixes, a bounded repetition, an enum
    GrammarSpec("lark", 'start: ("a" | "ab" | "abc") "x"{1,2} ("c" | "}" | "cx")'),
    # free text at the top level, where a mask is dearest (`specgen.grammar`)
    GrammarSpec("lark", "start: /[\\x01-\\x7f]*/"),
    GrammarSpec("lark", "start: /[a-z ]*/ /[0-9]+/"),
    GrammarSpec.json_schema({"type": "object", "properties": {"a": {"type": "string"}}}),
]
SETTINGS = [
    SamplingParams(temp=0.8, top_k=2, top_p=1.0, min_p=0.0),
    SamplingParams(temp=1.0, top_k=5, top_p=0.9, min_p=0.05),
    SamplingParams(temp=1.3, top_k=40, top_p=0.95, min_p=0.0),
    SamplingParams(temp=0.7, top_k=1, top_p=1.0, min_p=0.0),
]


def _states(processor: GrammarProcessor, n: int, rng: np.random.Generator) -> list[list[int]]:
    """A seeded walk's outputs: each token drawn among the allowed ones (not an end)."""
    m, out, states = processor.matcher, [], [[]]
    for _ in range(n):
        assert m.sync(out)
        ok = np.flatnonzero(m.allowed())
        ok = ok[~np.isin(ok, m.grammar.tokenizer.eog)]
        if ok.size == 0:
            break
        out = [*out, int(rng.choice(ok))]
        states.append(out)
    return states


def _mismatches(
    monkeypatch, tok: GrammarTokenizer | None = None, specs=SPECS, n_states: int = 10
) -> tuple[int, int]:
    """(rows whose warp differs from the masked row's, rows a walk decided) over every
    state of a seeded walk per spec and setting, every row walking (no mask at hand):
    blocks of three (some tokens the grammar forbids), logits rounded to 0.25 (ties across
    the top-k boundary), some at -inf. On the fake vocabulary unless `tok`."""
    monkeypatch.setattr(GrammarProcessor, "_walks", lambda self: True)
    decided = 0
    real = grammarrows.first_allowed

    def counted(*args, **kwargs):
        nonlocal decided
        kept = real(*args, **kwargs)
        decided += kept is not None
        return kept

    monkeypatch.setattr(grammarrows, "first_allowed", counted)
    tok = tok or tokenizer_for(TextEngine())
    bad = 0
    rng = np.random.default_rng(0)
    for spec in specs:
        g = compile_grammar(spec, tok)
        for state in _states(GrammarProcessor(g, 0), n_states, rng):
            block = [int(t) for t in rng.integers(1, tok.n_vocab, size=3)]
            if rng.random() < 0.5 and state:  # a block the grammar follows a while
                block[0] = state[-1]
            z = (np.round(rng.standard_normal((4, tok.n_vocab)) * 8) / 4).astype(np.float32)
            z[rng.random(z.shape) < 0.05] = -np.inf
            for params in SETTINGS:
                want = warp_rows(GrammarProcessor(g, 0).rows(z, state, block), params)
                walked = GrammarProcessor(g, 0)
                got = warp_rows(walked.top_k_rows(z, state, block, params.top_k), params)
                for i in range(z.shape[0]):
                    ahead = [*state, *block[:i]]
                    one = walked.top_k_rows(z[i : i + 1], ahead, (), params.top_k)[0]
                    alone = warp_rows(one[None, :], params)
                    same = all(
                        np.array_equal(a, b) for a, b in zip(want.row(i), got.row(i), strict=True)
                    ) and all(
                        np.array_equal(a, b) for a, b in zip(want.row(i), alone.row(0), strict=True)
                    )
                    bad += not same
    return bad, decided


def test_first_allowed_takes_the_first_k_allowed_in_order_or_says_undecided() -> None:
    ids = np.array([5, 3, 9, 1, 4], dtype=np.int64)
    zs = np.array([3.0, 2.0, 2.0, 1.0, -np.inf])
    allowed = {3: True, 1: True, 5: False, 9: False}.get
    assert first_allowed(ids, zs, 1, allowed) == [3]
    assert first_allowed(ids, zs, 2, allowed) == [3, 1]
    # the -inf candidate comes before a third allowed one: the masked row has 2 finite
    assert first_allowed(ids, zs, 3, allowed) is None
    # a token only a mask can answer for, before k are found: undecided
    assert first_allowed(ids, zs, 2, {5: False, 3: None}.get) is None
    # found before the token that needs the mask: decided
    assert first_allowed(ids, zs, 1, {5: True, 3: None}.get) == [5]
    # fewer than k allowed among the candidates
    assert first_allowed(ids[:4], zs[:4], 3, allowed) is None


def test_top_k_rows_warp_as_the_masked_rows(monkeypatch) -> None:
    bad, decided = _mismatches(monkeypatch)
    assert bad == 0
    assert decided > 100  # most rows walked (the rest: forced bytes, an end token first)


@pytest.mark.parametrize("bug", ["allows-ignored", "ties-by-descending-id", "one-fewer"])
def test_a_planted_bug_in_the_walk_breaks_the_rows(monkeypatch, bug) -> None:
    real = grammarrows.first_allowed

    def planted(ids, zs, k, allows):
        if bug == "allows-ignored":
            return [int(t) for t in ids[:k]]
        if bug == "one-fewer":  # (one more would be no bug: top-k drops it)
            kept = real(ids, zs, k, allows)
            return kept[:-1] if kept is not None and k > 1 else kept
        order = np.lexsort((-ids, -zs))  # ties by descending id: not top-k's order
        return real(ids[order], zs[order], k, allows)

    monkeypatch.setattr(grammarrows, "first_allowed", planted)
    # `_mismatches` wraps whatever first_allowed is in place: the planted one
    bad, _ = _mismatches(monkeypatch)
    assert bad > 0


def _drafted(monkeypatch, walk: bool) -> list:
    """Sampled draft blocks of four after the states of seeded walks, each spec, one seed
    per state: tokens and q rows, every row walking (`walk`) or masked in full."""
    monkeypatch.setattr(GrammarProcessor, "_walks", lambda self: walk)
    target, draft = TextEngine(seed=0), TextEngine(seed=0, noise=1.0)
    params = SamplingParams(temp=0.8, top_k=3, top_p=0.95, min_p=0.0)
    tok, prompt, out = tokenizer_for(target), [7, 1, 7], []
    drafter = ModelDrafter(draft, params, target.n_vocab)
    for spec in SPECS:
        g = compile_grammar(spec, tok)
        for n, state in enumerate(_states(GrammarProcessor(g, 0), 8, np.random.default_rng(1))):
            drafter.grammar = GrammarProcessor(g, len(prompt))
            block = drafter.draft([*prompt, *state], 4, np.random.default_rng(n))
            rows = [tuple(a.tolist() for a in block.q.row(i)) for i in range(len(block.q))]
            out.append((block.tokens.tolist(), rows))
    return out


def test_the_sampled_drafts_blocks_are_those_of_full_masks(monkeypatch) -> None:
    """Each draft row walks after the context and the block's proposals so far: the same
    proposals and q as with full masks. Planted: the row walked after the context alone
    (the block's proposals left out: the output law stays exact, acceptance drops)."""
    masked = _drafted(monkeypatch, walk=False)
    assert _drafted(monkeypatch, walk=True) == masked
    monkeypatch.setattr(ModelDrafter, "_masked", _blind_masked)
    assert _drafted(monkeypatch, walk=True) != masked


def _blind_masked(self, row, context, block):
    """`ModelDrafter._masked` walking a sampled row after the context only (planted)."""
    return self.grammar.top_k_rows(row[None, :], context, (), self.params.top_k)[0]


def test_the_choice_walks_where_walks_cost_less_and_retimes_them(monkeypatch) -> None:
    c = RowCosts()
    c.add(False, 4e-3)
    assert c.mask_s == 4e-3 and c.walk_s is None and c.masks == 1
    c.add(True, 3e-4)
    assert c.walk_s == 3e-4 and c.masks == 0
    c.add(False, 12e-3)
    assert c.mask_s == pytest.approx(4e-3 + (12e-3 - 4e-3) / 8)

    g = compile_grammar(SPECS[1], tokenizer_for(TextEngine()))
    proc = GrammarProcessor(g, 0)
    proc.costs = RowCosts()
    assert not proc._walks()  # no mask timed yet
    proc.costs = RowCosts(mask_s=1e-3)
    assert proc._walks()  # the first walk, to time one
    proc.costs = RowCosts(mask_s=1e-3, walk_s=2e-3)
    assert not proc._walks()
    proc.costs = RowCosts(mask_s=1e-3, walk_s=2e-3, masks=RowCosts.RETRY)
    assert proc._walks()
    proc.costs = RowCosts(mask_s=1e-3, walk_s=5e-4)
    assert proc._walks()
    walked: list[int] = []
    real = grammarrows.first_allowed
    monkeypatch.setattr(grammarrows, "first_allowed", lambda *a: walked.append(1) or real(*a))
    z = np.zeros((1, proc.matcher.n_vocab), dtype=np.float32)
    proc.top_k_rows(z, [], (), 2)
    assert walked == [1]  # no mask at hand: it walks
    proc.matcher.allowed()  # the mask is at hand: read it, untimed
    proc.top_k_rows(z, [], (), 2)
    assert walked == [1] and proc.costs.masks == 0


@pytest.mark.parametrize("which", [0, 1], ids=["gemma", "smollm2"])
def test_on_real_vocabularies_top_k_rows_warp_as_the_masked_rows(
    monkeypatch, which, demo_pair, smol_pair
) -> None:
    """Gemma 3's 262,144 tokens and SmolLM2's 49,152, under free text, a tool call's
    grammar with text before it (`tool_choice: "auto"`) and a JSON schema."""
    from specgen.llamacpp import EngineConfig, LlamaEngine
    from specgen.server.callgrammar import call_grammar
    from specgen.server.schemas import Tool
    from specgen.server.tools import Choice

    tool = Tool.model_validate(
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    )
    auto = call_grammar([tool], Choice("auto", syntax="hermes"))
    assert auto is not None
    specs = [GrammarSpec("gbnf", "root ::= [^\\n]*"), auto, SPECS[3]]
    with LlamaEngine((demo_pair[1], smol_pair[1])[which], EngineConfig(n_ctx=256)) as eng:
        bad, decided = _mismatches(monkeypatch, tokenizer_for(eng), specs, n_states=3)
    assert bad == 0
    assert decided > 20
