"""The live view's pure rendering: state in, renderable out (the shape of Rich's
``top_lite_simulator`` example). ``render(state)`` is the text so far with the legend and the
footer, ``render_summary(state)`` the final summary, ``turn_text(state)`` the line after a
chat reply; ``Flow`` and ``_Tail`` lay them out.

Imports rich, ``specgen.events`` and ``specgen.ui.state``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from specgen.events import ACCEPTANCE_HOW, Stats
from specgen.ui.state import Origin, Position, ViewState

__all__ = [
    "FINISH_TEXT",
    "body_text",
    "footer",
    "legend",
    "render",
    "render_summary",
    "turn_line",
    "turn_text",
]

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
