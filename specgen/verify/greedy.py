"""The greedy check of `specgen verify` (temperature 0).

Speculative output must equal ordinary output token for token.
For each prompt and block size K the first divergence, if any, is examined: the target is
re-run on the ordinary prefix one token at a time (the ordinary arithmetic) and on the
speculative round's batch (the verification arithmetic). With l the single-token logits at
that position, the divergence is *numeric noise* when the gap l[ordinary] - l[speculative]
is below ``max(noise_gap, 2 * drift)`` logits, where ``drift`` = max |l_batched - l_single|
over the row: a gap that small can be reversed by batched-versus-single arithmetic
(|Δ(l_a - l_b)| <= 2 max|Δl|). Any other divergence fails. Measured drift: ≈0.016 logits
for the F32 demo target, ≈1 logit for a Q4_K_M model (its batched kernels differ).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from specgen.drafters import common_prefix
from specgen.engine import Engine
from specgen.events import RoundTrace
from specgen.generate import GenerateConfig
from specgen.sampling import SamplingParams
from specgen.verify.config import GREEDY, DrafterFactory, Progress, VerifyConfig
from specgen.verify.runs import processor, run

if TYPE_CHECKING:
    from specgen.grammarspec import GrammarSpec


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
        n_drafted, n_accepted: draft tokens the speculative run proposed and the target
            accepted (none drafted: the case compared ordinary decoding with itself).
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
    n_drafted: int = 0
    n_accepted: int = 0


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
    proc = processor(target, params, grammar, len(prompt))
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
        ordinary = run(target, None, prompt, gen, 0)[0].tokens
        for k in config.greedy_ks:
            say(f"greedy: prompt {pi + 1}/{len(config.greedy_prompts)}, K={k}")
            t0 = time.perf_counter()
            done, traces = run(target, drafter, prompt, spec_gen, k)
            spec = done.tokens
            i = common_prefix(list(ordinary), list(spec))
            label = text.decode("utf-8", "replace")
            drafted = {"n_drafted": done.stats.n_drafted, "n_accepted": done.stats.n_accepted}
            if i == len(ordinary) == len(spec):
                cases.append(
                    GreedyCase(
                        pi,
                        label,
                        k,
                        len(spec),
                        "match",
                        seconds=time.perf_counter() - t0,
                        **drafted,
                    )  # fmt: skip
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
                        **drafted,
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
                    **drafted,
                )
            )
    target.truncate(0)
    return cases
