"""Constrained decoding without the masks that change nothing, and each mask once per
sequence: `Matcher.allows` and `Matcher.single` without a mask, `GrammarProcessor.argmax_rows`
(greedy's rows), the drafter's greedy rows, `MaskCache` between a round's two sides. Each
is checked against the full masks on every state of seeded walks (exact: the same answers,
the same tokens), and each check fails on a planted bug."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import TextEngine

from specgen.drafters import ModelDrafter
from specgen.events import Done
from specgen.generate import FixedK, GenerateConfig, generate
from specgen.grammar import MaskCache, Matcher, compile_grammar, tokenizer_for
from specgen.grammarrows import GrammarProcessor
from specgen.grammarspec import GrammarSpec
from specgen.sampling import SamplingParams

PROMPT = [7, 1, 7]
GREEDY = SamplingParams(temp=0.0)
SPECS = [
    # alternatives sharing prefixes, a bounded repetition, an enum
    GrammarSpec("lark", 'start: ("a" | "ab" | "abc") "x"{1,2} ("c" | "}" | "cx")'),
    # free text at the top level, where a mask is dearest (`specgen.grammar`)
    GrammarSpec("lark", "start: /[\\x01-\\x7f]*/"),
    GrammarSpec.json_schema({"type": "object", "properties": {"a": {"type": "string"}}}),
]
IDS = ["enum", "free-text", "json"]
N_VOCAB = TextEngine().n_vocab


def matcher(spec: GrammarSpec, cache: MaskCache | None = None) -> Matcher:
    return (
        compile_grammar(spec, tokenizer_for(TextEngine())).matcher()
        if cache is None
        else (Matcher(compile_grammar(spec, tokenizer_for(TextEngine())), cache))
    )


def walk(spec: GrammarSpec, n: int = 14, seed: int = 0) -> list[list[int]]:
    """The states of a seeded walk: prefixes of an output the grammar allows, each token
    drawn among the allowed ones (the end excluded while another is allowed)."""
    m, rng, out, states = matcher(spec), np.random.default_rng(seed), [], [[]]
    for _ in range(n):
        assert m.sync(out)
        ok = np.flatnonzero(m.allowed())
        ok = ok[ok != 0] if ok.size > 1 else ok
        if ok.size == 0 or ok[0] == 0:
            break
        out = [*out, int(rng.choice(ok))]
        states.append(out)
    return states


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_allows_and_single_answer_as_the_mask_in_every_state(spec: GrammarSpec) -> None:
    unmasked = 0
    for state in walk(spec):
        full = matcher(spec)
        assert full.sync(state)
        want = full.allowed()
        fresh = matcher(spec)
        assert fresh.sync(state)
        got = [fresh.allows(t) for t in range(1, N_VOCAB)]
        unmasked += fresh._bits_at != len(state)  # answered without a mask (no forced byte)
        assert got == want[1:].tolist(), state
        assert fresh.allows(0) == bool(want[0])  # the end: read off the mask
        assert not fresh.allows(N_VOCAB) and not fresh.allows(-1)
        lone = matcher(spec)
        assert lone.sync(state)
        assert lone.single() == full.single(), state  # TextEngine has a token per byte
    assert unmasked > 0  # the path that skips the mask was tested too


def test_validating_a_spelling_of_forced_bytes_is_not_what_the_mask_allows() -> None:
    """Why `allows` computes the mask where bytes are forced: after "abc" the mask allows
    the canonical "x" (7) alone, while llguidance validates its byte token (8 + 120)."""
    m = matcher(SPECS[0])
    assert m.sync([3, 4]) and bytes(m._m.compute_ff_bytes()) == b"x"
    assert m._m.validate_tokens([8 + ord("x")]) == 1
    assert not m.allows(8 + ord("x")) and m.allows(7)


def test_single_without_a_mask_finds_forced_and_final_tokens() -> None:
    m = matcher(SPECS[0])
    assert m.sync([3, 4])  # "abc": an "x" must follow
    assert m.single() == 7
    assert m.sync([3, 4, 7, 7, 6])  # complete, nothing more: the end alone
    assert m.stopped and m.single() == 0


def rows_and_blocks(spec: GrammarSpec, seed: int = 1):
    """(context, block, logits) cases on the walk's states: blocks of the allowed path,
    with a token the grammar forbids in some; rows whose maximum a forbidden token holds,
    ties between an allowed and a forbidden token, and plain normal rows."""
    rng = np.random.default_rng(seed)
    states = walk(spec, seed=seed)
    for i, state in enumerate(states[:-1]):
        block = states[-1][len(state) : len(state) + 4]
        if i % 3 == 1 and block:
            block = [*block[:-1], 2 if block[-1] != 2 else 5]  # often forbidden
        logits = rng.standard_normal((len(block) + 1, N_VOCAB)).astype(np.float32)
        full = matcher(spec)
        full.sync(state)
        for r in range(logits.shape[0]):
            if r % 2 == 0:
                banned = np.flatnonzero(~full.allowed())
                if banned.size:
                    logits[r, banned[r % banned.size]] = 9.0  # a forbidden maximum
            else:
                ok = np.flatnonzero(full.allowed())
                logits[r, ok[-1]] = logits[r, 3] = 9.0  # a tie
            if r < len(block) and not full._consume(block[r]):
                break
        yield [*PROMPT, *state], block, logits


def argmax_mismatches(spec: GrammarSpec) -> int:
    bad = 0
    for context, block, logits in rows_and_blocks(spec):
        g = compile_grammar(spec, tokenizer_for(TextEngine()))
        want = np.argmax(GrammarProcessor(g, len(PROMPT)).rows(logits, context, block), axis=1)
        got = GrammarProcessor(g, len(PROMPT)).argmax_rows(logits, context, block)
        assert got.shape == want.shape and got.dtype == np.int64
        bad += int((got != want).sum())
    return bad


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_argmax_rows_are_the_masked_rows_argmax(spec: GrammarSpec, monkeypatch) -> None:
    assert argmax_mismatches(spec) == 0
    monkeypatch.setattr(Matcher, "allows", lambda self, token: True)  # planted: no check
    assert argmax_mismatches(spec) > 0


def reference_greedy(target: TextEngine, spec: GrammarSpec, n: int) -> list[int]:
    """Greedy constrained decoding by hand: every row masked in full, then its argmax."""
    m, out = matcher(spec), []
    while len(out) < n and not m.stopped:
        assert m.sync(out)
        x = int(np.argmax(m.mask(target.logits_after(PROMPT + out))))
        if x == 0:
            break
        out.append(x)
    return out


@pytest.mark.parametrize("k", [0, 3])
@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_greedy_output_is_the_fully_masked_greedy_output(spec, k, monkeypatch) -> None:
    target, draft = TextEngine(seed=0, scale=1.0), TextEngine(seed=0, scale=1.0, noise=1.0)
    computed = []
    real = Matcher._compute
    # counted: the generation's own matchers (a cache of masks), not the reference's
    monkeypatch.setattr(
        Matcher, "_compute", lambda m: computed.append(m._cache is not None) or real(m)
    )
    config = GenerateConfig(max_tokens=24, params=GREEDY, grammar=spec)
    drafter = ModelDrafter(draft, GREEDY, N_VOCAB, p_min=0.3) if k else None
    done = list(generate(target, drafter, PROMPT, config, FixedK(k)))[-1]
    assert isinstance(done, Done)
    assert list(done.tokens) == reference_greedy(target, spec, 24)
    if spec is SPECS[1] and k == 0:  # free text: a row whose argmax is allowed needs none
        assert sum(computed) < len(done.tokens)


def drafted(spec: GrammarSpec, p_min: float) -> list[tuple[list[int], list]]:
    target, draft = TextEngine(seed=0), TextEngine(seed=0, noise=1.0)
    g = compile_grammar(spec, tokenizer_for(target))
    drafter = ModelDrafter(draft, GREEDY, N_VOCAB, p_min=p_min)
    out = []
    for state in walk(spec, n=8):
        drafter.grammar = GrammarProcessor(g, len(PROMPT))
        block = drafter.draft([*PROMPT, *state], 4, np.random.default_rng(0))
        out.append((block.tokens.tolist(), [block.q.row(i) for i in range(len(block.q))]))
    return out


def unguarded(self: ModelDrafter, row, context, block):
    """`ModelDrafter._masked` without its cut-off condition (a planted bug)."""
    if self.params.greedy and self.grammar.allows(context, block, int(np.argmax(row))):
        return row
    return self.grammar.row(row, context, block)


def test_the_greedy_drafts_blocks_are_those_of_full_masks(monkeypatch) -> None:
    lazy = {(i, p): _same(drafted(s, p)) for i, s in enumerate(SPECS) for p in (0.0, 0.6)}
    with monkeypatch.context() as mp:  # every row masked in full
        mp.setattr(GrammarProcessor, "allows", lambda self, context, block, token: False)
        for (i, p_min), blocks in lazy.items():
            assert _same(drafted(SPECS[i], p_min)) == blocks, (IDS[i], p_min)
    with monkeypatch.context() as mp:  # planted: the argmax taken unchecked
        mp.setattr(GrammarProcessor, "allows", lambda self, context, block, token: True)
        assert any(_same(drafted(SPECS[i], 0.0)) != lazy[i, 0.0] for i in range(len(SPECS)))
    with monkeypatch.context() as mp:  # planted: the cut-off read off the unmasked row
        mp.setattr(ModelDrafter, "_masked", unguarded)
        assert any(_same(drafted(SPECS[i], 0.6)) != lazy[i, 0.6] for i in range(len(SPECS)))


def _same(blocks):
    """Blocks with their q rows as plain lists, for comparison."""
    return [(t, [(ids.tolist(), p.tolist()) for ids, p in rows]) for t, rows in blocks]


def masks_computed(spec: GrammarSpec, params: SamplingParams) -> list[tuple[int, ...]]:
    target, draft = TextEngine(seed=0, scale=1.0), TextEngine(seed=0, scale=1.0, noise=1.0)
    seen: list[tuple[int, ...]] = []
    real = Matcher._compute

    def counting(m: Matcher):
        if m._cache is not None:  # not compile_grammar's probe of the start
            seen.append(tuple(m.tokens))
        return real(m)

    mp = pytest.MonkeyPatch()
    mp.setattr(Matcher, "_compute", counting)
    try:
        config = GenerateConfig(max_tokens=24, params=params, grammar=spec, seed=3)
        list(generate(target, ModelDrafter(draft, params, N_VOCAB), PROMPT, config, FixedK(3)))
    finally:
        mp.undo()
    return seen


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_a_sequence_computes_each_mask_once(spec: GrammarSpec, monkeypatch) -> None:
    sampled = SamplingParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.0)
    seen = masks_computed(spec, sampled)
    assert seen and len(seen) == len(set(seen))
    monkeypatch.setattr(MaskCache, "get", lambda self, tokens: None)  # planted: no sharing
    seen = masks_computed(spec, sampled)
    assert len(seen) > len(set(seen))


def test_the_cache_keeps_the_last_masks_by_their_exact_output() -> None:
    cache = MaskCache(keep=3)
    bits = [np.full((1, 9), i, dtype=np.int32) for i in range(5)]
    cache.put([1, 2], bits[0])
    cache.put([1, 3], bits[1])
    assert cache.get([1, 2]) is bits[0] and cache.get([1, 3]) is bits[1]
    assert cache.get([2, 2]) is None and cache.get([1]) is None
    key = [4]
    cache.put(key, bits[2])
    key.append(5)  # the caller's list goes on: the entry keeps the output it was put with
    assert cache.get([4]) is bits[2] and cache.get([4, 5]) is None
    cache.put([7, 7, 7], bits[3])
    assert cache.get([1, 2]) is None  # the oldest of four, past keep=3
    assert cache.get([1, 3]) is bits[1] and cache.get([7, 7, 7]) is bits[3]


REAL_SPECS = [
    GrammarSpec("gbnf", "root ::= [^\\n]*"),  # free text: a 4-8 ms mask on Gemma's vocabulary
    GrammarSpec.json_schema(
        {
            "type": "object",
            "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
            "required": ["name", "n"],
        }
    ),
]


@pytest.mark.parametrize("which", [0, 1], ids=["gemma", "smollm2"])
def test_on_real_vocabularies_allows_and_single_answer_as_the_mask(
    which, demo_pair, smol_pair
) -> None:
    """Every token of Gemma 3's 262,144 and SmolLM2's 49,152, in the states of seeded
    walks: `allows` without a mask and `single` without one are the mask's answers."""
    from specgen.llamacpp import EngineConfig, LlamaEngine

    path = (demo_pair[1], smol_pair[1])[which]
    with LlamaEngine(path, EngineConfig(n_ctx=256)) as eng:
        tok = tokenizer_for(eng)
        for spec in REAL_SPECS:
            g = compile_grammar(spec, tok)
            rng, out, unmasked = np.random.default_rng(which), [], 0
            for _ in range(6):
                full, fresh, lone = g.matcher(), g.matcher(), g.matcher()
                assert full.sync(out) and fresh.sync(out) and lone.sync(out)
                want = full.allowed()
                ends = set(tok.eog)  # asked last: an end is read off the mask
                order = [t for t in range(tok.n_vocab) if t not in ends] + sorted(ends)
                got = np.zeros(tok.n_vocab, dtype=bool)
                for t in order:
                    got[t] = fresh.allows(t)
                    if t == order[-len(ends) - 1]:
                        unmasked += fresh._bits_at != len(out)
                assert (got == want).all(), (spec.kind, out, np.flatnonzero(got != want)[:5])
                assert lone.single() == full.single()
                ok = np.flatnonzero(want)
                ok = ok[~np.isin(ok, tok.eog)]
                out = [*out, int(rng.choice(ok))]
            assert unmasked > 0
