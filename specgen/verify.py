"""`specgen verify`: prove on the user's own pair that speculation leaves the target's output
unchanged. Returns data; never prints (the CLI renders it).

Two checks (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding", Theorem 1 / Appendix A.1; Chen et al. 2023, Theorem 1):

**Greedy** (temperature 0). Speculative output must equal ordinary output token for token.
For each prompt and block size K the first divergence, if any, is examined: the target is
re-run on the ordinary prefix one token at a time (the ordinary arithmetic) and on the
speculative round's batch (the verification arithmetic). With l the single-token logits at
that position, the divergence is *numeric noise* when the gap l[ordinary] - l[speculative]
is below ``max(noise_gap, 2 * drift)`` logits, where ``drift`` = max |l_batched - l_single|
over the row: a gap that small can be reversed by batched-versus-single arithmetic
(|Δ(l_a - l_b)| <= 2 max|Δl|). Any other divergence fails. Measured drift: ≈0.016 logits
for the F32 demo target, ≈1 logit for a Q4_K_M model (its batched kernels differ).

**Sampling**. N independent speculative generations of m tokens (fixed K, ``ignore_eos``)
per prompt. The law of token j given the prompt and the generated prefix x_<j is known in
closed form from one target pass: p(. | prompt, x_<j) = warp(logits). For each prompt and
position j the samples are grouped by prefix x_<j; each group with at least ``min_group``
samples gets a Pearson chi-square goodness-of-fit statistic against that exact p (cells with
expected count < 5 pooled), and the statistics and degrees of freedom of the groups are
summed (independent given the group sizes): one test per (prompt, position). This is
stronger than comparing with ordinary samples, which would add the ordinary sampler's own
noise; the reference is exactly what ordinary sampling draws from. The p-values are
Holm-corrected across all tests; the check fails when any corrected p-value is below
``alpha``.

Power: a broken rule moves probability only through the proposals it mishandles, so it
shows most at intermediate acceptance. On the tiny test pair (alpha ~0.67) 2,000 samples per
prompt give every broken rule in the test suite a Holm-adjusted p-value below 1e-6, while
400 do not always suffice; on the demo pair (alpha ~0.96 at temperature 1) a rule that only
errs on rejections acts on ~4% of proposals, and the report says so.

Samples are cheap because the evaluated prompt is kept between samples (`_PromptCache`)
and the draft's cache realigns itself: a sample costs K draft passes and about one batched
target pass per round.
"""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from specgen.constraints import Chain, Processor, processor_for
from specgen.drafters import common_prefix
from specgen.engine import Drafter, Engine, Logits
from specgen.errors import ConfigError
from specgen.events import Done, RoundTrace, Step
from specgen.generate import FixedK, GenerateConfig, VerifyRule, generate
from specgen.sampling import SamplingParams, warp

if TYPE_CHECKING:
    from specgen.grammarspec import GrammarSpec

__all__ = [
    "DEFAULT_SAMPLING_PARAMS",
    "GREEDY_PROMPTS",
    "SAMPLING_PROMPTS",
    "ChiSquareTest",
    "DrafterFactory",
    "GreedyCase",
    "SamplingResult",
    "VerifyConfig",
    "VerifyReport",
    "check_greedy",
    "check_sampling",
    "chi2_sf",
    "holm",
    "pooled_chisquare",
    "verify",
]

Progress = Callable[[str], None]
DrafterFactory = Callable[[SamplingParams], Drafter]
"""Builds the drafter for a given sampling setting (a model drafter samples with it)."""

GREEDY = SamplingParams(temp=0.0)
DEFAULT_SAMPLING_PARAMS = SamplingParams(temp=1.0, top_k=40, top_p=1.0, min_p=0.0)
"""High temperature and top-k only: wide support, so a wrong rule has room to show."""

GREEDY_PROMPTS: tuple[bytes, ...] = (
    b"The history of the Roman Empire begins",
    b"def fibonacci(n):\n",
    b"Once upon a time, in a small village,",
)
SAMPLING_PROMPTS: tuple[bytes, ...] = (
    b"My favourite colour is",
    b"The weather today is",
)
HIGH_ACCEPTANCE = 0.9
"""Above this acceptance rate the report notes that residual bugs are hard to see."""
NOISE_GAP_LOGITS = 0.05
"""Floor of the near-tie threshold, in logits (see the module docstring)."""


