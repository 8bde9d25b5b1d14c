"""The batch engine, which knows nothing of HTTP: slots, a bounded queue, and the steps
over the slots (choose K, propose, one target decode, commit). `specgen serve` runs it
with N slots in one worker thread that owns llama.cpp; every other path (`run`, `chat`,
`bench`, `verify`, the Python API) drives it step by step with one slot
(`specgen.generate.OneSlot`).

One job per module:
  - `jobs`: what crosses the seam with the HTTP side (`Job`, `Ticket`, the events, the
    errors of `submit`, the per-step `BatchReport`);
  - `scheduler`: `Scheduler`, the queue and the worker thread (admission into slots,
    start-up calibration, delivery of each step's events);
  - `slot`: a slot's state and its life (placed with a job, started, ended);
  - `drafting`: drafting across slots (catch-up, one draft decode per depth, re-timing);
  - `step`: one step (choose K, propose, ONE target decode, commit every slot).
"""
