"""Every Rich renderable of `specgen run`: the live view, the final summary, the loading spinner.

The view is a function of state (the shape of Rich's ``top_lite_simulator`` example):

* ``ViewState`` holds what the screen needs; ``apply(state, event)`` folds the loop's
  ``Prefilled`` / ``Step`` / ``Done`` events into it.
* ``render(state)`` and ``render_summary(state)`` are pure: state in, renderable out.
* ``LiveView`` owns the one ``rich.live.Live`` and decides *when* to draw (at most every
  ``min_interval_s`` seconds) and *what stays on screen*: finished lines of text are printed
  above the live region as soon as their newline arrives, so the scrollback always holds
  the text so far; the live region holds only the current line(s), the legend and the footer.
* ``loading_status`` is the spinner shown while models load.

Imports rich, ``specgen.events`` and the pure ``specgen.controller`` (for
``break_even_alpha``, the same formula the controller decides with).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.live import Live
from rich.measure import Measurement
from rich.segment import Segment
from rich.status import Status
from rich.table import Table
from rich.text import Text

from specgen.controller import break_even_alpha
from specgen.events import ACCEPTANCE_HOW, Done, FinishReason, Prefilled, Stats, Step

__all__ = [
    "LiveView",
    "ViewState",
    "apply",
    "body_text",
    "break_even_alpha",
    "console_has_color",
    "loading_status",
    "render",
    "render_summary",
    "turn_line",
    "turn_text",
]

Origin = Literal["draft", "lookup", "grammar", "target", "rejected", "prompt"]
"""Where a piece of text came from: an accepted draft-model token, an accepted
prompt-lookup token, a token the grammar forced (`Span.source`: no draft pass, and no
target row where the grammar allowed it alone), a token the target produced (residual resample,
bonus token or ordinary decoding), a rejected draft proposal, or the prompt (the user's
text, echoed dimmed above the reply as llama-cli echoes it)."""

Event = Prefilled | Step | Done

COLOR_STYLES: dict[Origin, str] = {
    "draft": "green",
    "lookup": "cyan",
    "grammar": "yellow",
    "target": "magenta",
    "rejected": "dim strike red",
    "prompt": "dim",
}
"""Styles per origin when color is on."""

MONO_STYLES: dict[Origin, str] = {
    "draft": "",
    "lookup": "underline",
    "grammar": "italic",
    "target": "bold",
    "rejected": "dim strike",
    "prompt": "dim",
}
"""Styles per origin under NO_COLOR: attributes only (NO_COLOR forbids color, not bold)."""

ORDINARY_HOW = "median of single-token target passes after the prompt"
"""How the loop measures ``Prefilled.ordinary_token_s`` and ``Step.timed_ordinary_s`` (said
next to the speedup; a single stream times them after its first token)."""
ROUNDS_HOW = "median of this run's ordinary rounds"
"""How the baseline is measured once the run's own K = 0 rounds decide it
(`specgen.controller.Baseline`)."""

FINISH_TEXT: dict[str, str] = {
    "length": "length (max tokens reached)",
    "context": "context full (raise -c to generate more)",
    "stop": "stop string",
    "eos": "end-of-generation token",
    "interrupted": "interrupted (Ctrl-C)",
}

# C0 control characters (except newline and tab) and DEL are shown as their Unicode
# "control pictures" so model output can never move the cursor or change terminal modes.
_CONTROL_PICTURES = {c: 0x2400 + c for c in range(32) if c not in (9, 10)} | {127: 0x2421}
_REJECTED_PICTURES = _CONTROL_PICTURES | {10: 0x21B5}  # a rejected newline shows as "↵"

Position = tuple[int, int]
"""(segment index, character offset) into ``ViewState.segments``."""


# --------------------------------------------------------------------------------------
# state


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
            origin = "lookup" if span.source == "lookup" else "draft"
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


# --------------------------------------------------------------------------------------
# pure rendering


def styles(state: ViewState) -> dict[Origin, str]:
    """The style per origin for this state (color or NO_COLOR)."""
    return COLOR_STYLES if state.color else MONO_STYLES


def body_text(
    state: ViewState,
    start: Position = (0, 0),
    end: Position | None = None,
    *,
    rejected: bool | None = None,
) -> Text:
    """The generated text from ``start`` up to ``end`` (exclusive), styled by origin.

    Rejected proposals appear only when ``rejected`` (default: ``state.show_rejected``);
    control characters are shown as visible symbols.
    """
    show_rejected = state.show_rejected if rejected is None else rejected
    style = styles(state)
    text = Text()
    segs = state.segments
    i0, off0 = start
    i1, off1 = end if end is not None else (len(segs), 0)
    run: list[str] = []
    run_origin: Origin | None = None
    for i in range(i0, min(i1, len(segs) - 1) + 1):
        piece, origin = segs[i]
        piece = piece[(off0 if i == i0 else 0) : (off1 if i == i1 else len(piece))]
        if not piece:
            continue
        if origin == "rejected":
            if not show_rejected:
                continue
            piece = piece.translate(_REJECTED_PICTURES)
        else:
            piece = piece.translate(_CONTROL_PICTURES)
        if origin != run_origin and run:
            text.append("".join(run), style[run_origin] if run_origin else "")
            run = []
        run_origin = origin
        run.append(piece)
    if run and run_origin is not None:
        text.append("".join(run), style[run_origin])
    return text


def legend(state: ViewState, *, rejected: bool | None = None) -> Text:
    """One line naming the style of each origin and the models; "rejected" is named when
    ``rejected`` (default: ``state.show_rejected``)."""
    style = styles(state)
    if state.draft_name is None:
        return Text.assemble(("target", style["target"]), f" {state.target_name}")
    parts: list[str | tuple[str, str]]
    if state.color:
        parts = [
            ("accepted draft", style["draft"]),
            f" ({state.draft_name}) · ",
            ("target", style["target"]),
            f" ({state.target_name})",
        ]
    else:
        parts = [
            "plain: accepted draft",
            f" ({state.draft_name}) · ",
            ("bold: target", style["target"]),
            f" ({state.target_name})",
        ]
    if state.lookup_seen:
        # named once prompt lookup has proposed an accepted token (hybrid drafting, ngram)
        parts += [" · ", ("lookup" if state.color else "underlined: lookup", style["lookup"])]
    if state.grammar_seen:
        # named once the grammar has forced a token (--grammar, --json-schema)
        parts += [" · ", ("grammar" if state.color else "italic: grammar", style["grammar"])]
    if state.show_rejected if rejected is None else rejected:
        parts += [" · ", ("rejected" if state.color else "struck: rejected", style["rejected"])]
    return Text.assemble(*parts)


def _count(n: int, one: str, many: str | None = None) -> str:
    """``n`` and the noun agreeing with it: "1 fallback round", "2 fallback rounds"."""
    return f"{n} {one if n == 1 else (many or one + 's')}"


def _pct(x: float) -> str:
    return f"{x:.1%}"


def time_split(stats: Stats) -> str:
    """'draft 40% · verify 50% · other 10%' of the decode wall time."""
    total = stats.decode_s
    if total <= 0:
        return "draft – · verify – · other –"
    other = max(0.0, total - stats.draft_s - stats.verify_s)
    return (
        f"draft {stats.draft_s / total:.0%} · verify {stats.verify_s / total:.0%}"
        f" · other {other / total:.0%}"
    )


def k_text(state: ViewState) -> str | None:
    """'K=5', 'fallback: ordinary decoding' (K = 0 with a drafter), 'ordinary decoding'
    (no drafter), or None before the first round."""
    if state.k is None:
        return None
    if state.k > 0:
        return f"K={state.k}"
    return "fallback: ordinary decoding" if state.draft_name is not None else "ordinary decoding"


def speedup_text(state: ViewState) -> str:
    """The speedup and how the ordinary-decoding baseline was obtained."""
    if state.draft_name is None:
        return "speedup n/a (this is ordinary decoding: the baseline itself)"
    if not state.ordinary_token_s:
        return "speedup n/a (ordinary decoding not timed)"
    base = f"ordinary {1.0 / state.ordinary_token_s:.1f} tok/s"
    how = f" ({state.ordinary_how})" if state.ordinary_how else ""
    sp = state.speedup
    head = f"speedup {sp:.2f}×" if sp is not None else "speedup –"
    return f"{head} vs {base}{how}"


def turn_line(state: ViewState) -> str:
    """One line after a chat reply: why it ended, tokens, tokens/s, acceptance, speedup,
    and how many prompt tokens the target evaluated (the rest were cached)."""
    s = state.stats
    reason = state.finish_reason or "interrupted"
    parts = [
        FINISH_TEXT.get(reason, reason),
        _count(s.n_generated, "token"),
        f"{s.tokens_per_s:.1f} tok/s",
    ]
    if state.draft_name is not None:
        parts.append(f"acceptance {_pct(s.acceptance_rate)}" if s.n_drafted else "nothing drafted")
        sp = state.speedup
        if sp is not None:
            parts.append(f"speedup {sp:.2f}×")
    parts.append(f"prefill {s.n_prefill} of {s.n_prompt} prompt tokens")
    return " · ".join(parts)


def turn_text(state: ViewState) -> Text:
    """``turn_line``, dimmed, for the line after a chat reply."""
    return Text(turn_line(state), style="dim")


def break_even_text(state: ViewState) -> str | None:
    """'break-even acceptance 35% at K=5' (or why there is none), None when unknown."""
    be = state.break_even
    if be is None:
        return None
    k, alpha = be
    if math.isinf(alpha):
        return f"break-even: none at K={k} (slower even at 100% acceptance)"
    if alpha <= 0.0:
        return f"break-even: any acceptance pays at K={k}"
    return f"break-even acceptance {alpha:.1%} at K={k}"


def footer(state: ViewState) -> RenderableType:
    """The running numbers: K, tokens, tokens/s, acceptance, tokens per target pass, time
    split, speedup over ordinary decoding with its baseline, break-even acceptance."""
    s = state.stats
    items: list[str] = []
    kt = k_text(state)
    if kt:
        items.append(kt)
    items += [
        f"{s.n_generated} tokens",
        f"{s.tokens_per_s:.1f} tok/s",
        f"acceptance {_pct(s.acceptance_rate)} of drafted" if s.n_drafted else "acceptance n/a",
        f"{s.tokens_per_pass:.2f} tok/pass",
        f"time: {time_split(s)}",
        speedup_text(state),
    ]
    be = break_even_text(state)
    if be:
        items.append(be)
    return Flow([Text(item) for item in items])


def render(state: ViewState, start: Position = (0, 0), tail: bool = False) -> RenderableType:
    """The whole view: text (colored by origin), legend line, footer. Pure.

    Args:
        state: what to show.
        start: show the text from this position (LiveView passes what it already printed).
        tail: keep only as many trailing lines of text as fit the terminal height above
            the legend and footer (for the live region).
    """
    bottom: list[RenderableType] = [Text("─" * 3, style="dim"), legend(state), footer(state)]
    body = body_text(state, start)
    if tail:
        return _Tail(body, bottom)
    return Group(body, *bottom)


def render_summary(state: ViewState) -> RenderableType:
    """The final summary: finish reason, models, totals, time split, speedup, break-even."""
    s = state.stats
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    reason = state.finish_reason or "interrupted"
    grid.add_row("finished", FINISH_TEXT.get(reason, reason))
    models = f"target {state.target_name}"
    if state.draft_name:
        models += f" · draft {state.draft_name}"
    if state.backend:
        models += f" · on {state.backend}"
    grid.add_row("models", models)
    grid.add_row("tokens", f"{s.n_generated} generated · {s.n_prompt} prompt")
    grid.add_row(
        "speed",
        f"{s.tokens_per_s:.1f} tok/s · ttft {s.ttft_s:.2f} s · prefill {s.prefill_s:.2f} s",
    )
    acc = (
        f"{_pct(s.acceptance_rate)} ({s.n_accepted} of {s.n_drafted} drafted) · {ACCEPTANCE_HOW}"
        if s.n_drafted
        else "n/a (nothing drafted)"
    )
    grid.add_row("acceptance", acc)
    passes = _count(s.target_passes, "target pass", "target passes")
    grid.add_row("per pass", f"{s.tokens_per_pass:.2f} tokens over {passes}")
    grid.add_row("time", f"decode {s.decode_s:.2f} s: {time_split(s)}")
    grid.add_row("speedup", speedup_text(state).removeprefix("speedup "))
    if s.baseline_note:
        grid.add_row("baseline", s.baseline_note)
    be = break_even_text(state)
    if be:
        grid.add_row("break-even", be.removeprefix("break-even").lstrip(": "))
    ks = [k for k in s.k_history if k > 0]
    if s.k_history and state.draft_name is not None:
        # the first round is ordinary by rule (the first token's latency), not a fallback
        fallback = sum(k == 0 for k in s.k_history[1:])
        mean_k = f"mean {sum(ks) / len(ks):.1f}" if ks else "no speculative rounds"
        grid.add_row("K", f"{mean_k} · {_count(fallback, 'fallback round')} of {len(s.k_history)}")
    return Group(Text("summary", style="bold underline"), grid)


class Flow:
    """Items laid out left to right, separated by ' · ', wrapping only between items
    (an item wider than the line wraps on its own)."""

    def __init__(self, items: Sequence[Text], sep: str = " · ") -> None:
        self.items = list(items)
        self.sep = sep

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        out = Text(end="")
        line_len = 0
        for item in self.items:
            n = item.cell_len
            if line_len and line_len + len(self.sep) + n > width:
                out.append("\n")
                line_len = 0
            elif line_len:
                out.append(self.sep, style="dim")
                line_len += len(self.sep)
            out.append_text(item)
            line_len += n
        yield out

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        widths = [i.cell_len for i in self.items] or [0]
        total = sum(widths) + len(self.sep) * (len(widths) - 1)
        return Measurement(min(max(widths), options.max_width), min(total, options.max_width))


class _Tail:
    """The last lines of ``body`` that fit above ``bottom`` in the terminal height."""

    def __init__(self, body: Text, bottom: Sequence[RenderableType]) -> None:
        self.body = body
        self.bottom = bottom

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        bottom = console.render_lines(Group(*self.bottom), options, pad=False)
        room = max(1, options.size.height - len(bottom) - 1)
        lines = console.render_lines(self.body, options, pad=False) if self.body else []
        new_line = Segment.line()
        for line in [*lines[-room:], *bottom]:
            yield from line
            yield new_line


# --------------------------------------------------------------------------------------
# live view


def console_has_color(console: Console) -> bool:
    """False when the console will not print colors (NO_COLOR set, or no color system)."""
    return not console.no_color and console.color_system is not None


class LiveView:
    """One ``rich.live.Live`` showing the text so far, the legend and the footer.

    Use as a context manager and feed it every event::

        with LiveView(console, state) as view:
            for event in events:
                view.update(event)

    Finished lines (up to a newline) are printed above the live region as they arrive, so
    the terminal's scrollback holds the whole text; the live region holds only the current
    line(s) and the footer, which keeps each redraw cheap however long the output grows.
    Rejected proposals (``show_rejected``) appear only in the live region: the text that
    stays on screen is the generated text alone, so a copy of it holds nothing else.
    Redraws happen at most every ``min_interval_s`` seconds, and further apart when a
    redraw is slow: the gap after a redraw that took d seconds is at least
    d / ``max_share`` (up to ``max_interval_s``), so drawing takes about that share of
    the wall time at most (1% by default; the budget for the live view is 3% of
    tokens/s). On exit, normal or not
    (KeyboardInterrupt included), the live region is removed, the rest of the text is
    printed, then the legend and the summary; the exception is not swallowed.

    Args:
        console: the stdout console (a terminal).
        state: the state to fold events into; ``state.color`` is switched off when the
            console shows no color.
        min_interval_s: minimum seconds between redraws (0.1 = at most 10 Hz).
        max_share: the largest fraction of wall time redraws may take (0 < share < 1).
        max_interval_s: the longest gap between redraws, seconds (the footer stays live
            even when a redraw is slow).
        clock: monotonic clock in seconds (injectable for tests).
        summary: print ``render_summary`` on exit.
    """

    def __init__(
        self,
        console: Console,
        state: ViewState,
        *,
        min_interval_s: float = 0.1,
        max_share: float = 0.01,
        max_interval_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        summary: bool = True,
    ) -> None:
        self.console = console
        self.state = state
        state.color = state.color and console_has_color(console)
        self.min_interval_s = min_interval_s
        self.max_share = max_share
        self.max_interval_s = max(min_interval_s, max_interval_s)
        self.redraw_s = 0.0
        """Seconds spent redrawing so far (by ``clock``)."""
        self._gap_s = min_interval_s
        self.clock = clock
        self.summary = summary
        self.n_refreshes = 0
        self._printed: Position = (0, 0)
        self._last_refresh = -math.inf
        self._live: Live | None = Live(
            _LiveRegion(self),
            console=console,
            auto_refresh=False,
            transient=True,
            vertical_overflow="visible",
        )

    def __enter__(self) -> LiveView:
        assert self._live is not None, "a LiveView is entered once"
        self._live.start()
        self.refresh()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None and self.state.finish_reason is None:
            if issubclass(exc_type, KeyboardInterrupt):
                self.state.finish_reason = "interrupted"
        self.close()

    def close(self) -> None:
        """Remove the live region, print the rest of the text and the summary (idempotent)."""
        if self._live is None:
            return
        live, self._live = self._live, None
        live.stop()
        rest = body_text(self.state, self._printed, rejected=False)
        self._printed = (len(self.state.segments), 0)
        self.console.print(rest, end="\n", crop=False)
        if self.summary:
            # the colours stay on screen: so does what they mean
            self.console.print(legend(self.state, rejected=False), crop=False)
            self.console.print()
            self.console.print(render_summary(self.state))

    def update(self, event: Event) -> None:
        """Fold one event and redraw if ``min_interval_s`` has passed (always on
        ``Prefilled`` and ``Done``)."""
        apply(self.state, event)
        now = self.clock()
        if isinstance(event, Step) and now - self._last_refresh < self._gap_s:
            return
        self._redraw(now)

    def refresh(self) -> None:
        """Redraw now, whatever the throttle says."""
        self._redraw(self.clock())

    def _redraw(self, now: float) -> None:
        if self._live is None:
            return
        self.n_refreshes += 1
        done = self._take_finished_lines()
        if done is None:
            self._live.refresh()
        else:
            # Printing above the live region redraws the region too (Rich's render hook),
            # and _LiveRegion draws the current state: one redraw either way.
            self.console.print(done, crop=False)
        self._last_refresh = self.clock()
        cost = max(0.0, self._last_refresh - now)
        self.redraw_s += cost
        self._gap_s = min(self.max_interval_s, max(self.min_interval_s, cost / self.max_share))

    def _take_finished_lines(self) -> Text | None:
        """Text that can go above the live region for good, or None; advances ``_printed``.

        That is everything up to the last newline, then, of the line being written, all
        wrapped rows but the last (greedy wrapping never moves a break before the last row
        when text is appended, so those rows are final).
        """
        parts: list[Text] = []
        segs = self.state.segments
        i0 = self._printed[0]
        for i in range(len(segs) - 1, i0 - 1, -1):
            piece, origin = segs[i]
            if origin == "rejected":
                continue
            pos = piece.rfind("\n")
            if pos < 0 or (i == i0 and pos < self._printed[1]):
                continue
            parts.append(body_text(self.state, self._printed, (i, pos), rejected=False))
            self._printed = _normalize(segs, (i, pos + 1))
            break
        # what goes above the live region stays on screen: the text without rejections
        rest = body_text(self.state, self._printed, rejected=False)
        width = self.console.width
        if rest.cell_len > width:
            rows = rest.wrap(self.console, width)
            plain = rest.plain
            used = 0
            for n, row in enumerate(rows):
                at = plain.find(row.plain, used)
                if at < 0 or plain[used:at].strip():
                    break  # the row is not a verbatim slice (tabs expanded): keep it live
                if n == len(rows) - 1:
                    used = at  # drop the whitespace the wrap dropped before the last row
                    break
                used = at + len(row.plain)
                parts.append(row)
            if parts and used:
                self._printed = _advance(self.state.segments, self._printed, used)
        if not parts:
            return None
        return Text("\n").join(parts)


class _LiveRegion:
    """The live region's renderable: whatever ``view``'s state is when Rich draws it."""

    def __init__(self, view: LiveView) -> None:
        self.view = view

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield render(self.view.state, self.view._printed, tail=True)


def _normalize(segs: Sequence[tuple[str, Origin]], pos: Position) -> Position:
    i, off = pos
    while i < len(segs) and off >= len(segs[i][0]):
        i, off = i + 1, 0
    return i, off


def _advance(segs: Sequence[tuple[str, Origin]], pos: Position, n: int) -> Position:
    """The position ``n`` characters of generated text after ``pos`` (rejections, never
    printed for good, count 0)."""
    i, off = pos
    while i < len(segs) and n > 0:
        piece, origin = segs[i]
        shown = len(piece) - off if origin != "rejected" else 0
        if n < shown:
            return i, off + n
        n -= shown
        i, off = i + 1, 0
    return _normalize(segs, (i, off))


# --------------------------------------------------------------------------------------
# loading status


class _Elapsed:
    """A status message followed by the seconds since ``start``, computed at each redraw."""

    def __init__(self, message: str, start: float, clock: Callable[[], float]) -> None:
        self.message = message
        self.start = start
        self.clock = clock

    def __rich__(self) -> Text:
        return Text.assemble(self.message, (f" {self.clock() - self.start:.1f} s", "dim"))


@contextmanager
def loading_status(
    console: Console,
    message: str,
    done: str | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[Status]:
    """A spinner with ``message`` and the seconds elapsed while the block runs, then one
    line saying how long it took: "✓ loaded target model in 1.2 s".

    Args:
        console: the stderr console.
        message: what is happening, e.g. "loading target model gemma-3-1b-it".
        done: the line's text on success (defaults to ``message``).
        clock: monotonic clock in seconds.

    Yields:
        The ``rich.status.Status`` (``.update(...)`` changes the spinner's message).
    """
    start = clock()
    outcome = "failed"
    try:
        with console.status(_Elapsed(message, start, clock), spinner="dots") as status:
            yield status
        outcome = "ok"
    except KeyboardInterrupt:
        outcome = "interrupted"
        raise
    finally:
        elapsed = clock() - start
        if outcome == "ok":
            line = Text.assemble(("✓ ", "green"), done or message, f" in {elapsed:.1f} s")
        else:
            line = Text.assemble(("✗ ", "red"), message, f" {outcome} after {elapsed:.1f} s")
        console.print(line)
