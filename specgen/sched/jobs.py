"""What crosses the seam between the HTTP side and the scheduler: a `Job` goes in (as a
`Ticket`), its events come out (`Step`, `Done`, or `Failed`) through the ticket's sink,
and a `BatchReport` per step goes to /metrics."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specgen.control.costs import Line
from specgen.events import Done, Prefilled, Step
from specgen.genconfig import GenerateConfig


@dataclass(frozen=True)
class Job:
    """One request (or one choice of a request with n > 1): token ids already templated
    and tokenized, and its settings.

    `share_from`: the id of the job (choice 0 of the same request, submitted just before)
    whose prompt cells this one shares instead of evaluating the prompt again: it is
    admitted once that job's prompt is in its slot, which then shares its cells
    (`SequenceView.copy_prefix`, llama_memory_seq_cp); when that job is no longer in a
    slot (ended, cancelled) it evaluates its prompt itself.
    """

    id: str
    prompt: list[int]
    config: GenerateConfig
    share_from: str | None = None


@dataclass(frozen=True)
class Failed:
    """The request ended by an error inside a round, a cancel or a shutdown before it
    started; `kind` is "engine", "grammar" (the request's own grammar failed
    mid-generation), "shutdown" or "cancelled"."""

    message: str
    kind: str


#: a Prefilled is sent to a single stream's slot, and to a server job that asked for the
#: prompt's log-probabilities (`Slots.announces`)
JobEvent = Prefilled | Step | Done | Failed
Sink = Callable[[JobEvent], None]
#: hands one step's events to their sinks, in the order they were sent (`Scheduler.deliver`)
Deliver = Callable[[list[tuple["Ticket", JobEvent]]], None]


class QueueFull(Exception):
    """`submit` while --queue jobs already wait (or the scheduler is shutting down)."""


class DoesNotFit(Exception):
    """The prompt plus max_tokens can never fit a slot's context (-c), or is empty."""


@dataclass(frozen=True)
class BatchReport:
    """One per step, for /metrics.

    Attributes:
        n_rows: target logits rows decoded in the step (prompt chunks add none).
        n_slots: slots generating in the step.
        k: K chosen per generating slot.
        decode_s: seconds inside the target's llama_decode.
        draft_s: seconds of stage 1 (all slots' drafting).
        step_s: wall seconds of the step.
        host_s: step_s minus the time inside llama_decode (both models).
        queue_depth, slots_busy: after the step.
        target_line, draft_line: the batch controller's cost lines after the step
            (seconds against a decode's rows, and a draft depth's slots); None with a
            fixed K.
        draft_token_s: seconds of a draft token without a logits row (a catch-up's),
            after the step; None with a fixed K.
        spec_overhead_s: the controller's `spec_overhead_s` after the step (None with a
            fixed K).
        speed_changes: times the controller found the machine's speed changed and
            rescaled its cost lines (`BatchController.observe_target`), so far.
        itl: (slot index, seconds, tokens) per slot that was sent tokens in the step after
            an earlier step had sent its request some: the gap between the two sends (an
            inter-token latency per streamed chunk, as `specgen bench --url` counts ITL)
            and the tokens of this chunk; a request's first tokens (its TTFT) are not in it.
        reasons: why each K in `k` is what it is (`specgen.control.goodput.REASONS`), then
            "first" for each request whose first round rode on its prefill this step.
    """

    n_rows: int
    n_slots: int
    k: tuple[int, ...]
    decode_s: float
    draft_s: float
    step_s: float
    host_s: float
    queue_depth: int
    slots_busy: int
    target_line: Line | None = None
    draft_line: Line | None = None
    spec_overhead_s: float | None = None
    speed_changes: int = 0
    draft_token_s: float | None = None
    itl: tuple[tuple[int, float, int], ...] = ()
    reasons: tuple[str, ...] = ()


class Ticket:
    """A submitted job: pass it to `Scheduler.cancel`. `t_submit`: the scheduler's clock
    when it was queued (what its wait for a first token counts from)."""

    def __init__(self, job: Job, sink: Sink, t_submit: float = 0.0) -> None:
        self.job = job
        self.sink = sink
        self.cancelled = False
        self.t_submit = t_submit


def deliver_each(batch: list[tuple[Ticket, JobEvent]]) -> None:
    """The default `Deliver`: each event to its ticket's sink, in order; a sink that
    raises loses that event only."""
    for ticket, event in batch:
        try:
            ticket.sink(event)
        except Exception:  # noqa: BLE001 - one client's broken sink must not stop the rounds
            pass
