"""PLACEHOLDER for the agreed seam (notes: SERVER_API.md) until the scheduler is merged:
the types the HTTP side uses, verbatim from the interface, and no `Scheduler`. When the
real module arrives, it replaces this file whole (take its version on a merge conflict).
"""

from __future__ import annotations

from dataclasses import dataclass

from specgen.events import Done, Step
from specgen.generate import GenerateConfig


@dataclass(frozen=True)
class Job:
    id: str
    prompt: list[int]
    config: GenerateConfig


@dataclass(frozen=True)
class Failed:
    message: str
    kind: str  # "engine" | "shutdown" | "cancelled"


JobEvent = Step | Done | Failed


class QueueFull(Exception):
    pass


class DoesNotFit(Exception):
    pass


@dataclass(frozen=True)
class BatchReport:
    n_rows: int
    n_slots: int
    k: tuple[int, ...]
    decode_s: float
    draft_s: float
    step_s: float
    host_s: float
    queue_depth: int
    slots_busy: int
