"""What a `specgen.Pair` call gives back: a `Generation` under way (its events) and a
finished `Result`."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specgen.events import Done, FinishReason, Prefilled, Stats, Step

if TYPE_CHECKING:
    from specgen.flags import SamplingFlags
    from specgen.generate import OneSlot
    from specgen.logprobs import TokenLogprob

Event = Prefilled | Step | Done


@dataclass(frozen=True)
class Result:
    """One finished generation.

    Attributes:
        text: the generated text (the prompt excluded).
        tokens: the generated token ids.
        finish: why it ended: "length" (max_tokens), "eos", "stop", "context" or
            "interrupted".
        stats: the counts and timings of `specgen run --json`'s ``stats`` (seconds; see
            docs/reference/json.md), typed: ``stats.n_drafted``, ``stats.n_accepted``,
            ``stats.acceptance_rate``, ``stats.acceptance_how``, ``stats.k_history`` (the
            block size of each round), ``stats.wall_s``, ``stats.tokens_per_s``...;
            ``stats.to_dict()`` is that JSON object, key for key.
        seed: the seed used (a random one when none was given).
        logprobs: with ``logprobs=N``, one `specgen.logprobs.TokenLogprob` per generated
            token (its log-probability under the target's raw logits, natural log, and
            the N most likely tokens there); None when not asked.
        controller: with ``draft_max="auto"`` and a drafter, the block-size controller's
            decisions (`run --json`'s ``controller`` object); None otherwise.
    """

    text: str
    tokens: tuple[int, ...]
    finish: FinishReason
    stats: Stats
    seed: int
    logprobs: tuple[TokenLogprob, ...] | None = None
    controller: dict[str, object] | None = None

    @property
    def acceptance_rate(self) -> float:
        """Accepted proposals over tested proposals (0 when nothing was drafted)."""
        return self.stats.acceptance_rate


class Generation:
    """One generation under way (`Pair.stream`, `Pair.stream_chat`): an iterator over its
    events (`Prefilled`, a `Step` per round, `Done`). Closing it early (``close()``)
    stops generating and leaves the models ready for the next call;
    ``throw(KeyboardInterrupt)`` ends it as Ctrl-C does (the next event is the `Done`,
    finish reason "interrupted").

    Attributes:
        seed: the seed used (a random one when none was given).
        settings: the call's settings, validated (`SamplingFlags`).
        n_prompt: prompt tokens (after the chat template, for a chat).
    """

    def __init__(self, run: OneSlot, seed: int, settings: SamplingFlags, n_prompt: int) -> None:
        self._run = run
        self._events = run.events()
        self.seed = seed
        self.settings = settings
        self.n_prompt = n_prompt

    def __iter__(self) -> Generation:
        return self

    def __next__(self) -> Event:
        return next(self._events)

    def close(self) -> None:
        self._events.close()

    def throw(self, exc: BaseException) -> Event:
        """Raise `exc` inside the loop (Ctrl-C: ``KeyboardInterrupt``); the next event."""
        return self._events.throw(exc)

    @property
    def controller(self) -> dict[str, object] | None:
        """With ``draft_max="auto"`` and a drafter, the block-size controller's decisions
        so far (`run --json`'s ``controller`` object); None otherwise."""
        return self._run.summary()


def result_of(gen: Generation) -> Result:
    """Run `gen` to its end: the `Result`."""
    return result_from(gen, gen.seed, gen.settings.logprobs is not None, lambda: gen.controller)


def result_from(
    events: Iterable[object],
    seed: int,
    logprobs: bool,
    controller: Callable[[], dict[str, object] | None] | None = None,
) -> Result:
    """The `Result` of one generation's events (`Step`..., then its `Done`; other events
    are passed over); `logprobs`: collect the Steps' `TokenLogprob`s; `controller`, read
    after the Done: the controller's decisions (`Generation.controller`).

    Raises:
        ValueError: the events hold no Done.
    """
    done: Done | None = None
    found: list[TokenLogprob] = []
    for ev in events:
        if isinstance(ev, Done):
            done = ev
        elif isinstance(ev, Step) and logprobs:
            found.extend(s.logprob for s in ev.spans if s.logprob is not None)
    if done is None:
        raise ValueError("the generation ended without a Done event")
    return Result(
        done.text, done.tokens, done.finish_reason, done.stats, seed,
        tuple(found) if logprobs else None, controller() if controller is not None else None,
    )  # fmt: skip


def consume(events: Iterator[Any], fold: Callable[[Any], None]) -> Done | None:
    """Fold every event of one generation and return its Done (None if it never came).

    Ctrl-C here, between events or while `fold` handles one, is thrown into the events
    rather than closing them (`relay`): the loop then ends the generation with finish
    reason "interrupted" and its Done, as when Ctrl-C lands inside the loop; the interrupt
    that follows that Done ends the consumption only."""
    done: Done | None = None

    def each(ev: Any) -> None:
        nonlocal done
        if isinstance(ev, Done):
            done = ev
        fold(ev)

    try:
        for _ in relay(events, each):
            pass
    except KeyboardInterrupt:
        pass
    return done


def relay(events: Iterator[Any], each: Callable[[Any], None]) -> Generator[Any, None, None]:
    """Pass `events` through, calling `each` on every event before it is yielded (a trace
    writer, a warning). Ctrl-C inside `each`, or thrown in at the yield, is thrown into
    `events` (so the loop ends the generation with its Done, which is passed on) instead
    of ending this generator without it. Closing this generator closes `events`."""
    interrupt = False
    try:
        while True:
            try:
                ev = events.throw(KeyboardInterrupt) if interrupt else next(events)  # type: ignore[attr-defined]
            except StopIteration:
                return
            interrupt = False
            try:
                each(ev)
            except KeyboardInterrupt:
                interrupt = True
            try:
                yield ev
            except KeyboardInterrupt:
                interrupt = True
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()
