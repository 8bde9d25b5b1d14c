"""The sampling check of `specgen verify`.

N independent speculative generations of m tokens (fixed K, ``ignore_eos``)
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

import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from specgen.acceptance_stats import acceptance_rate
from specgen.engine import Drafter, Engine, EngineView, Logits
from specgen.generate import GenerateConfig
from specgen.sampling import SamplingParams, warp
from specgen.verify.config import DrafterFactory, Progress, VerifyConfig
from specgen.verify.runs import processor, run
from specgen.verify.stats import chi2_sf, holm, pooled_chisquare


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
        drafted: draft tokens proposed over all samples: 0 when the drafter found nothing
            to propose on these prompts (prompt lookup on text without repeats), which
            makes the check one of ordinary decoding, not of speculation.
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
    drafted: int = 0

    @property
    def min_p_adjusted(self) -> float:
        return min((t.p_adjusted for t in self.tests), default=1.0)


class _PromptCache(EngineView[Engine]):
    """Target wrapper that keeps the evaluated prompt between samples.

    `generate` starts each sample with ``truncate(0)`` and ``decode(prompt[:-1])``. Here
    truncation is lazy (applied before the next real decode), and that one prefill, when
    asked again with the real cache still holding it, returns a copy of its logits row
    instead of re-evaluating: the values are the ones a re-evaluation would produce.
    Call `sync` before using the wrapped engine directly.
    """

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self._n = len(engine.tokens)
        self._memo: tuple[list[int], Logits] | None = None

    @property
    def tokens(self) -> list[int]:
        return self.engine.tokens[: self._n]

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


def _last_row(engine: Engine, context: list[int], keep: int) -> np.ndarray:
    """(n_vocab,) float32 copy of the target's logits after `context`, reusing the first
    `keep` cached positions (which must equal context[:keep])."""
    engine.truncate(keep)
    return engine.decode(context[keep:])[-1].copy()


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
        done, _ = run(target, drafter, prompt, gen, config.k)  # type: ignore[arg-type]
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
    proc = processor(target, config.params, config.grammar, len(prompt))
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
        k=min(config.k, config.positions - 1),  # the block size the rounds ran at
        params=config.params,
        seed=config.seed,
        alpha=config.alpha,
        passed=all(t.p_adjusted >= config.alpha for t in tests),
        acceptance_rate=acceptance_rate(accepted, drafted),
        seconds=time.perf_counter() - t0,
        drafted=drafted,
    )
