"""Goodput: the expected tokens of a round, and the K that maximize tokens per second.

E(K), the tokens a round with block size K is expected to emit (`expected_gains`,
`expected_tokens`, `break_even_alpha`).

For a batch of slots (`choose`, under `specgen.control.batch.BatchController`; the single
stream is its one-slot case): with several requests in one target decode, a slot's block
costs more than its own rows: every drafted depth is a draft decode all slots wait for,
and every row is a row of the one target pass everyone shares. So K is chosen for the
whole batch at once, maximizing goodput (SmartSpec, Liu et al. 2024, arXiv 2406.14066):
expected tokens emitted by the step over the step's predicted seconds,

    G(K_1..K_N) = sum_i E_i(K_i) / (T(sum_i (K_i + 1)) + sum_{j=1..D} S(n_j) + fixed_s)

with E_i the expected tokens of slot i's round (`expected_tokens` over its
acceptance by position), T the target's seconds for a decode of that many rows, S the
draft's seconds for one depth drafted by n slots, D = max K_i and n_j the slots with
K_i >= j. K = 0 everywhere (ordinary batched decoding) is always a candidate, so
speculation is used only when it is predicted to pay; acceptance alone cannot decide it
(at high load the rows speculation adds compete with other requests' rows).

T and S are fitted by least squares to the decodes the server actually makes: T a line
over the rows of each target decode (`LineFit`), S over the logits rows of each draft
decode and, apart, its tokens without a row (`DraftFit`: on a CPU a draft row costs
several times a token), so a depth drafted by n slots costs S(n) = c0 + c_row n. A slot
whose draft cache fell behind (it did not speculate for a while: the committed tokens of
those steps were never drafted) first evaluates the missing tokens in its first depth:
c_tok more seconds per token. That
catch-up is paid once and serves every later round of the request, so a step is charged
the share of it that one round is of the rounds the request has left at that K
(E_i(K) / tokens left); charging it whole to one round would keep a slot that stopped
speculating under load from ever starting again.

With linear costs the step's cost is a + b * rows + c0 * D + c_row * sum K (plus the
catch-up shares), so for a given ratio lambda the numerator minus lambda times the cost
separates per slot once D is fixed: `choose` solves the ratio exactly by Dinkelbach's
method over D, all D at once in numpy (the server calls it every step).

Pure: numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specgen.control.costs import Line


def expected_gains(alpha_by_pos: Sequence[float], k_max: int) -> np.ndarray:
    """Expected tokens emitted by one round, for every block size K = 0..k_max at once.

    E(K) = 1 + sum_{i=1..K} prod_{j<=i} alpha_j: the accepted prefix plus the one token the
    target always adds (the residual draw after a rejection, or the bonus token). With a
    constant alpha this is Leviathan et al. 2023, eq. (1): (1 - alpha^(K+1)) / (1 - alpha).

    Args:
        alpha_by_pos: alpha_1, alpha_2, ...: probability that position i is accepted given
            positions 1..i-1 were (to account for a drafter that may stop early, pass
            s_i * alpha_i, the probability it is drafted *and* accepted). Shorter than
            k_max: the last value repeats. Empty: alpha = 0. Clipped to [0, 1].
        k_max: the largest block size (< 0 counts as 0).

    Returns:
        (k_max + 1,) float64, E(0) = 1 <= E(K) <= K + 1, non-decreasing in K.
    """
    k_max = max(0, k_max)
    a = np.clip(np.asarray(alpha_by_pos, dtype=np.float64)[:k_max], 0.0, 1.0)
    if a.size == 0:
        a = np.zeros(k_max)
    elif a.size < k_max:
        a = np.concatenate([a, np.full(k_max - a.size, a[-1])])
    return np.concatenate([[1.0], 1.0 + np.cumsum(np.cumprod(a))])


def expected_tokens(alpha_by_pos: Sequence[float], k: int) -> float:
    """Expected tokens emitted by one round with block size k (>= 0): `expected_gains`'s
    E(k), in [1, k + 1]."""
    return float(expected_gains(alpha_by_pos, k)[-1])


def break_even_alpha(
    k: int, draft_token_s: float, verify_s: float, ordinary_token_s: float
) -> float:
    """The constant acceptance rate below which block size k is slower than ordinary decoding.

    Speculation with block k pays when E(alpha, k) / (k * draft_token_s + verify_s) >
    1 / ordinary_token_s (E from `expected_tokens`), i.e. E(alpha, k) > c with
    c = (k * draft_token_s + verify_s) / ordinary_token_s. E rises from 1 at alpha = 0 to
    k + 1 at alpha = 1, so the root is found by bisection.

    Args:
        k: block size (>= 1).
        draft_token_s: seconds to draft one token.
        verify_s: seconds for the target to score the k + 1 tokens [last, x_1..x_k].
        ordinary_token_s: seconds of one ordinary decoding pass (one token).

    Returns:
        alpha in [0, 1]; 0.0 when speculation pays at any alpha (c <= 1), 1.0 when it
        cannot pay even at alpha = 1 (c >= k + 1).
    """
    c = (k * draft_token_s + verify_s) / ordinary_token_s
    if c <= 1.0:
        return 0.0
    if c >= k + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):  # 2^-60: far below any timing noise
        mid = 0.5 * (lo + hi)
        if expected_tokens([mid], k) < c:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class SlotInput:
    """One active slot as the controller sees it.

    Attributes:
        alpha_by_pos: alpha_1, alpha_2, ...: estimated probability that block position i
            is accepted given 1..i-1 were (the last value repeats; empty = 0).
        k_max: largest K allowed (room left, -n, --draft-max; 0 = no drafter).
        catch_up: committed tokens the draft cache lacks beyond the one every first depth
            evaluates (0 when it is up to date); drafting first evaluates them.
        left: tokens the request may still emit (its share of the catch-up is E(K) / left
            per round); 0 = unknown: the whole catch-up is charged to this round.
        free: block positions a prompt-lookup match proposes (`HybridDrafter`): K <= free
            costs rows only, no draft decode; beyond, the model drafts K - free tokens,
            its first decode evaluating the free ones too (and any catch-up).
        run_rounds: speculative rounds a run of them lasts on average (learned:
            `BatchController.observe_run`); a catch-up serves no more rounds than that,
            so at least 1 / run_rounds of it is charged to one (0 = not known).
    """

    alpha_by_pos: tuple[float, ...]
    k_max: int
    catch_up: int = 0
    left: int = 0
    free: int = 0
    run_rounds: float = 0.0


@dataclass(frozen=True)
class Choice:
    """What `choose` decided for one step.

    Attributes:
        k: K per slot, in the order given.
        expected_tokens: sum of the slots' expected tokens at those K.
        step_s: predicted seconds of the step, catch-ups by their share (see the module).
        goodput: expected_tokens / step_s, tokens per second.
        goodput_ordinary: the same with K = 0 for every slot.
        reasons: why each slot got its K (`REASONS`); () where nobody said.
    """

    k: tuple[int, ...]
    expected_tokens: float
    step_s: float
    goodput: float
    goodput_ordinary: float
    reasons: tuple[str, ...] = ()


#: why a slot's K is what it is, in the per-request `speculative.k_reason_per_step` and
#: /metrics' `specgen_k_reason_total`: the batch's goodput alone ("goodput"); shortened for
#: the requests waiting behind the step ("waiting") or to keep a latency target
#: ("slo_ttft", "slo_tpot"); a K = 1 probe ("probe"); a request's first rounds while
#: little is known of its acceptance ("warm_up"); and, from the scheduler, a fixed
#: --draft-max ("fixed"), a request's first round, ordinary ("first"), a step spent on a
#: chunk of the draft's catch-up ("catch_up"), a block cut short by an arrival ("cut"),
#: a hybrid's block held to its prompt-lookup tokens before the draft's prefill
#: ("lookup_first", `specgen.sched.step.LOOKUP_FIRST`)
REASONS = (
    "goodput", "waiting", "slo_ttft", "slo_tpot", "probe", "warm_up", "fixed", "first",
    "catch_up", "cut", "lookup_first",
)  # fmt: skip


def _catch_up_share(slot: SlotInput, gains: np.ndarray) -> np.ndarray:
    """(K + 1,) the fraction of the slot's catch-up charged to one round at each K: one
    over the rounds it serves, those left in the request at that K (E(K) / tokens left)
    or, when fewer, those a run of speculative rounds lasts (`SlotInput.run_rounds`)."""
    share = np.ones_like(gains)
    if slot.left > 0:
        share = np.minimum(1.0, gains / slot.left)
    if slot.run_rounds > 0:
        share = np.maximum(share, min(1.0, 1.0 / slot.run_rounds))
    share[0] = 0.0  # K = 0 drafts nothing
    return share if slot.catch_up > 0 else np.zeros_like(gains)


def step_seconds(
    ks: Sequence[int],
    target: Line,
    draft: Line,
    fixed_s: float = 0.0,
    slots: Sequence[SlotInput] = (),
    spec_s: float = 0.0,
    token_s: float | None = None,
) -> float:
    """Predicted seconds of a step whose slots use block sizes `ks` (bonus rows scored);
    with `slots`, each drafting slot's catch-up by its share and its free positions (see
    `SlotInput`), `token_s` seconds a token (the draft line's slope when None); `spec_s`
    more when any K >= 1 (see `choose`)."""
    tok = draft.slope_s if token_s is None else token_s
    rows = sum(k + 1 for k in ks)
    free = [s.free for s in slots] + [0] * (len(ks) - len(slots))
    model = [max(0, k - f) for k, f in zip(ks, free, strict=True)]  # tokens the model drafts
    depth = max(model, default=0)
    drafting = sum(draft(sum(1 for m in model if m >= j)) for j in range(1, depth + 1))
    for s, k, m in zip(slots, ks, model, strict=False):
        if m > 0:
            share = _catch_up_share(s, expected_gains(s.alpha_by_pos, k))[k]
            drafting += tok * (s.catch_up * share + s.free)
    return target(rows) + drafting + fixed_s + (spec_s if any(ks) else 0.0)


def choose(
    slots: Sequence[SlotInput],
    target: Line,
    draft: Line,
    fixed_s: float = 0.0,
    spec_s: float = 0.0,
    token_s: float | None = None,
    weight: float = 1.0,
) -> Choice:
    """The K per slot that maximizes predicted goodput for one step (exact for linear
    costs; ties go to the smaller K).

    Args:
        slots: the active slots.
        target: seconds of one target decode as a function of its rows.
        draft: seconds of one draft decode as a function of its tokens (one per slot
            drafting a depth).
        fixed_s: seconds the step costs whatever K is (host work, prompt chunks).
        spec_s: seconds a step costs more when any slot speculates, beyond its rows and
            depths (host work the lines leave out: `BatchController.observe_step`). A
            constant for every depth D >= 1, so the search over D stays exact.
        token_s: seconds of a token the draft evaluates without a logits row (a catch-up,
            free positions: `DraftFit`); the draft line's slope when None.
        weight: what each second speculation adds to the step counts for, against the
            seconds of the ordinary step (1 + the requests waiting behind the step:
            `BatchController.choose`); still linear, so the solution stays exact.
            `Choice.step_s` and `goodput` are the unweighted figures.

    Returns:
        The Choice; k is () for no slots.
    """
    if not slots:
        return Choice((), 0.0, 0.0, 0.0, 0.0)
    n, m = len(slots), max(max(0, s.k_max) for s in slots)
    gains = np.full((n, m + 1), -np.inf)  # -inf beyond a slot's k_max: never chosen
    ks_all = np.arange(m + 1)
    free = np.array([max(0, s.free) for s in slots], dtype=np.int64)
    model = np.maximum(ks_all[None, :] - free[:, None], 0)  # (n, m + 1) tokens the model drafts
    # each K's own seconds beyond the rows: its model tokens, and where the model runs at
    # all, the free tokens its first decode evaluates and the catch-up's share
    tok = draft.slope_s if token_s is None else token_s
    own = draft.slope_s * model
    for i, s in enumerate(slots):
        g = expected_gains(s.alpha_by_pos, s.k_max)
        gains[i, : g.size] = g
        runs = model[i, : g.size] > 0
        own[i, : g.size] += runs * tok * (s.catch_up * _catch_up_share(s, g) + s.free)
    own += target.slope_s * ks_all  # each proposal: one more row
    base = target.intercept_s + target.slope_s * n + fixed_s  # every slot's one row
    rows_i = np.arange(n)

    def value(ks: np.ndarray, w: float = weight) -> tuple[np.ndarray, np.ndarray]:
        """tokens and (weighted) seconds of K vectors: ks (..., n) -> arrays (...)."""
        tokens = gains[rows_i, ks].sum(axis=-1)
        seconds = base + w * (
            own[rows_i, ks].sum(axis=-1)
            + draft.intercept_s * model[rows_i, ks].max(axis=-1)
            + spec_s * (ks.max(axis=-1) > 0)
        )
        return tokens, seconds

    zero = np.zeros(n, dtype=np.int64)
    n0, c0 = value(zero)
    best, best_n, best_c = zero, float(n0), float(c0)
    for _ in range(64):  # Dinkelbach: finitely many K vectors, strictly rising ratio
        lam = best_n / best_c if best_c > 0 else 0.0
        obj = gains - lam * weight * own
        # for every depth D at once: each slot's best K <= D + free (the first of equal
        # ones), the index of the last strict new maximum of obj[:, :D + free + 1]
        run = np.maximum.accumulate(obj, axis=1)
        new = np.ones_like(obj, dtype=bool)
        new[:, 1:] = obj[:, 1:] > run[:, :-1]
        best_upto = np.maximum.accumulate(np.where(new, ks_all, 0), axis=1)  # (n, m + 1)
        reach = np.minimum(ks_all[:, None] + free[None, :], m)  # (D, n)
        cand = best_upto[rows_i[None, :], reach]  # (D, n)
        t, c = value(cand)
        score = t - lam * c
        d = int(np.argmax(score))  # the smallest D among equals
        if score[d] <= best_n - lam * best_c + 1e-12 or np.array_equal(cand[d], best):
            break
        best = cand[d]
        best_n, best_c = float(t[d]), float(c[d])
    best_c = float(value(best, 1.0)[1])
    return Choice(
        tuple(int(k) for k in best),
        best_n,
        best_c,
        best_n / best_c if best_c > 0 else 0.0,
        float(n0 / c0) if c0 > 0 else 0.0,
    )