@dataclass(frozen=True)
class VerifyConfig:
    """What `verify` runs.

    Attributes:
        samples: N, speculative generations per sampling prompt.
        positions: m, generated tokens checked per sample (positions 1..m).
        k: block size of the sampling check (the loop caps it at m - 1, so the first
            block spans positions 1..K and the bonus token lands at K + 1).
        params: sampling settings of the sampling check.
        seed: fixes every random stream (sample i uses a seed derived from it).
        alpha: family-wise significance level after the Holm correction.
        min_group: smallest prefix group tested at positions >= 2.
        greedy_ks: block sizes of the greedy check.
        greedy_tokens: tokens generated per greedy case.
        noise_gap: floor of the greedy near-tie threshold, logits.
        greedy_prompts, sampling_prompts: UTF-8 prompts.
        greedy, sampling: run that check.
        verify_rule: the acceptance rule both checks run under (`--verify`).
        grammar: what the output must match (--grammar, --json-schema...), or None. Both
            checks then run under it: greedy speculative output must equal ordinary
            constrained decoding, and the sampling check's exact law at each position is
            the grammar's mask then the warpers (`specgen.grammar`).
    """

    samples: int = 400
    positions: int = 3
    k: int = 3
    params: SamplingParams = DEFAULT_SAMPLING_PARAMS
    seed: int = 0
    alpha: float = 1e-3
    min_group: int = 20
    greedy_ks: tuple[int, ...] = (4, 8)
    greedy_tokens: int = 48
    noise_gap: float = NOISE_GAP_LOGITS
    greedy_prompts: tuple[bytes, ...] = GREEDY_PROMPTS
    sampling_prompts: tuple[bytes, ...] = SAMPLING_PROMPTS
    greedy: bool = True
    sampling: bool = True
    verify_rule: VerifyRule = "token"
    grammar: GrammarSpec | None = None

    def __post_init__(self) -> None:
        if self.sampling:
            if self.samples < 20:
                raise ConfigError(f"--samples must be at least 20, got {self.samples}")
            if self.positions < 1:
                raise ConfigError(f"--positions must be at least 1, got {self.positions}")
            if self.k < 1:
                raise ConfigError(f"--draft-max must be at least 1, got {self.k}")
            if self.params.greedy:
                raise ConfigError("the sampling check needs --temp > 0")
        if not 0.0 < self.alpha < 1.0:
            raise ConfigError(f"--alpha must be in (0, 1), got {self.alpha}")
        if not (self.greedy or self.sampling):
            raise ConfigError("nothing to verify: both checks are off")


@dataclass(frozen=True)
class GreedyCase:
    """One greedy comparison (prompt x K).

    Attributes:
        prompt_index: index into the greedy prompts; prompt: its text.
        k: block size.
        n_tokens: tokens compared.
        status: "match", "noise" (near-tie divergence) or "fail".
        position: first differing generated position (0-based), None when equal.
        ordinary_token, speculative_token: the tokens there (None when equal).
        gap_top2: target's top-1 minus top-2 logit at that position (single-token pass).
        gap: l[ordinary] - l[speculative] (single-token pass), logits.
        drift: max |batched - single| logits over that row.
        threshold: max(noise_gap, 2 * drift): gaps below it are noise.
        seconds: wall time of this case.
    """

    prompt_index: int
    prompt: str
    k: int
    n_tokens: int
    status: str
    position: int | None = None
    ordinary_token: int | None = None
    speculative_token: int | None = None
    gap_top2: float | None = None
    gap: float | None = None
    drift: float | None = None
    threshold: float | None = None
    seconds: float = 0.0


