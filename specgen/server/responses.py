"""One request's life on the async side from its jobs' submission (`submit`): the events
the worker thread hands it (one queue per request, `Events`; a step's events for all
requests in one ``loop.call_soon_threadsafe``: `deliver`), and the response they become
(`Run`: one JSON body, or server-sent events), with its metrics and log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from sse_starlette import EventSourceResponse
from starlette.types import Message, Receive, Scope, Send

from specgen import (
    DoesNotFit,
    Done,
    Failed,
    GenerateConfig,
    Job,
    Prefilled,
    PromptError,
    QueueFull,
    Step,
    Ticket,
)
from specgen.server import tools
from specgen.server.requestconfig import RequestError
from specgen.server.shapes import Outcome, Shape

if TYPE_CHECKING:
    from specgen.server.app import Backend, SchedulerLike, State

__all__ = ["ClientStalled", "Events", "Run", "Streamed", "deliver", "submit"]

RETRY_AFTER_S = 1  # a 503 queue_full's Retry-After, seconds
_POLL_S = 0.5  # how often a non-streaming request checks that its client is still there


class Events:
    """One request's events, handed from the worker thread to the event loop: one queue
    of (choice index, event), and a sink per choice (`choice`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[tuple[int, Prefilled | Step | Done | Failed]] = asyncio.Queue()
        self.index = 0

    def choice(self, index: int) -> Events:
        """The sink of choice `index` (the same queue)."""
        if index == 0:
            return self
        sink = Events.__new__(Events)
        sink.loop, sink.queue, sink.index = self.loop, self.queue, index
        return sink

    def __call__(self, event: Prefilled | Step | Done | Failed) -> None:
        _post(self.loop, [(self.queue, (self.index, event))])


def deliver(batch: list[tuple[Ticket, Prefilled | Step | Done | Failed]]) -> None:
    """The scheduler's `Deliver` for the server: one step's events for every request
    reach their queues in one wake-up of each event loop, in the order sent (a wake-up
    per event let the loop take the GIL while the worker still committed other slots).
    Sinks that are not a request's `Events` are called in turn."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[Any], Any]]] = {}
    for ticket, event in batch:
        sink = ticket.sink
        if isinstance(sink, Events):
            by_loop.setdefault(sink.loop, []).append((sink.queue, (sink.index, event)))
        else:
            with contextlib.suppress(Exception):  # a broken sink loses its own event only
                ticket.sink(event)
    for loop, items in by_loop.items():
        _post(loop, items)


def _post(loop: asyncio.AbstractEventLoop, items: list[tuple[asyncio.Queue[Any], Any]]) -> None:
    def put() -> None:
        for queue, event in items:
            queue.put_nowait(event)

    try:
        loop.call_soon_threadsafe(put)
    except RuntimeError:  # the loop has closed (the process is ending): nobody listens
        pass


def jobs_of(
    job_id: str, prompts: Sequence[list[int]], configs: Sequence[GenerateConfig], n: int
) -> list[Job]:
    """A request's jobs, n per prompt: choice ``p * n + i`` is prompt p's i-th, drawing
    from its own random stream, ``seed + i`` (the stream of the prompt sent alone with
    ``seed + i``), and sharing the prompt's cells with the prompt's choice 0 after its one
    prefill. Job ids: `job_id` for choice 0, ``{job_id}-{index}`` for the others."""
    jobs = []
    for p, (prompt, config) in enumerate(zip(prompts, configs, strict=True)):
        first = job_id if p == 0 else f"{job_id}-{p * n}"
        jobs.append(Job(first, prompt, config))
        for i in range(1, n):
            seed = None if config.seed is None else config.seed + i
            with_seed = dataclasses.replace(config, seed=seed)
            jobs.append(Job(f"{job_id}-{p * n + i}", prompt, with_seed, first))
    return jobs


def submit(
    scheduler: SchedulerLike,
    job_id: str,
    prompts: Sequence[list[int]],
    configs: Sequence[GenerateConfig],
    n: int,
) -> tuple[list[Job], list[Ticket], Events]:
    """Queue a request's jobs (`jobs_of`) all or none: their events go to one `Events`.

    Raises:
        RequestError: 503 ``queue_full`` when they do not all fit the queue now (none is
            left queued); 400 ``context_length_exceeded`` for a prompt that can never fit.
    """
    jobs = jobs_of(job_id, prompts, configs, n)
    events = Events(asyncio.get_running_loop())
    tickets: list[Ticket] = []
    try:
        for i, job in enumerate(jobs):
            tickets.append(scheduler.submit(job, events.choice(i)))
    except QueueFull:
        for t in tickets:
            scheduler.cancel(t)
        raise RequestError(
            503,
            f"all {scheduler.n_parallel} slots are busy and the queue is full: retry later",
            type_="unavailable_error",
            code="queue_full",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        ) from None
    except (DoesNotFit, PromptError) as e:
        for t in tickets:
            scheduler.cancel(t)
        raise RequestError(400, str(e), code="context_length_exceeded") from None
    return jobs, tickets, events


def _sse(body: dict[str, Any] | BaseModel) -> dict[str, str]:
    data = body.model_dump() if isinstance(body, BaseModel) else body
    return {"data": json.dumps(data, ensure_ascii=False, separators=(",", ":"))}


class Run:
    """One request's submitted jobs (one per choice): their events in, the response out,
    and its log line."""

    def __init__(
        self,
        state: State,
        b: Backend,
        jobs: list[Job],
        tickets: list[Any],
        events: Events,
        shape: Shape,
        route: str,
    ) -> None:
        self.state, self.backend, self.jobs, self.tickets = state, b, jobs, tickets
        self.events, self.shape, self.route = events, shape, route
        self.steps: list[list[Step]] = [[] for _ in jobs]
        self.outcomes: list[Outcome | None] = [None for _ in jobs]
        self.t0 = time.perf_counter()
        # the first token's wall time, for a request that ends without its stats (cancelled)
        self.first_token_s: float | None = None
        self.ended = False
        # how a request that ends before its choices do is counted, and why (logged)
        self.cut, self.cut_why = "cancelled", ""
        state.in_flight += 1

    async def next_event(self) -> tuple[int, Prefilled | Step | Done | Failed]:
        return await self.events.queue.get()

    def _step(self, index: int, step: Step) -> None:
        self.steps[index].append(step)
        if self.first_token_s is None and step.spans:
            self.first_token_s = time.perf_counter() - self.t0

    def _finish(self, outcomes: list[Outcome]) -> None:
        """Count and log a request that ended (once)."""
        if self.ended:
            return
        self.ended = True
        self.state.in_flight -= 1
        all_steps = [x for steps in self.steps for x in steps]
        n_gen = 0
        for steps, o in zip(self.steps, outcomes, strict=True):
            s = o.stats
            n_gen += s.n_generated if s is not None else sum(len(x.spans) for x in steps)
        proposed = sum(x.n_proposed for x in all_steps)
        accepted = sum(x.n_accepted for x in all_steps)
        first = outcomes[0]
        self.state.metrics.observe_request(
            self.route,
            first.finish,
            self.shape.n_prompt,
            n_gen,
            all_steps,
            first.stats.ttft_s if first.stats is not None else self.first_token_s,
            time.perf_counter() - self.t0,
            sum(o.stats.n_prefill for o in outcomes if o.stats is not None),
        )
        acc = f"{accepted / proposed:.1%} of {proposed} proposed" if proposed else "n/a"
        tps = f"{first.stats.tokens_per_s:.1f} tok/s" if first.stats is not None else "- tok/s"
        choices = f" in {len(outcomes)} choices" if len(outcomes) > 1 else ""
        self.state.log(
            f"{self.jobs[0].id} {self.route}: prompt {self.shape.n_prompt} tokens, output"
            f" {n_gen} tokens{choices}, acceptance {acc}, {tps}, finish {first.finish}"
            + (f" ({self.cut_why})" if self.cut_why and first.finish == self.cut else "")
        )

    def _prefilled(self, index: int, event: Prefilled) -> None:
        """Sent only to a job that asked for its prompt's log-probabilities (echo with
        logprobs): a prompt's choice 0's are all its choices' (they share its prompt)."""
        echo = self.shape.echo_of(index)
        if index % self.shape.n == 0 and echo is not None:
            echo.logprobs = event.prompt_logprobs

    def cancel(self) -> None:
        """Cancel the jobs still running and count the request as ended (once: a second
        call does nothing)."""
        if not self.ended:
            for t in self.tickets:
                self.backend.scheduler.cancel(t)
            self._finish([o or Outcome("", self.cut, None, None) for o in self.outcomes])

    async def whole(self, request: Request) -> Response:
        """The non-streaming response (`body`), or 499 when the client left first."""
        body = await self.body(request)
        return Response(status_code=499) if body is None else JSONResponse(body)

    async def body(self, request: Request) -> dict[str, Any] | None:
        """Wait for every choice's end, then the response body; cancel the jobs and return
        None if the client leaves first (looked for every `_POLL_S`, between events too: a
        job that sends them all the time kept its slot to its end when only a pause in them
        was checked)."""
        checked = time.perf_counter()
        while True:
            ev: Prefilled | Step | Done | Failed | None = None
            try:
                i, ev = await asyncio.wait_for(self.next_event(), _POLL_S)
            except asyncio.TimeoutError:
                pass
            if ev is None or time.perf_counter() - checked >= _POLL_S:
                checked = time.perf_counter()
                if await request.is_disconnected():
                    self.cancel()
                    return None
            if ev is None:
                continue
            if isinstance(ev, Prefilled):
                self._prefilled(i, ev)
            elif isinstance(ev, Step):
                self._step(i, ev)
            elif isinstance(ev, Done):
                self.outcomes[i] = Outcome.of_done(ev)
                if all(o is not None for o in self.outcomes):
                    outcomes = [o for o in self.outcomes if o is not None]
                    self._finish(outcomes)
                    return self.shape.full_n(self.steps, outcomes)
            else:
                self.outcomes[i] = Outcome("", _failed(ev), None, None)
                self.cancel()
                raise _failure(ev, self.jobs[i])

    async def stream(self, include_usage: bool) -> AsyncIterator[dict[str, str]]:
        """Server-sent events: `chunks`, then ``[DONE]``."""
        try:
            async for chunk in self.chunks(include_usage):
                yield _sse(chunk)
            yield {"data": "[DONE]"}
        finally:  # closed at a yield of ours, `chunks` would be finished only when collected
            self.cancel()

    async def chunks(self, include_usage: bool) -> AsyncIterator[dict[str, Any]]:
        """The stream's chunks: the role, one chunk per round of a choice (its ``index``),
        each choice's final chunk with finish_reason and statistics, then the usage chunk
        when asked. Closing it early (the client went away) frees the slots."""
        written = [0 for _ in self.jobs]
        # with tool calls, content streams through a gate per choice (`tools.ContentGate`)
        calls = self.shape.tools
        gates = [
            tools.ContentGate(calls.kind == "auto") if calls is not None else None
            for _ in self.jobs
        ]
        held: list[list[Step]] = [[] for _ in self.jobs]  # rounds whose text the gate kept
        try:
            opened = [False for _ in self.jobs]
            echoed = [self.shape.echo_of(i) is None for i in range(len(self.jobs))]
            while True:
                i, ev = await self.next_event()
                if isinstance(ev, Prefilled):
                    self._prefilled(i, ev)
                    continue
                if not opened[i]:
                    # the role with the choice's first token, as llama-server and vLLM send
                    # it: sent before the prefill, it made a client that times its first
                    # chunk (vLLM's benchmark) report the time to first token as ~0
                    opened[i] = True
                    first = self.shape.first_chunk(i)
                    if first is not None:
                        yield first
                if not echoed[i]:  # the prompt first, with its log-probabilities by now
                    echoed[i] = True
                    yield self.shape.echo_chunk(i)
                if isinstance(ev, Step):
                    self._step(i, ev)
                    gate = gates[i]
                    if gate is not None:  # calls are sent whole, as delta.tool_calls, at the end
                        content = gate.feed(ev.text)
                        if content:
                            yield self.shape.step_chunk(ev, content, i, held[i])
                            held[i] = []
                        else:
                            held[i].append(ev)
                        continue
                    written[i] += len(ev.text)
                    if ev.text or self.shape.logprobs:  # a round that released no text
                        # (a character's first bytes) has nothing to send, but its logprobs
                        yield self.shape.step_chunk(ev, index=i)
                    continue
                if isinstance(ev, Done):
                    outcome = Outcome.of_done(ev)
                    rest = ev.text[written[i] :]
                else:
                    info = _failure(ev, self.jobs[i]).info()
                    outcome = Outcome("", _failed(ev), None, info)
                    rest = ""
                self.outcomes[i] = outcome
                gate = gates[i]
                released = gate.released if gate is not None else 0
                for chunk in self.shape.final_chunks(
                    self.steps[i], outcome, rest, released, i, held[i]
                ):
                    yield chunk
                if any(o is None for o in self.outcomes):
                    continue
                outcomes = [o for o in self.outcomes if o is not None]
                self._finish(outcomes)
                if include_usage:
                    yield self.shape.usage_chunk_n(self.steps, outcomes)
                return
        finally:
            # the client went away (sse-starlette cancels this generator) or the
            # response failed: free the slots
            self.cancel()


