"""What a `specgen.Pair` call gives back: a `Generation` under way (its events) and a
finished `Result`."""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specgen.errors import BusyError
from specgen.events import Done, FinishReason, Prefilled, Stats, Step, relay

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
        finish: why it ended (also `finish_reason`): "length" (max_tokens), "eos", "stop",
            "context" or "interrupted".
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

    @property
    def finish_reason(self) -> FinishReason:
        """`finish`, under the name `Done` and OpenAI's responses give it."""
        return self.finish


class Busy:
    """One generation at a time on a `Pair`'s models: `take` before a call touches them
    (its caches, its drafter's record), `release` once it has ended. A second call while
    one is open, from this thread (a stream not finished) or another, is refused, never
    run: it would truncate the caches under the first (wrong text with no error, or
    llama.cpp's ``GGML_ASSERT``), and waiting could wait for ever on a stream nobody
    finishes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def take(self) -> None:
        """Raises:
        BusyError: a generation of this Pair is open."""
        if not self._lock.acquire(blocking=False):
            raise BusyError(
                "this Pair is generating already (an unfinished stream, or a call from"
                " another thread): finish or close that generation first; one Pair runs one"
                " generation at a time (for concurrent requests use specgen serve or"
                " Pair.scheduler(), or a Pair per thread)"
            )

    def release(self) -> None:
        self._lock.release()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """`take`, then `release` when the block ends, however it ends."""
        self.take()
        try:
            yield
        finally:
            self.release()


class Generation:
    """One generation under way (`Pair.stream`, `Pair.stream_chat`): an iterator over its
    events (`Prefilled`, a `Step` per round, `Done`). Closing it early (``close()``)
    stops generating and leaves the models ready for the next call;
    ``throw(KeyboardInterrupt)`` ends it as Ctrl-C does (the next event is the `Done`,
    finish reason "interrupted"; before the first event it is raised at once), and
    ``cancel()`` does so from another thread; a ``with`` block closes it. Until it has
    ended (its `Done` handed out, ``close()``, or the object dropped), the Pair's other
    calls raise `specgen.BusyError`. After an interrupted `Done`, the next call raises
    ``KeyboardInterrupt``, as the generator it wraps does: Ctrl-C is never swallowed.

    Attributes:
        seed: the seed used (a random one when none was given).
        settings: the call's settings, validated (`SamplingFlags`).
        n_prompt: prompt tokens (after the chat template, for a chat).
    """

    def __init__(
        self,
        run: OneSlot,
        seed: int,
        settings: SamplingFlags,
        n_prompt: int,
        release: Callable[[], None] | None = None,
    ) -> None:
        self._run = run
        # once, whichever comes first: the last event, close(), or the object's end (the
        # events do not hold this object: a cycle would keep a dropped stream alive, and
        # its Pair busy, until the garbage collector ran)
        self._ended = _Once(release)
        self._events = run.events()
        # what the events raised after their Done (Ctrl-C's KeyboardInterrupt), for the
        # next call: the Done frees the Pair at once (`_finish`)
        self._after: BaseException | None = None
        self.seed = seed
        self.settings = settings
        self.n_prompt = n_prompt

    def __del__(self) -> None:
        self._ended()  # a stream dropped unfinished

    def __iter__(self) -> Generation:
        return self

    def __next__(self) -> Event:
        return self._advance(None)

    @property
    def alive(self) -> bool:
        """Whether the generation can still run or take an interrupt (`throw`): it has not
        ended. A Ctrl-C that lands in a caller's frame above the loop leaves it alive, so
        the caller can throw it in (`specgen.events.relay`) and still get the Done."""
        return inspect.getgeneratorstate(self._events) != inspect.GEN_CLOSED

    def _advance(self, exc: BaseException | None) -> Event:
        after, self._after = self._after, None
        if exc is not None and not self.alive:
            raise exc  # thrown after the end (Ctrl-C after the Done), as a generator does
        if after is not None:
            raise after
        try:
            event = next(self._events) if exc is None else self._events.throw(exc)
        except BaseException:
            if not self.alive:  # it ended (its last event, an error, Ctrl-C after the Done)
                self._ended()
            raise
        if isinstance(event, Done):
            self._finish()
        return event

    def _finish(self) -> None:
        """After the Done: the events run to their end now, so that the Pair is free as
        soon as the caller holds the Done (a caller may break out at the Done and call
        again); what they raise then waits for the next call."""
        try:
            next(self._events)
        except StopIteration:
            pass
        except BaseException as e:  # KeyboardInterrupt after an interrupted Done
            self._after = e
        else:  # nothing comes after a Done
            self._events.close()
        self._ended()

    def close(self) -> None:
        self._events.close()
        self._ended()

    def cancel(self) -> None:
        """Stop it from any thread (a web app's client gone, an asyncio task cancelled),
        where ``close()`` may be called only by the thread iterating: after the round
        under way the next event is the `Done` (finish reason "interrupted"), which frees
        the Pair. Does not wait; calling it after the end changes nothing."""
        self._run.cancel()

    def __enter__(self) -> Generation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def throw(self, exc: BaseException) -> Event:
        """Raise `exc` inside the loop (Ctrl-C: ``KeyboardInterrupt``); the next event.
        Before the first event nothing has run: the generation is closed (the Pair free)
        and `exc` raised here, as a generator not started raises it."""
        if inspect.getgeneratorstate(self._events) == inspect.GEN_CREATED:
            # a generator not started raises `exc` without entering its `finally`: the
            # Pair stayed busy until the garbage collector freed the traceback's frames
            self.close()
            raise exc
        return self._advance(exc)

    @property
    def controller(self) -> dict[str, object] | None:
        """With ``draft_max="auto"`` and a drafter, the block-size controller's decisions
        so far (`run --json`'s ``controller`` object); None otherwise."""
        return self._run.summary()


class _Once:
    def __init__(self, call: Callable[[], None] | None) -> None:
        self._call = call

    def __call__(self) -> None:
        call, self._call = self._call, None
        if call is not None:
            call()


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