@dataclass(frozen=True)
class ChiSquareTest:
    """One (prompt, position) goodness-of-fit test.

    Attributes:
        prompt_index: index into the sampling prompts.
        position: generated position j (1-based).
        n_samples: samples in the tested prefix groups (all N at position 1).
        n_groups: prefix groups tested (1 at position 1).
        dof: degrees of freedom (sum over groups).
        chi2: Pearson statistic (sum over groups).
        p_value: chi-square survival at (chi2, dof); p_adjusted: after Holm.
        n_outside: samples on tokens the reference gives probability 0 (pooled; should
            be 0 up to top-k boundary ties).
    """

    prompt_index: int
    position: int
    n_samples: int
    n_groups: int
    dof: int
    chi2: float
    p_value: float
    p_adjusted: float = 1.0
    n_outside: int = 0


@dataclass(frozen=True)
class SamplingResult:
    """The sampling check.

    Attributes:
        tests: one per (prompt, position) with at least one testable group.
        samples, positions, k, params, seed, alpha: the settings used.
        passed: every Holm-adjusted p-value >= alpha.
        acceptance_rate: accepted / drafted over all samples.
        seconds: wall time (sampling plus reference passes).
    """

    tests: tuple[ChiSquareTest, ...]
    samples: int
    positions: int
    k: int
    params: SamplingParams
    seed: int
    alpha: float
    passed: bool
    acceptance_rate: float
    seconds: float

    @property
    def min_p_adjusted(self) -> float:
        return min((t.p_adjusted for t in self.tests), default=1.0)


@dataclass(frozen=True)
class VerifyReport:
    """Everything `verify` found. `passed` decides the exit code (0 pass, 1 fail)."""

    target: str
    draft: str
    greedy: tuple[GreedyCase, ...] = ()
    sampling: SamplingResult | None = None
    seconds: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)
    verify_rule: str = "token"
    grammar: str | None = None  # the grammar's source (--json-schema...), None for free text

    @property
    def greedy_passed(self) -> bool:
        return all(c.status != "fail" for c in self.greedy)

    @property
    def passed(self) -> bool:
        return self.greedy_passed and (self.sampling is None or self.sampling.passed)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (for `verify --json`)."""
        s = self.sampling
        return {
            "passed": self.passed,
            "target": self.target,
            "draft": self.draft,
            "verify_rule": self.verify_rule,
            "grammar": self.grammar,
            "seconds": round(self.seconds, 3),
            "greedy": [asdict(c) for c in self.greedy],
            "sampling": None
            if s is None
            else {
                "passed": s.passed,
                "samples": s.samples,
                "positions": s.positions,
                "k": s.k,
                "params": asdict(s.params),
                "seed": s.seed,
                "alpha": s.alpha,
                "acceptance_rate": round(s.acceptance_rate, 6),
                "seconds": round(s.seconds, 3),
                "tests": [asdict(t) for t in s.tests],
            },
        }


# -- statistics (pure) ------------------------------------------------------------------


def _gamma_q(a: float, x: float) -> float:
    """Regularized upper incomplete gamma Q(a, x) (Numerical Recipes, 6.2: series for
    x < a + 1, Lentz's continued fraction otherwise); relative error ~1e-14."""
    if x <= 0.0:
        return 1.0
    log_pre = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1.0:
        ap, term = a, 1.0 / a
        total = term
        for _ in range(10_000):
            ap += 1.0
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-16:
                break
        return max(0.0, 1.0 - total * math.exp(log_pre))
    tiny = 1e-300
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-16:
            break
    return math.exp(log_pre) * h


def chi2_sf(x: float, dof: int) -> float:
    """P(X >= x) for X ~ chi-square with `dof` degrees of freedom (scipy.stats.chi2.sf)."""
    if dof <= 0:
        return 1.0
    if math.isinf(x):
        return 0.0
    return _gamma_q(dof / 2.0, x / 2.0)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in input order (step-down, monotone, capped at 1)."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def pooled_chisquare(
    observed: Counter[int], ids: np.ndarray, probs: np.ndarray, min_expected: float = 5.0
) -> tuple[float, int, int]:
    """Pearson goodness of fit of token counts to a sparse distribution.

    Cells with expected count >= `min_expected` are kept; the rest of the support and any
    observed token outside it are pooled into one cell, which is merged into the smallest
    kept cell when its own expected count is below `min_expected`.

    Args:
        observed: token id -> count; n = sum of counts.
        ids, probs: (m,) int64 support and (m,) float64 probabilities (sum 1).

    Returns:
        (chi2, dof, n_outside); dof = 0 (and chi2 = 0) when fewer than two cells remain.
    """
    n = sum(observed.values())
    expected = n * probs
    keep = expected >= min_expected
    if n == 0 or not keep.any():
        return 0.0, 0, 0
    support = set(ids.tolist())
    n_outside = sum(c for t, c in observed.items() if t not in support)
    e_cells = list(expected[keep])
    o_cells = [float(observed.get(int(t), 0)) for t in ids[keep]]
    e_rest = float(n - sum(e_cells))
    o_rest = float(n - sum(o_cells))
    if e_rest >= min_expected:
        e_cells.append(e_rest)
        o_cells.append(o_rest)
    else:
        j = int(np.argmin(e_cells))
        e_cells[j] += e_rest
        o_cells[j] += o_rest
    if len(e_cells) < 2:
        return 0.0, 0, n_outside
    e = np.asarray(e_cells)
    o = np.asarray(o_cells)
    return float(((o - e) ** 2 / e).sum()), len(e_cells) - 1, n_outside


