"""The five stages of a round, as pure-ish functions over engines and rows, and how K is
chosen (`KPolicy`: fixed, or the controller's); a generation's settings are
`specgen.genconfig`'s. `specgen.round.Sequence` composes the stages per sequence; the
batch engine (`specgen.sched`) drives the Sequences.

One round: (1) `draft_block`: K proposals x_1..x_K with their q rows; (2) a target decode
of `tokens_to_score` = [last, x_1..x_K] with K+1 output rows; (3) `accept_prefix`: the
longest accepted prefix, n; (4) `next_token`: a residual draw at position n+1, or the
bonus token from p_{K+1} when n = K; (5) `rollback`: the target drops x_{n+1}..x_K.
K = 0 is a plain ordinary-decoding pass through the same code.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from specgen import rejection
from specgen.constraints import Processor
from specgen.engine import BatchEngine, Block, Drafter, Engine, Logits, SeqDecode
from specgen.errors import PromptError
from specgen.events import RoundTrace, Source
from specgen.genconfig import VerifyRule
from specgen.sampling import Dists, SamplingParams, warp_rows

if TYPE_CHECKING:
    from specgen.grammarrows import GrammarProcessor


@dataclass(frozen=True)
class FixedK:
    """`--draft-max K`: every round has block size K (capped by the room left; 0 is
    ordinary decoding)."""

    k: int


@dataclass(frozen=True)
class AutoK:
    """`--draft-max auto`: the batch controller (`specgen.control.batch`) chooses K before
    every round, at most `k_max`."""

    k_max: int = 16


KPolicy = FixedK | AutoK
"""How a generation's K is chosen: fixed, or by the controller."""


@dataclass
class Verified:
    """Target side of a round: p rows (or their argmax when greedy), and the logits they
    came from (processed by the request's constraints when it has any)."""

    p: Dists | None  # k+1 rows, None when greedy
    argmax: np.ndarray | None  # (k+1,) int64 when greedy
    rows: Logits  # (k+1, n_vocab) float32: what p and argmax were taken from


# -- the five stages --------------------------------------------------------------------


def draft_block(
    drafter: Drafter | None,
    context: list[int],
    k: int,
    rng: np.random.Generator,
    room: int | None = None,
) -> Block:
    """Stage 1: up to k proposals after `context` with their q rows (empty when k = 0);
    the grammar's sole tokens beside them, within `room` tokens in all (`Drafter.draft`)."""
    if drafter is None or k == 0:
        return Block(tokens=np.zeros(0, dtype=np.int64), q=Dists.empty(0))
    return drafter.draft(context, k, rng, room)


def with_lead(lead: list[int], block: Block, n_vocab: int) -> Block:
    """`block` after `lead`, tokens the grammar allows alone (`Sequence.draft_context`):
    each with a one-hot q, source "grammar" and its index in `Block.sole` (no target row);
    the block's own `sole` indices move up by len(lead)."""
    lead_q = Dists.one_hot(np.array(lead, dtype=np.int64), n_vocab)
    if len(block.tokens) and block.q.dense:
        lead_q = Dists(None, lead_q.to_dense(), n_vocab)
    m = len(block.tokens)
    grammar: Source = "grammar"
    sources = (grammar,) * len(lead) + (block.sources or (block.source(0),) * m)
    return Block(
        np.concatenate([np.array(lead, dtype=np.int64), block.tokens]),
        Dists.concat([lead_q, block.q], n_vocab) if m else lead_q,
        sources,
        tuple(range(len(lead))) + tuple(len(lead) + i for i in block.sole),
    )


def tokens_to_score(last: int, block: Block) -> list[int]:
    """Stage 2's input for one sequence: [last, x_1..x_K] (K + 1 positions: row i scores
    the token after x_i, row K the bonus position)."""
    return [last, *block.tokens.tolist()]


