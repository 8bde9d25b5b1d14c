"""The speculative decoding loop, as five named stages, yielding typed events.

Invariant before every round (kept by `rollback`, restored in `finally`):
    the target's cache holds exactly the committed tokens except the last one, `last`,
    which is committed but not yet evaluated; a model drafter's cache holds a prefix of
    that (it catches up lazily at the start of `draft_block`).

One round: (1) `draft_block`: K proposals x_1..x_K with their q rows; (2) `score_block`:
one target decode of [last, x_1..x_K] with K+1 output rows; (3) `accept_prefix`: the
longest accepted prefix, n; (4) `next_token`: a residual draw at position n+1, or the
bonus token from p_{K+1} when n = K; (5) `rollback`: the target drops x_{n+1}..x_K.
K = 0 is a plain ordinary-decoding pass through the same code.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, Protocol

import numpy as np

from specgen import rejection
from specgen.drafters import common_prefix
from specgen.emit import Emitter
from specgen.engine import Block, Drafter, Engine, Logits
from specgen.errors import PromptError
from specgen.events import Done, Prefilled, RoundTrace, Span, Stats, Step
from specgen.sampling import Dists, SamplingParams, warp_rows

Event = Prefilled | Step | Done
VerifyRule = Literal["token", "block"]
VERIFY_RULES: tuple[VerifyRule, ...] = ("token", "block")


class KPolicy(Protocol):
    """Chooses the block size each round (see `specgen.controller.Controller`)."""

    def choose_k(self, remaining: int) -> int: ...

    def bonus(self) -> bool:
        """Whether the round just chosen scores the bonus position too (K + 1 rows).
        False for a round that only tests proposals (a probe): the target then scores K
        rows, as many as an ordinary pass when K = 1, and the round emits no bonus token.
        """
        ...

    def observe(
        self,
        k: int,
        n_accepted: int,
        draft_s: float,
        verify_s: float,
        n_drafted: int,
        catchup_s: float = 0.0,
        n_lookup: int = 0,
    ) -> None: ...

    def observe_draft_pass(self, draft_s: float) -> None:
        """A single-token draft pass timed after the prompt, or when `retime_draft` asked."""
        ...

    def retime_draft(self) -> bool:
        """Whether to time one draft pass (rolled back) in the K = 0 round just chosen."""
        ...


@dataclass(frozen=True)
class FixedK:
    """Always K (capped by what is left): `--draft-max K`."""

    k: int

    def choose_k(self, remaining: int) -> int:
        return max(0, min(self.k, remaining))

    def bonus(self) -> bool:
        return True

    def observe(self, *args: object, **kwargs: object) -> None:
        pass

    def observe_draft_pass(self, draft_s: float) -> None:
        pass

    def retime_draft(self) -> bool:
        return False


@dataclass(frozen=True)
class GenerateConfig:
    """Settings of one generation.

    Attributes:
        max_tokens: `-n`, tokens to emit at most.
        params: sampling settings for both p and q.
        stop: stop strings (cut exactly).
        ignore_eos: do not stop at end-of-generation tokens.
        seed: seeds both random streams (draft sampling, acceptance); None = random.
        measure_ordinary: single-token target passes timed after the prompt to measure the
            ordinary-decoding baseline (0 = skip); each is rolled back. With an adaptive
            policy (not FixedK) and a model drafter, as many draft passes are timed too.
        trace: attach a `RoundTrace` to every Step (`--trace`).
        reuse_cache: keep the target's cached common prefix with the prompt (a chat's
            earlier turns) instead of evaluating the whole prompt again. Off by default so
            that measurements (bench, verify) always pay a full prefill.
        verify_rule: `--verify`: "token" (token-wise rejection, Leviathan et al.) or
            "block" (block verification, Sun et al. 2025); both are exact.
    """

    max_tokens: int = 256
    params: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    measure_ordinary: int = 0
    trace: bool = False
    reuse_cache: bool = False
    verify_rule: VerifyRule = "token"


@dataclass
class Verified:
    """Target side of a round: p rows (or their argmax when greedy)."""

    p: Dists | None  # k+1 rows (k without the bonus row), None when greedy
    argmax: np.ndarray | None  # (k+1,) int64 when greedy


# -- the five stages --------------------------------------------------------------------


def draft_block(
    drafter: Drafter | None, context: list[int], k: int, rng: np.random.Generator
) -> Block:
    """Stage 1: up to k proposals after `context` with their q rows (empty when k = 0)."""
    if drafter is None or k == 0:
        return Block(tokens=np.zeros(0, dtype=np.int64), q=Dists.empty(0))
    return drafter.draft(context, k, rng)


def score_block(target: Engine, last: int, block: Block, bonus: bool = True) -> Logits:
    """Stage 2: one batched target decode of [last, x_1..x_K], or of [last, x_1..x_{K-1}]
    without the bonus position.

    Returns (K+1, n_vocab) float32 logits (K rows without the bonus): row i scores the
    token after x_i (row 0 the token after `last`). A view into llama.cpp's buffer, valid
    until the next decode.
    """
    x = block.tokens.tolist()
    if not bonus and x:
        x = x[:-1]  # no row after x_K: the round ends at x_K if all are accepted
    return target.decode([last, *x], all_logits=True)


def target_distributions(logits: Logits, params: SamplingParams) -> Verified:
    """p rows under the same warpers as q, all rows in one call; greedy keeps only the
    argmax per row."""
    if params.greedy:
        return Verified(p=None, argmax=np.argmax(logits, axis=1))
    return Verified(p=warp_rows(logits, params), argmax=None)


def accept_prefix(block: Block, v: Verified, u: np.ndarray) -> int:
    """Stage 3: n, the accepted prefix length (Leviathan et al. 2023, Algorithm 1)."""
    if v.argmax is not None:
        return rejection.accept_greedy(block.tokens, v.argmax)
    assert v.p is not None
    return rejection.accept(block.tokens, block.q, v.p, u)


def next_token(n: int, block: Block, v: Verified, rng: np.random.Generator) -> int | None:
    """Stage 4: residual draw at the first rejection, or the bonus token after a full accept.

    None after a full accept of a block scored without its bonus row (`score_block` with
    bonus=False): the round then emits x_1..x_K only. The output law is unchanged: each
    position is an accepted x_i or a residual draw, distributed as p (Leviathan et al.
    2023, Theorem 3.5), and whether the bonus row is scored is decided before the round,
    from nothing the round produces; the bonus token is a free extra draw from p.
    """
    rows = v.argmax.shape[0] if v.argmax is not None else len(v.p)  # type: ignore[arg-type]
    if n >= rows:
        return None
    if v.argmax is not None:
        # one-hot p minus one-hot q at a rejected position leaves p: the argmax
        return int(v.argmax[n])
    assert v.p is not None
    return rejection.correct(n, block.q, v.p, rng)


class Verdict(NamedTuple):
    """Stages 3-4's outcome: n accepted, the token after them (None: see `next_token`),
    the (K,) float64 uniforms drawn (u, or block verification's eta) and h_1..h_K
    (block verification only, else empty)."""

    n: int
    x_next: int | None
    u: np.ndarray
    h: np.ndarray


def verify_block(
    block: Block, v: Verified, rng: np.random.Generator, rule: VerifyRule = "token"
) -> Verdict:
    """Stages 3-4 under `rule`: K uniforms then one draw for the correction, from `rng`.

    "block" is block verification (`rejection.block_weights`, Sun et al. 2025), used
    where it can differ from token-wise: a sampled p (greedy rows are one-hot, where the
    two rules coincide exactly) and K >= 2 (at K = 1 they coincide exactly). A round
    without its bonus row stays exact under either rule (see `rejection`'s proof sketch:
    the bonus is one more independent draw from p_{K+1}, which the next round makes).
    """
    u = rng.random(block.tokens.size)
    if rule == "block" and v.p is not None and block.tokens.size > 1:
        big_p, h = rejection.block_weights(block.tokens, block.q, v.p)
        n = rejection.last_passing(u, h)
        return Verdict(n, rejection.block_correct(n, float(big_p[n]), block.q, v.p, rng), u, h)
    n = accept_prefix(block, v, u)
    return Verdict(n, next_token(n, block, v, rng), u, np.zeros(0))


def rollback(target: Engine, drafter: Drafter | None, committed: list[int]) -> None:
    """Stage 5: both caches back to the committed tokens except the last."""
    target.truncate(len(committed) - 1)
    if drafter is not None:
        drafter.rollback(committed)


def _trace(target, drafter, committed, new, block, logits, v, verdict, rule) -> RoundTrace:
    """Build the round's RoundTrace (after rollback; `logits` is still this round's)."""
    n, x_next, u = verdict.n, verdict.x_next, verdict.u
    x = block.tokens.tolist()
    k = len(x)
    row = min(n, logits.shape[0] - 1)  # no bonus row: show the last scored position
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
    top: tuple[tuple[int, float], ...] = ()
    if x_next is not None:
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
        next_kind=(
            "none"
            if x_next is None
            else "ordinary"
            if k == 0
            else ("bonus" if n == k else "residual")
        ),
        top=top,
        target_cache=len(target.tokens),
        draft_cache=drafter.cached_tokens if drafter is not None else -1,
        verify_rule=rule,
        sources=tuple(block.source(i) for i in range(k)),
        h=tuple(float(a) for a in verdict.h),
    )


# -- the loop ---------------------------------------------------------------------------


def _decode_s(engine: object) -> float:
    """Seconds `engine` has spent inside llama_decode so far (0 for engines that do not
    count it, such as test fakes and model-free drafters)."""
    return float(getattr(engine, "decode_s", 0.0))


def prefill(target: Engine, drafter: Drafter | None, prompt: list[int], reuse: bool = False) -> int:
    """Evaluate the prompt except its last token in the target (and the draft).

    With `reuse`, what the target's cache already holds of the prompt stays: the longest
    common prefix of the cached tokens and the prompt is kept and only the rest evaluated
    (a chat's next turn re-sends the whole conversation). A model drafter always keeps its
    own common prefix the same way.

    Returns:
        The number of prompt tokens the target evaluated (0 when all but the last were
        cached).
    """
    keep = common_prefix(target.tokens, prompt[:-1]) if reuse else 0
    target.truncate(keep)
    if len(prompt) - 1 > keep:
        target.decode(prompt[keep:-1])
    if drafter is not None:
        drafter.prefill(prompt)
    return len(prompt) - 1 - keep


def measure_ordinary_pass(target: Engine, last: int, n: int) -> float | None:
    """Median seconds of n single-token target passes of `last`, each rolled back."""
    if n <= 0:
        return None
    base = len(target.tokens)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        target.decode([last])
        times.append(time.perf_counter() - t0)
        target.truncate(base)
    return statistics.median(times)


def time_draft_pass(policy: KPolicy, draft: Engine, last: int, n: int) -> float | None:
    """Report to the policy the median of n single-token draft passes of `last`, each
    rolled back, made where the draft's cache stands (no catching up: only the cost
    matters); returns it (None when not measured)."""
    if len(draft.tokens) >= draft.n_ctx:
        return None
    seconds = measure_ordinary_pass(draft, last, n)
    if seconds is not None:
        policy.observe_draft_pass(seconds)
    return seconds


def check_prompt(prompt: list[int], n_ctx: int) -> None:
    """Raises PromptError for an empty prompt or one that leaves no room to generate."""
    if not prompt:
        raise PromptError("the prompt is empty")
    if len(prompt) >= n_ctx:
        raise PromptError(
            f"the prompt is {len(prompt)} tokens but the context holds {n_ctx}:"
            " shorten it or raise -c"
        )


def generate(
    target: Engine,
    drafter: Drafter | None,
    prompt: list[int],
    config: GenerateConfig,
    policy: KPolicy | None = None,
) -> Iterator[Event]:
    """Generate from `prompt` (token ids), yielding Prefilled, then a Step per round,
    then Done. With `drafter=None` (or K = 0) this is ordinary decoding.

    On every exit (limit, stop, EOS, Ctrl-C, exception, the consumer closing the
    generator) both caches are left holding the committed tokens except the last.

    Raises:
        PromptError: empty prompt, or no room in the context.
        EngineError: llama.cpp failed.
        KeyboardInterrupt: Ctrl-C during the generation, raised on the next iteration
            after the Done with finish reason "interrupted" (the text so far).
    """
    check_prompt(prompt, target.n_ctx)
    params = config.params
    policy = policy or FixedK(0)
    draft_rng, target_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(config.seed).spawn(2)
    )
    emitter = Emitter(
        target.token_bytes, target.is_eog, config.stop, config.ignore_eos, config.max_tokens
    )
    stats = Stats(n_prompt=len(prompt), verify_rule=config.verify_rule)
    committed = list(prompt)
    draft_engine = getattr(drafter, "engine", None)  # a model drafter's, to time its passes
    t_start = time.perf_counter()
    t_decode = t_start
    try:
        stats.n_prefill = prefill(target, drafter, prompt, config.reuse_cache)
        stats.prefill_s = time.perf_counter() - t_start
        ordinary_s = measure_ordinary_pass(target, committed[-1], config.measure_ordinary)
        draft_pass_s = None
        if ordinary_s is not None:
            # the baseline the policy must beat, measured after a warm-up pass, instead
            # of one noisy first round
            policy.observe(0, 0, 0.0, ordinary_s, 0)
            # and the draft's cost, so a draft slower than its target costs no round
            if draft_engine is not None and not isinstance(policy, FixedK):
                n = config.measure_ordinary
                draft_pass_s = time_draft_pass(policy, draft_engine, committed[-1], n)
        yield Prefilled(len(prompt), stats.prefill_s, ordinary_s, draft_pass_s)
        t_decode = time.perf_counter()
        while emitter.finish is None:
            room = target.n_ctx - len(committed)  # target will hold len-1 + 1 + K tokens
            if room < 0 or emitter.remaining <= 0:
                # -n reached, or the context is full: said apart, as the fix differs
                emitter.close("length" if emitter.remaining <= 0 else "context")
                break
            t_round = time.perf_counter()
            inside0 = _decode_s(target), _decode_s(draft_engine)
            # a round emits up to K+1 tokens: never draft past -n or the context
            k = policy.choose_k(min(emitter.remaining - 1, room)) if drafter else 0
            bonus = k == 0 or policy.bonus()
            if k == 0 and draft_engine is not None and policy.retime_draft():
                # a draft too slow to use: its cost, counted as this round's drafting time
                time_draft_pass(policy, draft_engine, committed[-1], 1)
            block = draft_block(drafter, committed, k, draft_rng)
            t1 = time.perf_counter()
            inside1 = _decode_s(target), _decode_s(draft_engine)
            logits = score_block(target, committed[-1], block, bonus)
            t2 = time.perf_counter()
            v = target_distributions(logits, params)
            verdict = verify_block(block, v, target_rng, config.verify_rule)
            n, x_next = verdict.n, verdict.x_next
            t3 = time.perf_counter()

            new = block.tokens[:n].tolist() + ([] if x_next is None else [x_next])
            spans: list[Span] = []
            for i, tok in enumerate(new):
                source = block.source(i) if i < n else "target"
                span = emitter.push(tok, from_draft=i < n, source=source)
                if span is not None:
                    spans.append(span)
                if emitter.finish is not None:
                    del new[i + 1 :]  # nothing after EOS, a stop string or -n is kept
                    break
            committed.extend(new)
            rollback(target, drafter, committed)
            # Count proposals only up to the last token that mattered: the rejected
            # x_{n+1} counts once its correction token was reached.
            n_drafted = min(int(block.tokens.size), len(new))
            n_acc = min(n, len(new))
            by_drafted: dict[str, int] = {}  # by proposer, as n_drafted and n_acc count
            by_accepted: dict[str, int] = {}
            for i in range(n_drafted):
                src = block.source(i)
                by_drafted[src] = by_drafted.get(src, 0) + 1
                if i < n_acc:
                    by_accepted[src] = by_accepted.get(src, 0) + 1
            now = time.perf_counter()
            # the controller's verify cost is the whole rest of the round: all of it grows
            # with the block; catching up after ordinary rounds is a cost of the probe,
            # not of drafting each token, so it is passed apart
            policy.observe(
                k,
                n,
                t1 - t_round - block.catchup_s,
                now - t1,
                int(block.tokens.size),
                catchup_s=block.catchup_s,
                n_lookup=block.sources.count("lookup"),
            )
            t_end = time.perf_counter()
            # host time: the round's wall time outside llama_decode (both models)
            draft_host_s = (t1 - t_round) - (sum(inside1) - sum(inside0))
            host_s = (t_end - t_round) - (
                _decode_s(target) + _decode_s(draft_engine) - sum(inside0)
            )
            rejected = None
            if n < block.tokens.size and n < len(new):
                rejected = target.token_bytes(int(block.tokens[n])).decode("utf-8", "replace")
            step = Step(
                k=k,
                n_proposed=int(block.tokens.size),
                n_drafted=n_drafted,
                n_accepted=n_acc,
                spans=tuple(spans),
                rejected_text=rejected,
                draft_s=t1 - t_round,
                verify_s=t2 - t1,
                sample_s=t3 - t2,
                round_s=t_end - t_round,
                host_s=host_s,
                draft_host_s=draft_host_s,
                n_rows=int(logits.shape[0]),
                n_drafted_by=by_drafted,
                n_accepted_by=by_accepted,
                trace=_trace(
                    target, drafter, committed, new, block, logits, v, verdict, config.verify_rule
                )
                if config.trace
                else None,
            )
            stats.add(step, decode_s=t_end - t_decode)
            # an end-of-generation token's span (holding the text it flushed) is no token
            stats.n_generated = len(emitter.tokens)
            yield step
    except KeyboardInterrupt:
        emitter.close("interrupted")
    finally:
        # Leave both caches consistent whatever happened (invariant above).
        rollback(target, drafter, committed)
    stats.n_generated = len(emitter.tokens)
    assert emitter.finish is not None
    yield Done(emitter.finish, emitter.text, tuple(emitter.tokens), stats)
    if emitter.finish == "interrupted":
        # Ctrl-C is never swallowed: the consumer gets the partial Done (`run` shows the
        # text), then the interrupt itself, so a caller looping over generations (bench,
        # verify) stops instead of carrying on with the next one.
        raise KeyboardInterrupt