# -- engine helpers ---------------------------------------------------------------------


class _PromptCache:
    """Target wrapper that keeps the evaluated prompt between samples.

    `generate` starts each sample with ``truncate(0)`` and ``decode(prompt[:-1])``. Here
    truncation is lazy (applied before the next real decode), and that one prefill, when
    asked again with the real cache still holding it, returns a copy of its logits row
    instead of re-evaluating: the values are the ones a re-evaluation would produce.
    Call `sync` before using the wrapped engine directly.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.name = engine.name
        self.n_vocab = engine.n_vocab
        self.n_ctx = engine.n_ctx
        self.vocab = engine.vocab
        self._n = len(engine.tokens)
        self._memo: tuple[list[int], Logits] | None = None

    @property
    def tokens(self) -> list[int]:
        return self.engine.tokens[: self._n]

    @property
    def decode_s(self) -> float:
        return self.engine.decode_s

    def tokenize(self, text: bytes, add_special: bool = True) -> list[int]:
        return self.engine.tokenize(text, add_special)

    def token_bytes(self, token: int) -> bytes:
        return self.engine.token_bytes(token)

    def token_text(self, token: int) -> str:
        return self.engine.token_text(token)

    def is_eog(self, token: int) -> bool:
        return self.engine.is_eog(token)

    def truncate(self, n: int) -> None:
        self._n = min(n, self._n)

    def decode(
        self, tokens: list[int], all_logits: bool = False, rows: Sequence[int] | None = None
    ) -> Logits:
        memo = self._memo
        if rows is not None:  # a block with grammar-forced positions: never memoised
            self.engine.truncate(self._n)
            out = self.engine.decode(tokens, all_logits, rows)
            self._n = len(self.engine.tokens)
            return out
        if (
            self._n == 0
            and not all_logits
            and memo is not None
            and memo[0] == tokens
            and self.engine.tokens[: len(tokens)] == tokens
        ):
            self._n = len(tokens)
            return memo[1]
        self.engine.truncate(self._n)
        out = self.engine.decode(tokens, all_logits)
        if self._n == 0 and not all_logits:
            self._memo = (list(tokens), out.copy())
        self._n = len(self.engine.tokens)
        return out

    def sync(self) -> None:
        self.engine.truncate(self._n)

    def close(self) -> None:  # the wrapped engine belongs to the caller
        pass


def _processor(
    target: Engine, params: SamplingParams, grammar: GrammarSpec | None, n_prompt: int
) -> Processor | None:
    """What the runs did to each target row before the warpers: the grammar's mask (after
    the generated tokens), then the logit bias and penalties; None when nothing is set."""
    proc = processor_for(params.constraints, target.n_vocab)
    if grammar is None:
        return proc
    # start-up time: llguidance loads only for a grammar
    from specgen.grammar import grammar_factory

    mask = grammar_factory(grammar)(target, n_prompt)
    return mask if proc is None else Chain([mask, proc])


def _last_row(engine: Engine, context: list[int], keep: int) -> np.ndarray:
    """(n_vocab,) float32 copy of the target's logits after `context`, reusing the first
    `keep` cached positions (which must equal context[:keep])."""
    engine.truncate(keep)
    return engine.decode(context[keep:])[-1].copy()


def _run(
    target: Engine,
    drafter: Drafter | None,
    prompt: list[int],
    config: GenerateConfig,
    k: int,
) -> tuple[Done, list[RoundTrace]]:
    done: Done | None = None
    traces: list[RoundTrace] = []
    # the first round speculates too: every tested position must go through the rule
    for ev in generate(target, drafter, prompt, config, FixedK(k), ordinary_first=False):
        if isinstance(ev, Step) and ev.trace is not None:
            traces.append(ev.trace)
        elif isinstance(ev, Done):
            done = ev
    assert done is not None
    return done, traces


# -- greedy check -----------------------------------------------------------------------


def _examine_divergence(
    target: Engine,
    prompt: list[int],
    ordinary: Sequence[int],
    spec_traces: list[RoundTrace],
    i: int,
    params: SamplingParams = GREEDY,
    grammar: GrammarSpec | None = None,
) -> tuple[float, float, np.ndarray]:
    """At generated position i, where the runs first differ: (gap_top2, drift, single),
    single being the (n_vocab,) float64 single-token logits row (processed by `params`'
    constraints, as both runs processed it)."""
    # single-token arithmetic, as ordinary decoding did: the prompt batched, then one
    # token per pass
    target.truncate(0)
    if len(prompt) > 1:
        target.decode(prompt[:-1])
    row_single = None
    for tok in [prompt[-1], *ordinary[:i]]:
        row_single = target.decode([tok])[-1]
    assert row_single is not None
    proc = _processor(target, params, grammar, len(prompt))
    context = [*prompt, *ordinary[:i]]
    if proc is not None:  # the rows each run took its argmax of
        row_single = proc.row(row_single, context, ())
    single = row_single.astype(np.float64)
    # batched arithmetic: the speculative round that produced position i, re-run
    at = len(prompt) + i  # committed index of the divergent token
    rnd = max((t for t in spec_traces if t.position <= at), key=lambda t: t.position)
    target.truncate(0)
    if rnd.position > 1:
        target.decode(context[: rnd.position - 1])
    rows = target.decode([context[rnd.position - 1], *rnd.drafted], all_logits=True)
    row_batched = rows[at - rnd.position]
    if proc is not None:  # the drafted tokens before it are context's (the runs agree there)
        row_batched = proc.row(row_batched, context, ())
    batched = row_batched.astype(np.float64)
    top2 = np.sort(single)[-2:]
    drift = float(np.abs(batched - single).max())
    return float(top2[1] - top2[0]), drift, single


def check_greedy(
    target: Engine,
    make_drafter: DrafterFactory,
    config: VerifyConfig,
    progress: Progress | None = None,
) -> list[GreedyCase]:
    """Greedy speculative output vs ordinary output, for each prompt and K.

    Returns one GreedyCase per (prompt, K); see the module docstring for the near-tie rule.
    """
    say = progress or (lambda _m: None)
    # the user's logit bias and penalties hold in the greedy check too
    greedy = replace(GREEDY, constraints=config.params.constraints)
    drafter = make_drafter(greedy)
    cases: list[GreedyCase] = []
    # under a grammar, ignore_eos lets an end-of-generation token through as a token where
    # the grammar allows it (it completes the grammar: the run ends there with "stop")
    gen = GenerateConfig(
        max_tokens=config.greedy_tokens, params=greedy, ignore_eos=True, seed=config.seed,
        grammar=config.grammar,
    )  # fmt: skip
    spec_gen = replace(gen, trace=True, verify_rule=config.verify_rule)
    for pi, text in enumerate(config.greedy_prompts):
        prompt = target.tokenize(text)
        say(f"greedy: prompt {pi + 1}/{len(config.greedy_prompts)}, ordinary decoding")
        ordinary = _run(target, None, prompt, gen, 0)[0].tokens
        for k in config.greedy_ks:
            say(f"greedy: prompt {pi + 1}/{len(config.greedy_prompts)}, K={k}")
            t0 = time.perf_counter()
            done, traces = _run(target, drafter, prompt, spec_gen, k)
            spec = done.tokens
            i = common_prefix(list(ordinary), list(spec))
            label = text.decode("utf-8", "replace")
            if i == len(ordinary) == len(spec):
                cases.append(
                    GreedyCase(pi, label, k, len(spec), "match", seconds=time.perf_counter() - t0)
                )
                continue
            if i >= min(len(ordinary), len(spec)):  # one run stopped early: a real bug
                cases.append(
                    GreedyCase(
                        pi,
                        label,
                        k,
                        min(len(ordinary), len(spec)),
                        "fail",
                        position=i,
                        seconds=time.perf_counter() - t0,
                    )
                )
                continue
            gap_top2, drift, single = _examine_divergence(
                target, prompt, ordinary, traces, i, greedy, config.grammar
            )
            gap = float(single[ordinary[i]] - single[spec[i]])
            threshold = max(config.noise_gap, 2.0 * drift)
            cases.append(
                GreedyCase(
                    pi,
                    label,
                    k,
                    len(spec),
                    "noise" if gap < threshold else "fail",
                    position=i,
                    ordinary_token=ordinary[i],
                    speculative_token=spec[i],
                    gap_top2=gap_top2,
                    gap=gap,
                    drift=drift,
                    threshold=threshold,
                    seconds=time.perf_counter() - t0,
                )
            )
    target.truncate(0)
    return cases


# -- sampling check ---------------------------------------------------------------------


def _sample(
    target: _PromptCache,
    drafter: Drafter,
    prompt: list[int],
    config: VerifyConfig,
    seeds: np.ndarray,
    say: Progress,
    label: str,
) -> tuple[list[tuple[int, ...]], int, int]:
    """N speculative generations of m tokens: (sequences, n_drafted, n_accepted)."""
    seqs: list[tuple[int, ...]] = []
    drafted = accepted = 0
    step = max(1, len(seeds) // 10)
    base = GenerateConfig(
        max_tokens=config.positions,
        params=config.params,
        ignore_eos=True,
        verify_rule=config.verify_rule,
        grammar=config.grammar,
    )
    for i, s in enumerate(seeds):
        if i % step == 0:
            say(f"sampling: {label}, sample {i + 1}/{len(seeds)}")
        gen = replace(base, seed=int(s))
        done, _ = _run(target, drafter, prompt, gen, config.k)  # type: ignore[arg-type]
        seqs.append(done.tokens)
        drafted += done.stats.n_drafted
        accepted += done.stats.n_accepted
    return seqs, drafted, accepted


def _tests_for_prompt(
    target: Engine,
    prompt: list[int],
    seqs: list[tuple[int, ...]],
    config: VerifyConfig,
    prompt_index: int,
) -> list[ChiSquareTest]:
    """One pooled chi-square test per position against the exact conditional laws."""
    tests: list[ChiSquareTest] = []
    keep = len(prompt) - 1  # the cache holds prompt[:-1] after sampling (kept by _PromptCache)
    proc = _processor(target, config.params, config.grammar, len(prompt))
    for j in range(1, config.positions + 1):
        groups: dict[tuple[int, ...], Counter[int]] = defaultdict(Counter)
        for s in seqs:
            if len(s) >= j:
                groups[s[: j - 1]][s[j - 1]] += 1
        chi2 = 0.0
        dof = n = n_groups = n_out = 0
        for prefix, counts in groups.items():
            size = sum(counts.values())
            if j > 1 and size < config.min_group:
                continue
            row = _last_row(target, [*prompt, *prefix], keep)
            if proc is not None:  # the exact law: the grammar's mask, bias and penalties
                row = proc.row(row, prompt, prefix)
            ids, p = warp(row, config.params)
            c, d, o = pooled_chisquare(counts, ids, p)
            if d == 0:
                continue
            chi2 += c
            dof += d
            n += size
            n_groups += 1
            n_out += o
        if dof > 0:
            tests.append(
                ChiSquareTest(
                    prompt_index, j, n, n_groups, dof, chi2, chi2_sf(chi2, dof), n_outside=n_out
                )
            )
    return tests


def check_sampling(
    target: Engine,
    make_drafter: DrafterFactory,
    config: VerifyConfig,
    progress: Progress | None = None,
) -> SamplingResult:
    """Speculative samples vs the target's exact conditional distributions (module docstring)."""
    say = progress or (lambda _m: None)
    t0 = time.perf_counter()
    drafter = make_drafter(config.params)
    cached = _PromptCache(target)
    root = np.random.SeedSequence(config.seed)
    tests: list[ChiSquareTest] = []
    drafted = accepted = 0
    try:
        for pi, text in enumerate(config.sampling_prompts):
            prompt = target.tokenize(text)
            seeds = root.spawn(1)[0].generate_state(config.samples)
            label = f"prompt {pi + 1}/{len(config.sampling_prompts)}"
            seqs, d, a = _sample(cached, drafter, prompt, config, seeds, say, label)
            drafted += d
            accepted += a
            cached.sync()
            say(f"sampling: {label}, reference passes")
            tests += _tests_for_prompt(target, prompt, seqs, config, pi)
            cached = _PromptCache(target)
    finally:
        target.truncate(0)
    adjusted = holm([t.p_value for t in tests])
    tests = [replace(t, p_adjusted=a) for t, a in zip(tests, adjusted, strict=True)]
    return SamplingResult(
        tests=tuple(tests),
        samples=config.samples,
        positions=config.positions,
        k=config.k,
        params=config.params,
        seed=config.seed,
        alpha=config.alpha,
        passed=all(t.p_adjusted >= config.alpha for t in tests),
        acceptance_rate=accepted / drafted if drafted else 0.0,
        seconds=time.perf_counter() - t0,
    )


