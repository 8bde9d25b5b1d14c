"""Typed events the generation loop yields. They never print; the view and the JSON
writer turn them into output. Field names carry units (`_s` = seconds). And `relay`, the
one way to pass a generation's events through a step of one's own (a trace, a warning, a
chat's record of the reply) with Ctrl-C handed to the loop."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

from specgen import acceptance_stats

if TYPE_CHECKING:
    from specgen.logprobs import TokenLogprob

Source = Literal["draft", "lookup", "prediction", "grammar", "target"]
"""Who proposed a committed token: the draft model, prompt lookup (n-gram) in the context,
prompt lookup in the request's predicted output (OpenAI's ``prediction``), the grammar
(a position where it allows a single token: no draft pass), or the target itself
(residual, bonus or ordinary token)."""
SOURCES: tuple[Source, ...] = ("draft", "lookup", "prediction", "grammar", "target")
LOOKUPS: tuple[Source, ...] = ("lookup", "prediction")
"""The prompt-lookup sources: one-hot proposals copied from text, no draft pass."""

FinishReason = Literal["length", "context", "stop", "eos", "interrupted"]
"""Why generation ended: -n reached, the context (-c) full, a stop string, an
end-of-generation token, or Ctrl-C."""

ACCEPTANCE_HOW = "drafted counts each round's proposals up to its first rejection"
"""How `Stats.acceptance_rate` counts, said wherever it is shown."""


@dataclass(frozen=True)
class Span:
    """Text emitted for one committed token.

    Attributes:
        text: the characters this token completed (may be '' while a multi-byte
            character is still incomplete, or hold the tail of earlier tokens' bytes).
        token: the token id.
        from_draft: True when a drafter proposed it and the target accepted it; False
            when the target produced it (residual resample, bonus token, or ordinary decoding).
        source: which drafter proposed it (`Source`): "draft" (the draft model),
            "lookup" (prompt lookup), "prediction" (prompt lookup in the predicted
            output), "grammar" (forced by the grammar), or "target";
            defaults from `from_draft` ("draft" or "target").
        logprob: the token's log-probability under the target's raw logits with the
            asked alternatives (`specgen.logprobs.TokenLogprob`), when the generation asked
            for them (`GenerateConfig.logprobs`); None otherwise, and for the span of an
            end-of-generation token (no token is emitted).
    """

    text: str
    token: int
    from_draft: bool
    source: Source | None = None
    logprob: TokenLogprob | None = None

    def __post_init__(self) -> None:
        if self.source is None:
            object.__setattr__(self, "source", "draft" if self.from_draft else "target")
        assert self.from_draft == (self.source != "target"), "source and from_draft disagree"


@dataclass(frozen=True)
class Prefilled:
    """The prompt has been evaluated by the target (a single stream's draft evaluates it
    once the controller first drafts with it: `specgen.generate.OneSlot`)."""

    n_prompt: int
    prefill_s: float
    ordinary_token_s: float | None = None
    """Median seconds of a single-token target pass timed right after the prompt, or None:
    the single stream times its passes after its first round instead
    (`Step.timed_ordinary_s`), so that its first token waits for none of them; traces
    written before that carry it here."""
    draft_token_s: float | None = None
    """Median seconds of a single-token draft pass, likewise (None but in older traces)."""
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None
    """With `GenerateConfig.prompt_logprobs`: prompt tokens 2..n, each under the target's
    raw logits at the position before it (`specgen.logprobs`; the first token has none),
    else None. A choice that shares another's prompt cells (the server's ``n``) has none
    of its own: empty."""


@dataclass(frozen=True)
class RoundTrace:
    """What one round decided, for `--trace` (built only when asked: it costs time).

    Attributes:
        position: committed tokens before the round (the index `last` was committed at, + 1).
        drafted: x_1..x_K proposed by the draft.
        q_x, p_x: q_i(x_i) and p_i(x_i) for each proposal (greedy: one-hot values).
        u: the uniforms drawn for the acceptance test (empty when greedy).
        accepted: the decision for each proposal that was tested (stops at the first reject).
        next_token: the token after the accepted prefix (a residual draw, the bonus token
            or an ordinary pass's).
        next_kind: "residual" (after a rejection), "bonus" (all K accepted) or "ordinary"
            (K = 0).
        top: the target's 3 most likely tokens with p at the position of `next_token`.
        target_cache, draft_cache: cached tokens in each model after the round's rollback
            (draft_cache is -1 without a model drafter).
        verify_rule: "token" (token-wise rejection) or "block" (block verification; `u`
            then holds its eta and `h` its pass probabilities h_1..h_K).
        sources: the proposer of each drafted token (`Source`, not "target").
        h: block verification's h_i per position (empty under token-wise).
    """

    position: int
    drafted: tuple[int, ...]
    q_x: tuple[float, ...]
    p_x: tuple[float, ...]
    u: tuple[float, ...]
    accepted: tuple[bool, ...]
    next_token: int
    next_kind: str
    top: tuple[tuple[int, float], ...]
    target_cache: int
    draft_cache: int
    verify_rule: str = "token"
    sources: tuple[str, ...] = ()
    h: tuple[float, ...] = ()


@dataclass(frozen=True)
class Step:
    """One round: draft K, verify once, accept n, emit n + 1 tokens (fewer at the end).

    Attributes:
        k: block size used (0 = an ordinary decoding pass).
        n_proposed: proposals the drafter returned, m <= k (fewer after a confidence
            cut-off, or when prompt lookup finds no match): what drafting cost.
        n_drafted: draft proposals this round that were tested and mattered: the accepted
            ones plus the rejected one, counted up to the last emitted token (the
            denominator of the acceptance rate, see `Stats.acceptance_rate`). Fewer than k
            when the drafter proposed fewer, after a rejection, or at the end.
        n_accepted: accepted draft tokens this round (counted up to the last emitted token).
        spans: the emitted tokens with their text and origin, in order.
        rejected_text: text of the rejected draft proposal, or None when nothing was rejected.
        draft_s, verify_s, sample_s: seconds spent drafting, in the target's batched
            decode, and in warping/acceptance/residual sampling.
        round_s: wall seconds of the whole round.
        host_s: the part of round_s spent outside llama_decode (both models): warping,
            draws, acceptance, the residual, emitting text, rollback and bookkeeping.
        draft_host_s: the part of host_s spent while drafting (the draft rows' warps
            and draws).
        n_rows: logits rows the target computed (K + 1, or K without the bonus row; less
            the positions where the grammar allowed one token alone, which need none).
        ordinary_token_s: the ordinary-decoding baseline after this round, seconds per
            token (`specgen.measure.Baseline`), None when not measured.
        n_drafted_by, n_accepted_by: n_drafted and n_accepted split by the proposer
            ("draft", "lookup", "prediction", "grammar"), only sources with a count.
        timed_ordinary_s, timed_draft_s: medians of the single-token target and draft
            passes timed at a single stream's start-up, on the round they preceded (its
            second: the first is an ordinary pass, so the first token waits for none of
            them; `specgen.generate.OneSlot`), else None.
        k_reason: why the server's step gave this round its K
            (`specgen.control.goodput.REASONS`); None outside the server.
        eos_logprob: with `GenerateConfig.logprobs`, the end-of-generation token that
            ended this round, with its log-probabilities: it is no emitted token (no span,
            not in `Done.tokens`), but OpenAI's completions list it, and a harness that
            scores a prompt by ``echo`` reads the entries before the last generated one;
            else None.
    """

    k: int
    n_proposed: int
    n_drafted: int
    n_accepted: int
    spans: tuple[Span, ...]
    rejected_text: str | None
    draft_s: float
    verify_s: float
    sample_s: float
    round_s: float
    trace: RoundTrace | None = None
    host_s: float = 0.0
    draft_host_s: float = 0.0
    n_rows: int = 0
    ordinary_token_s: float | None = None
    n_drafted_by: dict[str, int] = field(default_factory=dict)
    n_accepted_by: dict[str, int] = field(default_factory=dict)
    timed_ordinary_s: float | None = None
    timed_draft_s: float | None = None
    k_reason: str | None = None
    eos_logprob: TokenLogprob | None = None

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.spans)


@dataclass
class Totals:
    """The counts and seconds of generated text and the rates made of them (acceptance,
    tokens/s, the speedup over ordinary decoding), defined once: summed over one
    generation's rounds (`Stats`) or over a chat's replies (`specgen.chat.ChatTotals`).

    Attributes:
        n_generated: tokens emitted.
        n_drafted: proposals tested (each round's up to and including its first rejection).
        n_accepted: of those, accepted.
        target_passes: target decodes after the prompt.
        decode_s: seconds of decoding (prefill excluded).
    """

    n_generated: int = 0
    n_drafted: int = 0
    n_accepted: int = 0
    target_passes: int = 0
    decode_s: float = 0.0

    if TYPE_CHECKING:  # a field of `Stats`, the median of the replies' in `ChatTotals`

        @property
        def ordinary_token_s(self) -> float | None: ...

    def add_totals(self, other: Totals) -> None:
        """Add each of `other`'s counts and seconds (the fields above) to these."""
        for f in fields(Totals):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @property
    def acceptance_rate(self) -> float:
        """alpha estimate: accepted / drafted, where drafted counts each round's tested
        proposals (`Step.n_drafted`); 0 when nothing was drafted. The one definition
        the footer, the summary, --json and bench show (`ACCEPTANCE_HOW`)."""
        return acceptance_stats.acceptance_rate(self.n_accepted, self.n_drafted)

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens over decode wall time (prefill excluded), tokens/s."""
        return self.n_generated / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def speedup(self) -> float | None:
        """tokens/s over ordinary decoding's (1 / ordinary_token_s); None unmeasured."""
        if not self.ordinary_token_s or self.decode_s <= 0:
            return None
        return self.tokens_per_s * self.ordinary_token_s


@dataclass
class Stats(Totals):
    """Running totals of one generation, folded from its Steps by `add` (the one
    accumulator: the loop, the live view and bench all count with it).

    Attributes:
        n_prompt: prompt tokens.
        n_prefill: prompt tokens the target evaluated; the rest (all but the last) were
            already in its cache (a chat's earlier turns).
        n_generated: tokens emitted (nothing after an end-of-generation token or stop string).
        n_drafted: the sum of `Step.n_drafted`: proposals tested up to and including the
            first rejection, counted up to the last emitted token.
        n_accepted: of those, accepted.
        target_passes: target decodes after the prompt (one per round).
        prefill_s: seconds to evaluate the prompt.
        decode_s: wall seconds from the end of prefill to the last emitted token.
        draft_s, verify_s, sample_s: the split of decode_s (the rest is bookkeeping).
        host_s: seconds of decode_s spent outside llama_decode, in either model (the
            loop's own cost: warps, draws, rejection, emitting, bookkeeping); what a
            faster accelerator cannot shorten.
        draft_host_s: the part of host_s spent while drafting.
        n_rows: logits rows the target scored (one per position it verified).
        ttft_s: time to first token: prefill plus the first round, seconds.
        k_history: block size chosen each round.
        ordinary_token_s: the ordinary-decoding baseline at the end (seconds per token;
            `specgen.measure.Baseline`: the passes timed after the prompt, then the
            run's own K = 0 rounds), None when not measured.
        baseline_note: why that baseline is uncertain (the first passes and the run's
            ordinary rounds disagree by more than their noise), or None.
        n_drafted_by, n_accepted_by: n_drafted and n_accepted split by the proposer
            ("draft" for the draft model, "lookup" for prompt lookup, "prediction" for
            prompt lookup in the predicted output, "grammar" for tokens the grammar
            forced).
        verify_rule: the acceptance rule, "token" or "block".
    """

    n_prompt: int = 0
    n_prefill: int = 0
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    sample_s: float = 0.0
    host_s: float = 0.0
    draft_host_s: float = 0.0
    n_rows: int = 0
    ttft_s: float = 0.0
    k_history: list[int] = field(default_factory=list)
    ordinary_token_s: float | None = None
    baseline_note: str | None = None
    n_drafted_by: dict[str, int] = field(default_factory=dict)
    n_accepted_by: dict[str, int] = field(default_factory=dict)
    verify_rule: str = "token"

    def add(self, step: Step, decode_s: float | None = None) -> None:
        """Fold one round into the totals.

        Args:
            step: the round.
            decode_s: wall seconds from the end of prefill to the end of this round, when
                the caller knows it (the loop: it includes the consumer's time between
                rounds); None adds the round's own ``round_s``.
        """
        self.n_generated += len(step.spans)
        self.n_drafted += step.n_drafted
        self.n_accepted += step.n_accepted
        self.target_passes += 1
        self.draft_s += step.draft_s
        self.verify_s += step.verify_s
        self.sample_s += step.sample_s
        self.host_s += step.host_s
        self.draft_host_s += step.draft_host_s
        self.n_rows += step.n_rows
        self.decode_s = self.decode_s + step.round_s if decode_s is None else decode_s
        self.k_history.append(step.k)
        if step.ordinary_token_s is not None:
            self.ordinary_token_s = step.ordinary_token_s
        for total, part in (
            (self.n_drafted_by, step.n_drafted_by),
            (self.n_accepted_by, step.n_accepted_by),
        ):
            for source, n in part.items():
                total[source] = total.get(source, 0) + n
        if self.ttft_s == 0.0 and step.spans:
            self.ttft_s = self.prefill_s + self.decode_s

    @property
    def host_s_per_round(self) -> float:
        """Mean host seconds per round (target pass), both models."""
        return self.host_s / self.target_passes if self.target_passes else 0.0

    @property
    def host_s_per_row(self) -> float:
        """Target-side host seconds per scored row: (host_s - draft_host_s) / n_rows."""
        return (self.host_s - self.draft_host_s) / self.n_rows if self.n_rows else 0.0

    @property
    def acceptance_how(self) -> str:
        """How `acceptance_rate` counts, in words (`ACCEPTANCE_HOW`)."""
        return ACCEPTANCE_HOW

    @property
    def wall_s(self) -> float:
        """prefill_s + decode_s: the prompt to the last token, seconds."""
        return self.prefill_s + self.decode_s

    @property
    def tokens_per_pass(self) -> float:
        """Mean tokens emitted per target pass (1.0 for ordinary decoding)."""
        return acceptance_stats.tokens_per_pass(self.n_generated, self.target_passes)

    def to_dict(self) -> dict[str, object]:
        """`run --json`'s ``stats`` object (docs/reference/json.md), every key of it: the
        one shape bench, the trace's end line and the Python API give too."""
        return {
            "n_prompt": self.n_prompt,
            "n_prefill": self.n_prefill,
            "n_generated": self.n_generated,
            "n_drafted": self.n_drafted,
            "n_accepted": self.n_accepted,
            "acceptance_rate": round(self.acceptance_rate, 6),
            "target_passes": self.target_passes,
            "tokens_per_pass": round(self.tokens_per_pass, 6),
            "tokens_per_s": round(self.tokens_per_s, 4),
            "prefill_s": round(self.prefill_s, 6),
            "decode_s": round(self.decode_s, 6),
            "draft_s": round(self.draft_s, 6),
            "verify_s": round(self.verify_s, 6),
            "sample_s": round(self.sample_s, 6),
            "host_s": round(self.host_s, 6),
            "draft_host_s": round(self.draft_host_s, 6),
            "n_rows": self.n_rows,
            "host_s_per_round": round(self.host_s_per_round, 9),
            "host_s_per_row": round(self.host_s_per_row, 9),
            "ttft_s": round(self.ttft_s, 6),
            "ordinary_token_s": (
                None if self.ordinary_token_s is None else round(self.ordinary_token_s, 9)
            ),
            "speedup": None if self.speedup is None else round(self.speedup, 4),
            "baseline_note": self.baseline_note,
            "n_drafted_by": dict(sorted(self.n_drafted_by.items())),
            "n_accepted_by": dict(sorted(self.n_accepted_by.items())),
            "verify_rule": self.verify_rule,
            "wall_s": round(self.wall_s, 6),
            "acceptance_how": ACCEPTANCE_HOW,
            "k_history": list(self.k_history),
        }


@dataclass(frozen=True)
class Done:
    """Generation ended. `text` is the whole output, `tokens` the emitted ids;
    `grammar_complete`, with a grammar or schema, whether the output is complete under it
    (one the grammar accepts, though -n may have cut it where it could go on), None
    without one."""

    finish_reason: FinishReason
    text: str
    tokens: tuple[int, ...]
    stats: Stats
    grammar_complete: bool | None = None


def relay(
    events: Iterator[Any],
    each: Callable[[Any], None],
    after: Callable[[], None] | None = None,
) -> Generator[Any, None, None]:
    """Pass `events` through, calling `each` on every event before it is yielded (a trace
    writer, a warning), and `after` once they have ended. Ctrl-C inside `each`, thrown in
    at the yield, or landing in the glue above the loop (this generator's own lines, a
    wrapper's frame: `events` is then still `alive`) is thrown into `events`, so the loop
    ends the generation with its Done, which is passed on, instead of ending this
    generator without it (a reply's Done had been lost so, once in many Ctrl-Cs). Closing
    this generator closes `events`."""
    interrupt = False
    try:
        while True:
            try:
                while True:
                    try:
                        ev = events.throw(KeyboardInterrupt) if interrupt else next(events)  # type: ignore[attr-defined]
                    except StopIteration:
                        break
                    interrupt = False
                    try:
                        each(ev)
                    except KeyboardInterrupt:
                        interrupt = True
                    try:
                        yield ev
                    except KeyboardInterrupt:
                        interrupt = True
                break
            except KeyboardInterrupt:
                if not _alive(events):
                    raise  # the loop's own, after its Done (or it could not take it)
                interrupt = True
        if after is not None:
            after()
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()


def _alive(events: Iterator[Any]) -> bool:
    """Whether `events` can still take an interrupt: a generator not closed, or an object
    saying so (`specgen.generation.Generation.alive`)."""
    alive = getattr(events, "alive", None)
    if alive is not None:
        return bool(alive)
    return inspect.isgenerator(events) and inspect.getgeneratorstate(events) != inspect.GEN_CLOSED