def score_blocks(target: BatchEngine, parts: list[SeqDecode], copy: bool) -> list[Logits]:
    """Stage 2: ONE batched target decode of every sequence's `tokens_to_score` (and the
    prompt chunks that join it), `BatchEngine.decode_batch`.

    Returns:
        Per part, (n_rows, n_vocab) float32 logits: its asked rows (K + 1 for a round
        without forced rows; row i scores the token after x_i). With ``copy=False`` views
        into llama.cpp's buffer, valid until the next decode (one part only: its commit
        reads them first).

    Raises:
        EngineError: llama_decode failed.
    """
    return target.decode_batch(parts, copy=copy)


def target_distributions(
    logits: Logits,
    params: SamplingParams,
    processor: Processor | None = None,
    context: Sequence[int] = (),
    block: Sequence[int] = (),
    grammar: GrammarProcessor | None = None,
    lazy: bool = True,
) -> Verified:
    """p rows under the same warpers as q, all rows in one call; greedy keeps only the
    argmax per row.

    Args:
        logits: (n, n_vocab) float32 raw rows of stage 2 (row i scores the token after
            context + block[:i]).
        params: the warpers.
        processor: the request's constraints (`specgen.constraints.processor_for`), or
            None: then the rows are used as they are (no copy).
        context: the committed tokens, prompt included; block: x_1..x_K. Read only with a
            processor or a grammar: row i is processed with history context + block[:i],
            the same history the draft's q_{i+1} was processed with.
        grammar: the request's grammar, masking after `processor` (its -inf commutes
            with a bias, a penalty and min_tokens' -inf), or None. Greedy with `lazy`
            masks only the rows whose own argmax it does not allow
            (`GrammarProcessor.argmax_rows`: the same tokens), and `rows` stay unmasked;
            sampling under top-k with `lazy` keeps the k allowed tokens top-k keeps
            (`GrammarProcessor.top_k_rows`: the same p), and `rows` hold those alone.
    """
    if processor is not None:
        logits = processor.rows(logits, context, block)
    if grammar is not None:
        if params.greedy and lazy:
            return Verified(None, grammar.argmax_rows(logits, context, block), logits)
        if lazy and 0 < params.top_k < logits.shape[1]:
            logits = grammar.top_k_rows(logits, context, block, params.top_k)
        else:
            logits = grammar.rows(logits, context, block)
    if params.greedy:
        return Verified(p=None, argmax=np.argmax(logits, axis=1), rows=logits)
    return Verified(p=warp_rows(logits, params), argmax=None, rows=logits)


def accept_prefix(block: Block, v: Verified, u: np.ndarray) -> int:
    """Stage 3: n, the accepted prefix length (Leviathan et al. 2023, Algorithm 1)."""
    if v.argmax is not None:
        return rejection.accept_greedy(block.tokens, v.argmax)
    assert v.p is not None
    return rejection.accept(block.tokens, block.q, v.p, u)


def next_token(n: int, block: Block, v: Verified, rng: np.random.Generator) -> int:
    """Stage 4: residual draw at the first rejection (n < K), or the bonus token from
    p_{K+1} after a full accept (n = K) (Leviathan et al. 2023, Algorithm 1)."""
    if v.argmax is not None:
        # one-hot p minus one-hot q at a rejected position leaves p: the argmax
        return int(v.argmax[n])
    assert v.p is not None
    return rejection.correct(n, block.q, v.p, rng)


class Verdict(NamedTuple):
    """Stages 3-4's outcome: n accepted, the token after them (a residual draw or the
    bonus token), the (K,) float64 uniforms drawn (u, or block verification's eta) and
    h_1..h_K (block verification only, else empty)."""

    n: int
    x_next: int
    u: np.ndarray
    h: np.ndarray


