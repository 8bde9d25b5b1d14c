"""Progress on stderr: the bar over `specgen bench`'s generations and the download bars."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)


@contextmanager
def bench_progress(err: Any) -> Iterator[tuple[Callable[[Any], None], Callable[[str], None]]]:
    """A bar on ``err`` (transient; a log line per configuration when not a terminal);
    yields bench's ``(progress, status)`` hooks."""
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=err, transient=True, disable=not err.is_terminal) as bar:
        task = bar.add_task("loading models", total=None)

        last = [""]

        def on_progress(p) -> None:
            bar.update(task, completed=p.done, total=p.total, description=p.description)
            stage = p.description.split(" · ")[0]
            if not err.is_terminal and stage != last[0]:  # a log line per configuration
                last[0] = stage
                err.print(f"[{p.done}/{p.total}] {stage}", highlight=False, markup=False)

        def on_status(msg: str) -> None:
            bar.update(task, description=msg)

        yield on_progress, on_status


@contextmanager
def stage_status(err: Any, message: str) -> Iterator[Callable[[str], None]]:
    """A spinner on ``err`` while the block runs; yields its update hook. Where ``err`` is
    not a terminal (a spinner shows nothing there), each new stage is printed as a line
    instead: the message up to its first ", ", so per-sample counters do not flood a log."""
    last = [""]
    with err.status(message) as spinner:

        def update(msg: str) -> None:
            spinner.update(msg)
            stage = msg.split(", ")[0]
            if not err.is_terminal and stage != last[0]:
                last[0] = stage
                err.print(stage, highlight=False, markup=False)

        yield update


@contextmanager
def download_bars(console: Any) -> Iterator[Callable[[str, int, int | None], None]]:
    """Rich progress bars on ``console`` (stderr), one per file; yields the progress hook."""
    tasks: dict[str, Any] = {}
    bars = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
    )

    def hook(filename: str, done: int, total: int | None) -> None:
        if not tasks:
            bars.start()  # lazily: an error before the first byte prints no empty bar
        if filename not in tasks:
            tasks[filename] = bars.add_task(filename, total=total)
        bars.update(tasks[filename], completed=done, total=total)

    try:
        yield hook
    finally:
        if tasks:
            bars.stop()


@contextmanager
def load_progress(err: Any) -> Iterator[Callable[[Any], None]]:
    """`specgen bench --url`'s bar on ``err``: requests done, in flight, failed (transient; a
    log line per server and level when not a terminal); yields the progress hook."""
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[flight]} in flight · {task.fields[failed]} failed"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err, transient=True, disable=not err.is_terminal) as bar:
        task = bar.add_task("reading the servers", total=None, flight=0, failed=0)
        last = [""]

        def on_progress(p) -> None:
            bar.update(task, completed=p.done, total=p.total, description=p.description,
                       flight=p.in_flight, failed=p.failed)  # fmt: skip
            if not err.is_terminal and p.description != last[0]:
                last[0] = p.description
                err.print(f"[{p.done}/{p.total}] {p.description}", highlight=False, markup=False)

        yield on_progress
