"""Per-slot inter-token latency in /metrics (fairness between slots), on a scripted run of
the scheduler with fake engines and a fake clock: the names appear, each slot's counts move
by exactly the chunks its requests were sent after their first, and a request's first
tokens (its TTFT) never count as a gap from the slot's previous request."""

from __future__ import annotations

import itertools

from fakes import FakeBatchEngine

from specgen.drafters import ModelDrafter
from specgen.events import Step
from specgen.generate import GenerateConfig
from specgen.sampling import SamplingParams
from specgen.sched.jobs import BatchReport, Job
from specgen.sched.scheduler import Scheduler
from specgen.server.metrics import Metrics

V = 6
GREEDY = SamplingParams(temp=0.0)


def scripted_run(n_jobs: int, n_parallel: int = 3) -> tuple[Metrics, list[list[Step]], int]:
    """(the metrics fed by every step's report, each job's Steps, slots) after `n_jobs`
    greedy requests of different lengths through `n_parallel` slots (so slots are reused)."""
    target = FakeBatchEngine(n_parallel, 64, n_vocab=V, seed=0, n_ctx=256)
    draft = FakeBatchEngine(n_parallel, 64, n_vocab=V, seed=0, noise=1.0, n_ctx=256)
    metrics = Metrics()
    reports: list[BatchReport] = []

    def observe(report: BatchReport) -> None:
        reports.append(report)
        metrics.observe_batch(report)

    sched = Scheduler(
        target, ModelDrafter(draft, GREEDY, V), n_parallel=n_parallel, queue_max=64,
        draft_max=3, observer=observe, clock=itertools.count(step=0.001).__next__,
    )  # fmt: skip
    sinks: list[list[Step]] = []
    for i in range(n_jobs):
        events: list[Step] = []
        sinks.append(events)
        config = GenerateConfig(8 + 5 * i, GREEDY, ignore_eos=True)
        sched.submit(
            Job(f"j{i}", [1 + i % (V - 1), 2], config),
            lambda ev, out=events: out.append(ev) if isinstance(ev, Step) else None,
        )
    sched.run_until_idle()
    assert reports
    return metrics, sinks, n_parallel


def test_per_slot_itl_names_appear_and_count_every_chunk_after_the_first() -> None:
    metrics, jobs, n_slots = scripted_run(n_jobs=5)
    text = metrics.render().decode()
    assert "specgen_slot_inter_token_seconds_bucket" in text
    assert "specgen_slot_chunk_tokens_total" in text

    def sample(name: str, slot: int) -> float:
        v = metrics.registry.get_sample_value(name, {"slot": str(slot)})
        return 0.0 if v is None else v

    counts = [sample("specgen_slot_inter_token_seconds_count", s) for s in range(n_slots)]
    sums = [sample("specgen_slot_inter_token_seconds_sum", s) for s in range(n_slots)]
    tokens = [sample("specgen_slot_chunk_tokens_total", s) for s in range(n_slots)]
    assert all(c > 0 for c in counts) and all(x > 0 for x in sums)  # every slot moved
    # exactly one gap per chunk after a request's first: 5 requests on 3 slots, so a gap
    # measured from a slot's previous request would add 2 (the check can fail)
    chunks = [[st for st in steps if st.spans] for steps in jobs]
    assert sum(counts) == sum(len(c) - 1 for c in chunks)
    assert sum(tokens) == sum(len(st.spans) for c in chunks for st in c[1:])


def test_every_slots_round_is_counted_once_by_the_reason_for_its_k() -> None:
    metrics, jobs, _ = scripted_run(n_jobs=5)

    def count(reason: str) -> float:
        return (
            metrics.registry.get_sample_value("specgen_k_reasons_total", {"reason": reason}) or 0.0
        )

    # each Step a request received is one round of its slot; its first round rode on its
    # prefill ("first"), the others had --draft-max's fixed K
    assert count("first") == len(jobs)
    assert count("fixed") == sum(len(steps) for steps in jobs) - len(jobs) > 0
    assert count("goodput") == count("waiting") == 0


def test_an_idle_server_reports_no_slot_itl() -> None:
    metrics = Metrics()
    text = metrics.render().decode()
    # declared (HELP/TYPE) but no samples before a request streams twice
    assert "# TYPE specgen_slot_inter_token_seconds histogram" in text
    assert 'specgen_slot_inter_token_seconds_count{slot="0"}' not in text


def test_acceptance_by_position_counts_each_requests_steps_exactly() -> None:
    def step(proposed: int, accepted: int) -> Step:
        tested = min(proposed, accepted + 1)
        return Step(proposed, proposed, tested, accepted, (), None, 0.0, 0.01, 0.0, 0.01)

    metrics = Metrics()
    # 3 proposed, all accepted; 3 proposed, 1 accepted; an ordinary pass; 1 proposed, rejected
    steps = [step(3, 3), step(3, 1), step(0, 0), step(1, 0)]
    metrics.observe_request("chat", "eos", 4, 9, steps, 0.1, 0.2)
    text = metrics.render().decode()

    def count(name: str, position: int) -> float | None:
        head = f'specgen_draft_position_{name}_total{{position="{position}"}} '
        found = [line for line in text.splitlines() if line.startswith(head)]
        return float(found[0].removeprefix(head)) if found else None

    assert [count("proposed", i) for i in (1, 2, 3, 4)] == [3.0, 2.0, 2.0, None]
    # a position's series appears with its first acceptance (none at 4, never proposed)
    assert [count("accepted", i) for i in (1, 2, 3, 4)] == [2.0, 1.0, 1.0, None]
    metrics.observe_request("chat", "eos", 4, 1, [step(2, 0)], 0.1, 0.2)
    text = metrics.render().decode()
    assert (count("proposed", 2), count("accepted", 1)) == (3.0, 2.0)