def _failed(ev: Failed) -> str:
    """The finish a request ended by `ev` is counted and logged with: a shutdown's is
    "interrupted", as for the requests it stops mid-generation (a queued one read "failed",
    as a server error does)."""
    return "interrupted" if ev.kind == "shutdown" else "failed"


def _failure(ev: Failed, job: Job) -> RequestError:
    if ev.kind == "shutdown":
        return RequestError(503, ev.message, type_="unavailable_error", code="shutdown")
    if ev.kind == "grammar":  # the request's grammar failed mid-generation: its own error
        g = job.config.grammar  # named by the field it came from, as a compile error is
        param = g.source if g is not None else "grammar"
        return RequestError(400, ev.message, param=param, code="invalid_grammar")
    return RequestError(500, ev.message, type_="server_error", code=ev.kind)


class ClientStalled(Exception):
    """A streamed response's client took none of it for the send timeout (`Streamed`)."""


class Streamed(EventSourceResponse):
    """`Run.stream` as server-sent events, each send given `timeout_s` seconds.

    A client that takes nothing for that long (it stopped reading: its socket's buffers
    are full) has its stream ended, its connection closed and its slots freed, counted
    with finish ``stalled``, as nginx's ``send_timeout`` (60 s between two writes) and
    llama-server's ``--timeout`` close such a connection. Without it the client held its
    slot to the end of its generation, a share of every step for the others. A slow
    generation is not a stall: the timeout counts only while a send waits for the client.

    Raises (to uvicorn, which closes the connection; `specgen.server.runner` keeps it out
    of the log): ClientStalled.
    """

    def __init__(
        self,
        run: Run,
        include_usage: bool,
        timeout_s: float,
        events: AsyncIterator[dict[str, str]] | None = None,
    ) -> None:
        """`events`: what is sent (sse-starlette's dicts); `run.stream` when None."""
        super().__init__(events or run.stream(include_usage), sep="\n")
        self.run, self.timeout_s = run, timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def timed(message: Message) -> None:
            try:
                await asyncio.wait_for(send(message), self.timeout_s)
            except asyncio.TimeoutError:
                # read by the stream's cleanup, which runs as this propagates
                why = f"the client took no data for {self.timeout_s:g} s"
                self.run.cut, self.run.cut_why = "stalled", why
                raise ClientStalled(f"{self.run.jobs[0].id}: {why}") from None

        await super().__call__(scope, receive, timed)
