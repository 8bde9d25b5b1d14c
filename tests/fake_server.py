"""A scripted scheduler behind the real HTTP side, for the server's route, schema, error,
auth, limit and signal tests (the real scheduler and models are tested end to end in
test_server_models.py).

`FakeScheduler` implements the agreed interface (SERVER_API: submit/cancel/shutdown,
queue_depth, slots_busy, n_parallel, n_ctx_slot) with one worker thread and real
`Emitter`s, so max_tokens, stop strings and EOS behave as in the loop. The vocabulary is
bytes: token t < 256 renders as the byte t, token 256 is EOS. Every job's reply is
`REPLY` then EOS; each step emits one round per active job with K = 3 and the accepted
counts cycling through `ACCEPTS` (so the statistics are known exactly).

Prompts steer it: a prompt containing ``HOLD`` stops its job after its first round until
it is cancelled or shut down; ``FAIL`` ends it after its first round with
``Failed("engine")``; ``STUCK`` is held like HOLD and ignored by shutdown (a hung job);
``SLOW`` never ends by itself: once its reply is out it sends an empty round every step,
and every step while it runs lasts `SLOW_S` (a job that keeps streaming until cancelled,
paced so as not to flood the server with events).

Run as a script, it serves a fake backend through `specgen.server.runner` (the signal
tests): ``python tests/fake_server.py [--port N] [--api-key K] [--load-gate FILE]``.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from specgen.emit import Emitter
from specgen.events import Done, Span, Stats, Step
from specgen.sched.jobs import DoesNotFit, Failed, Job, QueueFull
from specgen.server.app import Backend
from specgen.server.vocabulary import Vocabulary

EOS = 256
N_VOCAB = 257
REPLY = "Hello from the fake model, one round at a time."
K = 3
ACCEPTS = (3, 1, 0, 2)
ROUND_S = 0.01
SLOW_S = 0.05
_EMPTY_ROUND = Step(
    k=0, n_proposed=0, n_drafted=0, n_accepted=0, spans=(), rejected_text=None, draft_s=0.0,
    verify_s=ROUND_S, sample_s=0.0, round_s=ROUND_S, n_rows=1,
)  # fmt: skip
PREFILL_S = 0.002


def tokenize(text: str, add: bool = True) -> list[int]:  # no BOS in this vocabulary
    return list(text.encode("utf-8"))


def render_chat(
    messages: list[dict[str, str]],
    tools: list | None = None,
    variables: dict | None = None,
    add: bool = True,
) -> list[int]:
    head = "".join(f"<{k}={v}>" for k, v in sorted((variables or {}).items()))
    return tokenize(
        head + "".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>"
    )


def token_bytes(t: int) -> bytes:
    return b"" if t == EOS else bytes([t])


@dataclass(eq=False)
class _Slot:
    job: Job
    sink: Callable[[object], None]
    emitter: Emitter
    text: str
    stats: Stats
    rounds: int = 0
    held: bool = False


@dataclass(eq=False)
class Ticket:
    job_id: str


@dataclass
class FakeScheduler:
    n_parallel: int = 2
    n_ctx_slot: int = 256
    queue_max: int = 4
    cancelled: list[str] = field(default_factory=list)
    submitted: list[Job] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._cv = threading.Condition()
        self._queue: deque[_Slot] = deque()
        self._active: list[_Slot] = []
        self._stopped = False
        self.steps = 0
        self._thread = threading.Thread(target=self._run, name="fake-scheduler", daemon=True)

    # -- the interface ------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job, sink: Callable[[object], None]) -> Ticket:
        if len(job.prompt) + job.config.max_tokens > self.n_ctx_slot:
            raise DoesNotFit(f"{len(job.prompt)} + {job.config.max_tokens} > {self.n_ctx_slot}")
        with self._cv:
            if self._stopped:
                raise QueueFull("shutting down")
            if len(self._queue) >= self.queue_max and len(self._active) >= self.n_parallel:
                raise QueueFull(f"{len(self._queue)} waiting")
            emitter = Emitter.of(job.config, token_bytes, lambda t: t == EOS)
            text = bytes(t for t in job.prompt if t < 256).decode("utf-8", "replace")
            self._queue.append(
                _Slot(
                    job,
                    sink,
                    emitter,
                    text,
                    Stats(n_prompt=len(job.prompt), verify_rule=job.config.verify_rule),
                )
            )
            self.submitted.append(job)
            self._cv.notify_all()
        return Ticket(job.id)

    def cancel(self, ticket: Ticket) -> None:
        with self._cv:
            for pool in (self._active, self._queue):
                for s in list(pool):
                    if s.job.id == ticket.job_id:
                        pool.remove(s)
                        self.cancelled.append(s.job.id)
                        s.sink(Failed("cancelled by the client", "cancelled"))
            self._cv.notify_all()

    def shutdown(self, timeout_s: float | None = None) -> bool:
        with self._cv:
            self._stopped = True
            for s in list(self._active):
                if "STUCK" in s.text:
                    continue
                self._active.remove(s)
                s.emitter.close("interrupted")
                s.sink(self._done(s))
            while self._queue:
                self._queue.popleft().sink(Failed("the server is shutting down", "shutdown"))
            self._cv.notify_all()
            # a STUCK job stands for a decode that has not returned: the worker is busy
            return not any("STUCK" in s.text for s in self._active)

    @property
    def queue_depth(self) -> int:
        with self._cv:
            return len(self._queue)

    @property
    def slots_busy(self) -> int:
        with self._cv:
            return len(self._active)

    # -- for the tests ------------------------------------------------------------------

    def wait(self, predicate: Callable[[FakeScheduler], bool], timeout_s: float = 10.0) -> None:
        """Block until `predicate(self)` holds (checked at every change), or fail."""
        with self._cv:
            if not self._cv.wait_for(lambda: predicate(self), timeout_s):
                raise AssertionError("the fake scheduler never reached the expected state")

    def held(self) -> int:
        with self._cv:
            return sum(s.held for s in self._active)

    # -- the worker ---------------------------------------------------------------------

    def _done(self, s: _Slot) -> Done:
        s.stats.n_generated = len(s.emitter.tokens)
        assert s.emitter.finish is not None
        return Done(s.emitter.finish, s.emitter.text, tuple(s.emitter.tokens), s.stats)

    def _round(self, s: _Slot) -> Step:
        n = ACCEPTS[s.rounds % len(ACCEPTS)]
        s.rounds += 1
        out = tokenize(REPLY) + [EOS]
        at = len(s.emitter.tokens)
        new = [out[(at + i) % len(out)] if s.job.config.ignore_eos else out[min(at + i, len(out) - 1)]
               for i in range(n + 1)]  # fmt: skip
        spans: list[Span] = []
        for i, tok in enumerate(new):
            span = s.emitter.push(tok, from_draft=i < n)
            if span is not None:
                spans.append(span)
            if s.emitter.finish is not None:
                del new[i + 1 :]
                break
        step = Step(
            k=K,
            n_proposed=K,
            n_drafted=min(K, len(new)),
            n_accepted=min(n, len(new)),
            spans=tuple(spans),
            rejected_text=None,
            draft_s=0.0,
            verify_s=ROUND_S,
            sample_s=0.0,
            round_s=ROUND_S,
            n_rows=K + 1,
        )
        s.stats.add(step)
        s.stats.n_generated = len(s.emitter.tokens)
        return step

    def _run(self) -> None:
        while True:
            with self._cv:
                slow = any("SLOW" in s.text for s in self._active)
            if slow:
                time.sleep(SLOW_S)  # outside the lock: submits and cancels go on
            with self._cv:
                self._cv.wait_for(
                    lambda: (
                        self._stopped
                        or (self._queue and len(self._active) < self.n_parallel)
                        or any(not s.held for s in self._active)
                    )
                )
                if self._stopped and not self._active:
                    return
                while self._queue and len(self._active) < self.n_parallel:
                    s = self._queue.popleft()
                    s.stats.n_prefill = len(s.job.prompt) - 1
                    s.stats.prefill_s = PREFILL_S
                    self._active.append(s)
                for s in [s for s in self._active if not s.held]:
                    if "SLOW" in s.text and s.emitter.finish is not None:
                        s.sink(_EMPTY_ROUND)  # it goes on until cancelled
                        continue
                    s.sink(self._round(s))
                    if s.emitter.finish is not None and "SLOW" not in s.text:
                        self._active.remove(s)
                        s.sink(self._done(s))
                    elif "FAIL" in s.text:
                        self._active.remove(s)
                        s.sink(Failed("llama.cpp failed (planted)", "engine"))
                    elif "HOLD" in s.text or "STUCK" in s.text:
                        s.held = True
                self.steps += 1
                self._cv.notify_all()
                if self._stopped and all(s.held for s in self._active):
                    return


def fake_backend(scheduler: FakeScheduler | None = None, chat: bool = True) -> Backend:
    sched = scheduler or FakeScheduler()
    sched.start()
    return Backend(
        scheduler=sched,
        tokenize=tokenize,
        render_chat=render_chat if chat else None,
        n_vocab=N_VOCAB,
        model_id="fake-model",
        card={"target": {"file": "fake.gguf", "sha256": "0" * 64}},
        vocabulary=Vocabulary(tokenize, token_bytes, None, None, None, N_VOCAB),
    )


def _main(argv: list[str]) -> int:
    import argparse

    from specgen.server import runner
    from specgen.server.app import Settings
    from specgen.ui import output

    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--api-key")
    p.add_argument("--load-gate", type=Path)
    a = p.parse_args(argv)

    def load(state: object) -> Backend:
        if a.load_gate is not None:
            while not a.load_gate.exists():
                threading.Event().wait(0.02)
        # the signal tests read when the models would have been freed
        return dataclasses.replace(fake_backend(), close=lambda: output.write_line("closed"))

    sock = runner.bind("127.0.0.1", a.port)
    output.write_line(f"listening {runner.url_of(sock)}")
    return runner.serve(
        sock,
        Settings(api_key=a.api_key),
        load,
        lambda url, b: output.write_line(f"ready {url}"),
        lambda line: output.log(f"specgen: {line}\n"),
    )


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
