"""Log-probabilities (`specgen.logprobs`): the math against plain numpy, then on the tiny F32
pair through the Python API: every emitted token's value equals the target scoring the
same text in one ordinary pass, whatever proposed it (the draft model, prompt lookup, a
residual draw, a bonus token), and at temperature 0 the chosen token is the top entry."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import specgen
from specgen.chat import prompt_tokens
from specgen.events import Span, Step
from specgen.logprobs import TokenLogprob, log_softmax_at, token_logprobs, top_ids
from specgen.server.logprobs import legacy_token, text_logprobs

# tiny F32 models: a batched and a single pass differ by float rounding only (FIELD.md:
# 0.016 logits on the F32 demo target, up to 1 on Q4_K_M); the bound is far below any real
# difference between rows (a wrong row is off by whole nats)
TOL = 2e-3


def test_log_softmax_and_top_ids_match_plain_numpy() -> None:
    rng = np.random.default_rng(3)
    for n_vocab in (300, 50_000):
        row = (rng.normal(size=n_vocab) * 4).astype(np.float32)
        row[7] = row[11] = row.max() + 1.0  # a tie at the top: the lower id first
        ref = row.astype(np.float64) - np.log(np.exp(row.astype(np.float64)).sum())
        ids = np.arange(n_vocab)
        assert np.allclose(log_softmax_at(row, ids), ref, atol=1e-6)
        for n in (1, 2, 5, 20):
            expect = np.lexsort((ids, -row.astype(np.float64)))[:n]
            assert top_ids(row, n).tolist() == expect.tolist()
        lp = token_logprobs(row[None, :], [5], 3, lambda t: bytes([65 + t % 26]))[0]
        assert lp.token == 5 and lp.logprob == pytest.approx(ref[5])
        assert [t.token for t in lp.top] == [7, 11, int(expect[2])]
        assert lp.top[0].logprob == pytest.approx(ref[7]) and lp.top[0].top == ()


def test_top_ids_of_a_wide_row_of_ties_are_the_lowest_ids() -> None:
    # the strided sample's n-th largest equals the entries tied with it: all of them count
    assert top_ids(np.zeros(16_384, dtype=np.float32), 3).tolist() == [0, 1, 2]
    masked = np.full(50_000, -np.inf, dtype=np.float32)  # a grammar's mask: few allowed
    masked[[40_000, 3, 9_000]] = 0.5
    assert top_ids(masked, 2).tolist() == [3, 9_000]


def test_legacy_logprobs_name_part_characters_by_their_bytes() -> None:
    """Tokens that hold part of a UTF-8 character each keep their own ``top_logprobs`` key
    (``bytes:\\xe6\\x97``, OpenAI's legacy naming): shown as U+FFFD they overwrote
    each other, and the chosen token's entry was another token's value."""
    ja = "日本".encode()  # two 3-byte characters
    top = (
        TokenLogprob(5, -0.2, ja[:2]),
        TokenLogprob(6, -1.0, ja[3:5]),
        TokenLogprob(7, -2.0, b"a"),
    )
    chosen = TokenLogprob(6, -1.0, ja[3:5], top)
    out = text_logprobs([Span("", 6, False, logprob=chosen)])
    assert out["tokens"] == ["bytes:\\xe6\\x9c"]
    assert out["top_logprobs"] == [{"bytes:\\xe6\\x97": -0.2, "bytes:\\xe6\\x9c": -1.0, "a": -2.0}]
    assert legacy_token("é".encode()) == "é" and legacy_token(b"") == ""


def test_a_wrong_row_is_detected() -> None:
    # the planted bug this suite's model test must catch: reading row i + 1 for token i
    rng = np.random.default_rng(4)
    rows = (rng.normal(size=(3, 300)) * 4).astype(np.float32)
    good = token_logprobs(rows, [1, 2], 0, bytes)
    shifted = token_logprobs(rows[1:], [1, 2], 0, bytes)
    assert max(abs(a.logprob - b.logprob) for a, b in zip(good, shifted, strict=True)) > TOL


def _kinds(step: Step) -> list[str]:
    """Each span's proposer, with the target's token told apart: a residual (after a
    rejection), a bonus (all proposals accepted) or an ordinary token (K = 0)."""
    out = []
    for i, span in enumerate(step.spans):
        if span.source != "target":
            out.append(span.source or "")
        elif step.k == 0:
            out.append("ordinary")
        else:
            out.append("bonus" if i == step.n_proposed else "residual")
    return out


def _check_against_one_pass(pair: specgen.Pair, prompt: str, **settings: object) -> set[str]:
    """Generate with logprobs, then score prompt + output in one ordinary pass; returns the
    kinds of tokens checked."""
    steps = [e for e in pair.stream(prompt, logprobs=3, **settings) if isinstance(e, Step)]
    spans = [(s, kind) for st in steps for s, kind in zip(st.spans, _kinds(st), strict=True)]
    spans = [(s, kind) for s, kind in spans if s.logprob is not None]
    target = pair.session.target
    ids = prompt_tokens(target, prompt.encode())
    tokens = [s.token for s, _ in spans]
    target.truncate(0)
    rows = np.array(target.decode(ids + tokens, all_logits=True))[len(ids) - 1 :]
    target.truncate(0)
    for i, (span, _) in enumerate(spans):
        assert span.logprob is not None
        ref = rows[i].astype(np.float64) - np.log(np.exp(rows[i].astype(np.float64)).sum())
        assert span.logprob.logprob == pytest.approx(ref[span.token], abs=TOL)
        assert len(span.logprob.top) == 3
        for alt in span.logprob.top:
            assert alt.logprob == pytest.approx(ref[alt.token], abs=TOL)
        assert span.logprob.top[0].logprob == pytest.approx(ref.max(), abs=TOL)
    return {kind for _, kind in spans}


@pytest.fixture(scope="module")
def pair(tiny_target: Path, tiny_draft: Path):
    with specgen.load(tiny_target, tiny_draft, ctx_size=512) as p:
        yield p


def test_sampled_tokens_from_the_draft_residuals_and_bonuses_are_exact(pair) -> None:
    kinds: set[str] = set()
    for seed in range(4):
        kinds |= _check_against_one_pass(
            pair, "the cat", max_tokens=40, temperature=1.0, draft_max=3, seed=seed,
            ignore_eos=True,
        )  # fmt: skip
    assert {"draft", "residual", "bonus"} <= kinds


def test_lookup_tokens_are_exact_and_greedy_picks_the_top_entry(tiny_target: Path) -> None:
    with specgen.load(tiny_target, "ngram", ctx_size=512) as p:
        prompt = "the cat the cat the cat the cat"
        kinds = _check_against_one_pass(
            p, prompt, max_tokens=40, temperature=0, draft_max=4, ignore_eos=True
        )
        assert "lookup" in kinds
        r = p.generate(prompt, max_tokens=20, temperature=0, logprobs=2, ignore_eos=True)
    assert r.logprobs is not None and len(r.logprobs) == len(r.tokens) == 20
    for tok, lp in zip(r.tokens, r.logprobs, strict=True):
        assert lp.token == tok
        # the top entry, or a tie with it within the batched-vs-single difference
        assert lp.top[0].token == tok or lp.logprob >= lp.top[0].logprob - TOL


def test_without_logprobs_nothing_is_computed(pair) -> None:
    r = pair.generate("the cat", max_tokens=8, temperature=0, seed=1)
    assert r.logprobs is None
    steps = [e for e in pair.stream("the cat", max_tokens=8) if isinstance(e, Step)]
    assert all(s.logprob is None for st in steps for s in st.spans)
