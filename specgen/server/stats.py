"""Per-request speculative statistics, from the Steps a request received and its Done.

Two objects go into every response (the final chunk when streaming):

- `Timings`: llama-server's ``timings`` fields, so its clients and dashboards read them.
- `Speculative`: what llama-server cannot report, in vLLM's names where they exist
  (``vllm/v1/spec_decode/metrics.py``).

Two acceptance rates appear side by side and differ in their denominator:
``draft_acceptance_rate`` = accepted / *proposed* (vLLM's and llama-server's), and
``acceptance_rate`` = accepted / *tested* (specgen's own, as `specgen run --json` reports:
`specgen.events.ACCEPTANCE_HOW`). Proposals after a rejection are never tested, so the
first is never above the second.

Pure: no HTTP, no clock; every value is a function of the events.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from specgen import ACCEPTANCE_HOW, FinishReason, Stats, Step
from specgen.acceptance_stats import acceptance_rate, prefix_acceptance


@dataclass(frozen=True)
class Timings:
    """llama-server's per-request ``timings`` (milliseconds, tokens, tokens per second).

    Attributes:
        cache_n: prompt tokens already in the slot's cache (not evaluated again).
        prompt_n: prompt tokens the target evaluated (the prompt's last token included:
            it is evaluated by the first round).
        prompt_ms, prompt_per_token_ms, prompt_per_second: prompt evaluation time.
        predicted_n: tokens generated.
        predicted_ms, predicted_per_token_ms, predicted_per_second: generation time,
            from the end of the prompt to the last token.
        draft_n: tokens the drafter proposed (llama-server counts proposals).
        draft_n_accepted: of those, accepted by the target.
    """

    cache_n: int
    prompt_n: int
    prompt_ms: float
    prompt_per_token_ms: float
    prompt_per_second: float
    predicted_n: int
    predicted_ms: float
    predicted_per_token_ms: float
    predicted_per_second: float
    draft_n: int
    draft_n_accepted: int


@dataclass(frozen=True)
class Speculative:
    """What speculation did for one request.

    Attributes:
        num_steps: target decodes that served this request after its prompt (one per
            round; the rounds of a batched step are counted for each request in it).
        num_spec_steps: those with K >= 1 (vLLM's ``num_drafts``).
        num_draft_tokens: tokens proposed, summed over the steps (vLLM's name).
        num_accepted_draft_tokens: of those, accepted.
        num_tested_draft_tokens: proposals the target's test reached (up to and including
            the first rejection each round): the denominator of `acceptance_rate`.
        mean_acceptance_length: 1 + accepted per spec step: tokens emitted per spec step,
            the bonus or correction token included (vLLM's convention); 0 without a spec step.
        draft_acceptance_rate: accepted / proposed, in [0, 1] (vLLM's and llama-server's
            denominator); 0 when nothing was proposed.
        acceptance_rate: accepted / tested, in [0, 1] (specgen's; `acceptance_how`).
        acceptance_how: how `acceptance_rate` counts.
        acceptance_by_position: entry i is the share of steps proposing at least i + 1
            tokens whose first i + 1 proposals were all accepted (with a fixed K, vLLM's
            per-position rate); as long as the largest proposal.
        k_per_step: the block size K chosen each step, in order.
        k_reason_per_step: why each of those K is what it is, in order
            (`specgen.control.goodput.REASONS`: "goodput", "waiting", "slo_ttft", "slo_tpot",
            "probe", "fixed", "first", "catch_up", "cut").
        finish: specgen's own finish reason (`specgen.events.FinishReason`), or "failed" /
            "cancelled" when the request ended by an error or a disconnect.
        verify_rule: the acceptance rule the request was verified by, "token" (token by
            token) or "block" (block verification; `specgen serve --verify`); None when it
            ended before its first round.
        num_tested_draft_tokens_by_source, num_accepted_draft_tokens_by_source: tested and
            accepted proposals split by proposer ("draft": the draft model, "lookup":
            prompt lookup, "prediction": prompt lookup in the request's prediction,
            "grammar": tokens the grammar allowed alone, always accepted),
            only sources with a count: the draft model's own acceptance under a grammar
            is ``accepted["draft"] / tested["draft"]``.
    """

    num_steps: int
    num_spec_steps: int
    num_draft_tokens: int
    num_accepted_draft_tokens: int
    num_tested_draft_tokens: int
    mean_acceptance_length: float
    draft_acceptance_rate: float
    acceptance_rate: float
    acceptance_how: str
    acceptance_by_position: tuple[float, ...]
    k_per_step: tuple[int, ...]
    finish: str
    k_reason_per_step: tuple[str, ...] = ()
    verify_rule: str | None = None
    num_tested_draft_tokens_by_source: dict[str, int] = field(default_factory=dict)
    num_accepted_draft_tokens_by_source: dict[str, int] = field(default_factory=dict)


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


def cached_tokens(stats: Stats | None) -> int:
    """Prompt tokens a request found in its slot's cache or the prompt cache (not
    evaluated again): llama-server's ``timings.cache_n``, OpenAI's
    ``usage.prompt_tokens_details.cached_tokens``. The prompt's last token is always
    evaluated (its logits give the first token); 0 for a request that never finished."""
    if stats is None or not stats.n_prompt:
        return 0
    return stats.n_prompt - min(stats.n_prompt, stats.n_prefill + 1)


def timings(steps: Sequence[Step], stats: Stats | None) -> Timings:
    """llama-server's ``timings`` for a request.

    Args:
        steps: every Step the request received, in order.
        stats: its Done's totals (prompt tokens and times), or None when it never
            finished (failed or cancelled): the prompt fields are then 0.

    Returns:
        `Timings`; rates are 0 when their time is 0.
    """
    n_prompt = stats.n_prompt if stats else 0
    prompt_n = n_prompt - cached_tokens(stats)
    prompt_s = stats.prefill_s if stats else 0.0
    predicted_n = sum(len(s.spans) for s in steps) if stats is None else stats.n_generated
    predicted_s = stats.decode_s if stats else sum(s.round_s for s in steps)
    return Timings(
        cache_n=cached_tokens(stats),
        prompt_n=prompt_n,
        prompt_ms=_ms(prompt_s),
        prompt_per_token_ms=_ms(_ratio(prompt_s, prompt_n)),
        prompt_per_second=round(_ratio(prompt_n, prompt_s), 3),
        predicted_n=predicted_n,
        predicted_ms=_ms(predicted_s),
        predicted_per_token_ms=_ms(_ratio(predicted_s, predicted_n)),
        predicted_per_second=round(_ratio(predicted_n, predicted_s), 3),
        draft_n=sum(s.n_proposed for s in steps),
        draft_n_accepted=sum(s.n_accepted for s in steps),
    )


def acceptance_by_position(steps: Sequence[Step]) -> tuple[float, ...]:
    """Entry i: of the steps that proposed at least i + 1 tokens, the share whose first
    i + 1 were accepted (acceptance is a prefix, so that is ``n_accepted >= i + 1``).
    Non-increasing only when every step proposes the same number; () without proposals
    (`specgen.acceptance_stats.prefix_acceptance`)."""
    return tuple(
        round(a, 6) for a in prefix_acceptance([(s.n_proposed, s.n_accepted) for s in steps])
    )


def speculative(
    steps: Sequence[Step], finish: FinishReason | str, verify_rule: str | None = None
) -> Speculative:
    """The `Speculative` object of a request from its Steps, its finish reason and the
    acceptance rule it ran under (its Done's `Stats.verify_rule`)."""
    n_spec = sum(1 for s in steps if s.k >= 1)
    proposed = sum(s.n_proposed for s in steps)
    accepted = sum(s.n_accepted for s in steps)
    tested = sum(s.n_drafted for s in steps)
    return Speculative(
        num_steps=len(steps),
        num_spec_steps=n_spec,
        num_draft_tokens=proposed,
        num_accepted_draft_tokens=accepted,
        num_tested_draft_tokens=tested,
        mean_acceptance_length=round(1 + accepted / n_spec, 6) if n_spec else 0.0,
        draft_acceptance_rate=round(acceptance_rate(accepted, proposed), 6),
        acceptance_rate=round(acceptance_rate(accepted, tested), 6),
        acceptance_how=ACCEPTANCE_HOW,
        acceptance_by_position=acceptance_by_position(steps),
        k_per_step=tuple(s.k for s in steps),
        k_reason_per_step=tuple(s.k_reason or "" for s in steps),
        finish=finish,
        verify_rule=verify_rule,
        num_tested_draft_tokens_by_source=_by_source(s.n_drafted_by for s in steps),
        num_accepted_draft_tokens_by_source=_by_source(s.n_accepted_by for s in steps),
    )


def predicted(steps: Sequence[Sequence[Step]]) -> dict[str, int]:
    """OpenAI's ``usage.completion_tokens_details`` of a request with a ``prediction``,
    over its choices' rounds: ``accepted_prediction_tokens``, the tokens proposed from the
    prediction that the target accepted, and ``rejected_prediction_tokens``, those it
    tested and rejected (proposals after a rejection are never tested: in neither)."""
    rounds = [x for st in steps for x in st]
    tested = sum(x.n_drafted_by.get("prediction", 0) for x in rounds)
    accepted = sum(x.n_accepted_by.get("prediction", 0) for x in rounds)
    return {"accepted_prediction_tokens": accepted, "rejected_prediction_tokens": tested - accepted}


def _by_source(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for source, n in c.items():
            out[source] = out.get(source, 0) + n
    return {k: n for k, n in sorted(out.items()) if n}
