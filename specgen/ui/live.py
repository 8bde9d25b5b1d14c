"""The live view of `specgen run` and `specgen chat`, and the loading spinner.

* ``LiveView`` owns the one ``rich.live.Live`` and decides *when* to draw (at most every
  ``min_interval_s`` seconds) and *what stays on screen*: finished lines of text are printed
  above the live region as soon as their newline arrives, so the scrollback always holds
  the text so far; the live region holds only the current line(s), the legend and the footer.
  What it draws is a function of its state (``specgen.ui.state``), rendered by the pure
  functions of ``specgen.ui.text``.
* ``loading_status`` is the spinner shown while models load.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import TracebackType

from rich.console import Console, ConsoleOptions, RenderResult
from rich.live import Live
from rich.status import Status
from rich.text import Text

from specgen.events import Step
from specgen.ui.state import Event, Origin, Position, ViewState, apply
from specgen.ui.text import body_text, legend, render, render_summary

__all__ = ["LiveView", "console_has_color", "loading_status"]


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