def verify(
    target: Engine,
    make_drafter: DrafterFactory,
    config: VerifyConfig,
    draft_name: str = "",
    progress: Progress | None = None,
) -> VerifyReport:
    """Run the checks `config` selects and return the report (prints nothing).

    Args:
        target: the target engine (its cache is used and left empty).
        make_drafter: builds the drafter for a sampling setting (`drafter_factory`).
        config: what to run.
        draft_name: for the report.
        progress: called with one-line status messages.
    """
    t0 = time.perf_counter()
    greedy = check_greedy(target, make_drafter, config, progress) if config.greedy else []
    sampling = check_sampling(target, make_drafter, config, progress) if config.sampling else None
    notes = []
    if sampling is not None and not sampling.tests:
        notes.append("no sampling test had enough samples: raise --samples")
    if sampling is not None and sampling.acceptance_rate > HIGH_ACCEPTANCE:
        notes.append(
            f"acceptance is {sampling.acceptance_rate:.0%}: only the rejected"
            f" {1 - sampling.acceptance_rate:.0%} of proposals go through the residual, so a"
            " residual bug moves little mass; raise --samples (or --temp) for more power"
        )
    return VerifyReport(
        target=target.name,
        draft=draft_name,
        greedy=tuple(greedy),
        sampling=sampling,
        seconds=time.perf_counter() - t0,
        notes=tuple(notes),
        verify_rule=config.verify_rule,
        grammar=config.grammar.source if config.grammar is not None else None,
    )


def drafter_factory(drafter: Drafter | None) -> DrafterFactory:
    """A factory over a loaded drafter: a `ModelDrafter` is rebuilt on the same engine for
    each sampling setting (its q must come from the setting it samples with); other
    drafters (prompt lookup) are returned as they are.

    Raises:
        ConfigError: no drafter (``--draft none``): there is nothing to verify.
    """
    if drafter is None:
        raise ConfigError("verify needs a draft: pass --draft MODEL or 'ngram', not 'none'")
    return drafter.with_params
