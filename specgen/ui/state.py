"""The live view's state: ``ViewState`` holds what the screen needs, and ``apply(state, event)``
folds the loop's ``Prefilled`` / ``Step`` / ``Done`` events into it (the view is a function of
this state: ``specgen.ui.text`` renders it, ``specgen.ui.live`` draws it).

Imports no rich: ``specgen.events`` and the pure ``specgen.control.goodput`` (for
``break_even_alpha``, the same formula the controller decides with).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Literal

from specgen.control.goodput import break_even_alpha
from specgen.events import LOOKUPS, Done, FinishReason, Prefilled, Stats, Step

__all__ = ["ORDINARY_HOW", "ROUNDS_HOW", "Event", "Origin", "Position", "ViewState", "apply"]

Origin = Literal["draft", "lookup", "grammar", "target", "rejected", "prompt"]
"""Where a piece of text came from: an accepted draft-model token, an accepted
prompt-lookup token, a token the grammar forced (`Span.source`: no draft pass, and no
target row where the grammar allowed it alone), a token the target produced (residual resample,
bonus token or ordinary decoding), a rejected draft proposal, or the prompt (the user's
text, echoed dimmed above the reply as llama-cli echoes it)."""

Event = Prefilled | Step | Done

ORDINARY_HOW = "median of single-token target passes after the prompt"
"""How the loop measures ``Prefilled.ordinary_token_s`` and ``Step.timed_ordinary_s`` (said
next to the speedup; a single stream times them after its first token)."""
ROUNDS_HOW = "median of this run's ordinary rounds"
"""How the baseline is measured once the run's own K = 0 rounds decide it
(`specgen.measure.Baseline`)."""

Position = tuple[int, int]
"""(segment index, character offset) into ``ViewState.segments``."""


@dataclass
class ViewState:
    """Everything the screen shows. Built by the CLI, folded by ``apply``.

    Attributes:
        target_name, draft_name: model names (draft_name None when there is no drafter).
        show_rejected: show rejected draft proposals inline, dim and struck through.
        color: use colors; False selects attribute-only styles (NO_COLOR).
        segments: (text, origin) pieces in the order they came; rejected pieces are kept
            even when not shown.
        prompt: what was asked, shown dimmed before the reply (the first segment); a raw
            prompt the reply continues, or a chat message ending with a newline.
        stats: running totals, replaced by ``Done.stats`` at the end.
        k: block size of the latest round (0 = ordinary decoding), None before the first.
        ordinary_token_s: seconds per token of ordinary decoding of this target, timed in
            this process right after the prompt; None when not measured.
        ordinary_how: how ``ordinary_token_s`` was obtained, e.g. "3 single-token target
            passes after the prompt".
        finish_reason: None while generating.
        spec_by_k: K -> [rounds, drafting seconds, wall seconds] of the rounds with that
            block size (the break-even is computed for the K used most).
        backend: what llama.cpp computes with ("CPU", "CUDA", ...), "" when unknown.
    """

    target_name: str
    draft_name: str | None = None
    show_rejected: bool = False
    color: bool = True
    segments: list[tuple[str, Origin]] = field(default_factory=list)
    lookup_seen: bool = False  # an accepted prompt-lookup token was shown (legend names it)
    grammar_seen: bool = False  # a token the grammar forced was shown (legend names it)
    stats: Stats = field(default_factory=Stats)
    k: int | None = None
    ordinary_token_s: float | None = None
    ordinary_how: str = ""
    finish_reason: FinishReason | None = None
    spec_by_k: dict[int, list[float]] = field(default_factory=dict)
    backend: str = ""
    prompt: str = ""

    def __post_init__(self) -> None:
        if self.prompt:
            self.segments.insert(0, (self.prompt, "prompt"))

    @property
    def text(self) -> str:
        """The generated text so far (rejected proposals and the prompt excluded)."""
        kept = ("draft", "lookup", "grammar", "target")
        return "".join(t for t, origin in self.segments if origin in kept)

    @property
    def speedup(self) -> float | None:
        """Measured tokens/s over ordinary decoding's tokens/s (1 / ordinary_token_s);
        None until both are known."""
        if not self.ordinary_token_s or self.stats.decode_s <= 0:
            return None
        return self.stats.tokens_per_s * self.ordinary_token_s

    @property
    def break_even(self) -> tuple[int, float] | None:
        """(K, break-even alpha) from the costs measured so far, or None when there is no
        baseline or no speculative round yet. Alpha is ``math.inf`` when even alpha = 1
        would be slower than ordinary decoding.

        K is the block size used by the most rounds (the larger on a tie): with `auto`
        K changes, and the last round is often cut short by -n, so neither says what the
        run did. A round's cost is K times the mean seconds per drafted token plus the
        mean of everything else in a speculative round (verify, sampling, bookkeeping),
        both over the rounds of that K, seconds.
        """
        if not self.ordinary_token_s or not self.spec_by_k:
            return None
        k = max(self.spec_by_k, key=lambda kk: (self.spec_by_k[kk][0], kk))
        rounds, draft_s, round_s = self.spec_by_k[k]
        draft_token_s = draft_s / (rounds * k)
        fixed_s = max(0.0, round_s - draft_s) / rounds
        needed = (k * draft_token_s + fixed_s) / self.ordinary_token_s  # tokens per round
        if needed > k + 1 + 1e-9:
            return k, math.inf
        return k, break_even_alpha(k, draft_token_s, fixed_s, self.ordinary_token_s)


def apply(state: ViewState, event: Event) -> None:
    """Fold one event from the generation loop into ``state`` (in place).

    Unknown event types are ignored, so the loop may grow new events.
    """
    if isinstance(event, Prefilled):
        state.stats.n_prompt = event.n_prompt
        state.stats.prefill_s = event.prefill_s
        if event.ordinary_token_s:
            state.ordinary_token_s = event.ordinary_token_s
            state.ordinary_how = state.ordinary_how or ORDINARY_HOW
    elif isinstance(event, Step):
        _apply_step(state, event)
    elif isinstance(event, Done):
        shown = state.text
        if len(event.text) > len(shown) and event.text.startswith(shown):
            # Text the loop held back (an incomplete character, a possible stop string).
            state.segments.append((event.text[len(shown) :], "target"))
        # the loop's own totals (wall-clock decode time), in a copy: the event is shared
        stats = event.stats
        if not stats.k_history and state.stats.k_history:
            stats = dataclasses.replace(stats, k_history=list(state.stats.k_history))
        state.stats = stats
        if stats.ordinary_token_s is not None:
            state.ordinary_token_s = stats.ordinary_token_s
        state.finish_reason = event.finish_reason


def _apply_step(state: ViewState, step: Step) -> None:
    segments = state.segments
    for i, span in enumerate(step.spans):
        if i == step.n_accepted and step.rejected_text is not None:
            segments.append((step.rejected_text, "rejected"))
        origin: Origin = "target"
        if span.from_draft:
            origin = "lookup" if span.source in LOOKUPS else "draft"
            if span.source == "grammar":
                origin = "grammar"
        state.lookup_seen |= origin == "lookup"
        state.grammar_seen |= origin == "grammar"
        segments.append((span.text, origin))
    if step.rejected_text is not None and step.n_accepted >= len(step.spans):
        segments.append((step.rejected_text, "rejected"))
    state.stats.add(step)
    state.k = step.k
    if step.timed_ordinary_s:  # a single stream's start-up passes, after its first round
        state.ordinary_how = state.ordinary_how or ORDINARY_HOW
    if step.ordinary_token_s is not None:  # the run's current baseline (one estimate)
        state.ordinary_token_s = step.ordinary_token_s
        if step.k == 0 and state.stats.k_history.count(0) >= 3:
            state.ordinary_how = ROUNDS_HOW
    if step.k > 0:
        acc = state.spec_by_k.setdefault(step.k, [0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += step.draft_s
        acc[2] += step.round_s