def verify_block(
    block: Block, v: Verified, rng: np.random.Generator, rule: VerifyRule = "token"
) -> Verdict:
    """Stages 3-4 under `rule`: K uniforms then one draw for the correction, from `rng`.

    "block" is block verification (`rejection.block_weights`, Sun et al. 2025), used
    where it can differ from token-wise: a sampled p (greedy rows are one-hot, where the
    two rules coincide exactly) and K >= 2 (at K = 1 they coincide exactly). `v` holds
    K + 1 rows (stage 2 always scores the bonus position).
    """
    u = rng.random(block.tokens.size)
    if rule == "block" and v.p is not None and block.tokens.size > 1:
        big_p, h = rejection.block_weights(block.tokens, block.q, v.p)
        n = rejection.last_passing(u, h)
        y = rejection.block_correct(n, float(big_p[n]), block.q, v.p, rng)
        assert y is not None  # None only for a p without the bonus row
        return Verdict(n, y, u, h)
    n = accept_prefix(block, v, u)
    return Verdict(n, next_token(n, block, v, rng), u, np.zeros(0))


def rollback(target: Engine, drafter: Drafter | None, committed: list[int]) -> None:
    """Stage 5: both caches back to the committed tokens except the last."""
    target.truncate(len(committed) - 1)
    if drafter is not None:
        drafter.rollback(committed)


def make_trace(
    target: Engine,
    drafter: Drafter | None,
    committed: list[int],
    new: list[int],
    block: Block,
    logits: Logits,
    v: Verified,
    verdict: Verdict,
    rule: VerifyRule,
) -> RoundTrace:
    """The round's RoundTrace, built after its rollback (`logits` still this round's rows,
    as p was taken from them: `Verified.rows`;
    `new`: the tokens it committed; `verdict`: stages 3-4's outcome under `rule`)."""
    n, x_next, u = verdict.n, verdict.x_next, verdict.u
    x = block.tokens.tolist()
    k = len(x)
    row = n  # the row x_next was drawn from
    if v.argmax is not None:
        p_x = [1.0 if x[i] == int(v.argmax[i]) else 0.0 for i in range(k)]
        q_x = [1.0] * k
        z = logits[row].astype(np.float64)  # greedy p is one-hot: show the raw softmax
        w = np.exp(z - z.max())
        ids, pr = np.arange(z.size), w / w.sum()
    else:
        assert v.p is not None
        p_x = v.p[:k].at(block.tokens).tolist()
        q_x = block.q.at(block.tokens).tolist()
        ids, pr = v.p.row(row)
    # most likely first (sparse rows are already in that order)
    head = np.argpartition(-pr, 2)[:3] if pr.size > 3 else np.arange(pr.size)
    best = head[np.argsort(-pr[head], kind="stable")]
    top = tuple((int(ids[j]), float(pr[j])) for j in best)
    tested = n + 1 if n < k else k
    return RoundTrace(
        position=len(committed) - len(new),
        drafted=tuple(x),
        q_x=tuple(q_x),
        p_x=tuple(p_x),
        u=tuple(float(a) for a in u),
        accepted=tuple(i < n for i in range(tested)),
        next_token=x_next,
        next_kind="ordinary" if k == 0 else ("bonus" if n == k else "residual"),
        top=top,
        target_cache=len(target.tokens),
        draft_cache=drafter.cached_tokens if drafter is not None else -1,
        verify_rule=rule,
        sources=tuple(block.source(i) for i in range(k)),
        h=tuple(float(a) for a in verdict.h),
    )


# -- before the first round -----------------------------------------------------------


def time_passes(
    engine: Engine, last: int, n: int, clock: Callable[[], float] = time.perf_counter
) -> list[float]:
    """Seconds of each of n single-token passes of `last`, each rolled back (the
    ordinary-decoding baseline for a target, a draft token's cost for a draft)."""
    base = len(engine.tokens)
    times = []
    for _ in range(max(0, n)):
        t0 = clock()
        engine.decode([last])
        times.append(clock() - t0)
        engine.truncate(base)
    return times


def check_prompt(prompt: list[int], n_ctx: int) -> None:
    """Raises PromptError for an empty prompt or one that leaves no room to generate."""
    if not prompt:
        raise PromptError("the prompt is empty")
    if len(prompt) >= n_ctx:
        raise PromptError(
            f"the prompt is {len(prompt)} tokens but the context holds {n_ctx}:"
            " shorten it or raise -c"
        )
