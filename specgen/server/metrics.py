"""`/metrics`: Prometheus text through prometheus-client, in a registry of the server's own
(never the process-global one, so two servers in one process do not collide).

Fed from two sides: the scheduler's `BatchReport` once per batched step (from its worker
thread; prometheus-client is thread-safe), and each request's result when it ends (from
the event loop). Gauges for the queue and the slots are also read live at each scrape.
Names follow Prometheus' conventions (``_total`` counters, ``_seconds`` units) under the
``specgen_`` prefix; acceptance by position is two counters per position, as vLLM's
``spec_decode_num_accepted_tokens_per_pos`` (rate = accepted / proposed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from specgen import BatchReport, Step
from specgen.acceptance_stats import position_counts, proposed_counts

CONTENT_TYPE = CONTENT_TYPE_LATEST
_K_BUCKETS = (0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 64)
_ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_STEP_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0)
_HOST_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05)
_ITL_BUCKETS = (0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)
_REQUEST_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
MAX_POSITIONS = 64
"""Positions counted for acceptance by position (--draft-max is at most 64)."""


class Metrics:
    """The server's metrics; `render()` gives the text a scrape receives."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()

        def count(name: str, doc: str, *labels: str) -> Counter:
            return Counter(name, doc, labels, registry=r)

        def hist(name: str, doc: str, buckets: Sequence[float], *labels: str) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=r)

        def gauge(name: str, doc: str, *labels: str) -> Gauge:
            return Gauge(name, doc, labels, registry=r)

        self.queue_depth = gauge("specgen_queue_depth", "Requests waiting for a slot.")
        self.slots_busy = gauge("specgen_slots_busy", "Slots serving a request.")
        self.slots = gauge("specgen_slots", "Slots (--parallel).")
        self.requests = count(
            "specgen_requests", "Requests ended, by route and finish reason.", "route", "finish"
        )
        self.refused = count(
            "specgen_requests_refused", "Requests refused before generating, by HTTP status.",
            "status",
        )  # fmt: skip
        self.prompt_tokens = count("specgen_prompt_tokens", "Prompt tokens of ended requests.")
        self.generated_tokens = count("specgen_generation_tokens", "Tokens generated.")
        self.prompt_evaluated = count(
            "specgen_prompt_evaluated_tokens",
            "Prompt tokens the target evaluated for ended requests (all but the last token"
            " of each prompt not already in its slot or restored from the prompt cache: a"
            " request with n choices evaluates its prompt once).",
        )
        self.draft_tokens = count("specgen_draft_tokens", "Tokens the drafter proposed.")
        self.accepted_tokens = count(
            "specgen_accepted_tokens", "Proposed tokens the target accepted."
        )
        self.position_proposed = count(
            "specgen_draft_position_proposed",
            "Steps that proposed a token at this position (1-based).", "position",
        )  # fmt: skip
        self.position_accepted = count(
            "specgen_draft_position_accepted",
            "Steps whose proposals up to this position (1-based) were all accepted.", "position",
        )  # fmt: skip
        self.ttft = hist(
            "specgen_time_to_first_token_seconds", "TTFT: prompt and first round.",
            _REQUEST_BUCKETS,
        )  # fmt: skip
        self.request_s = hist(
            "specgen_request_seconds", "Wall seconds from admission to the last token.",
            _REQUEST_BUCKETS,
        )  # fmt: skip
        self.steps = count("specgen_steps", "Batched steps (one target decode each).")
        self.k_chosen = hist(
            "specgen_k_chosen", "Block size K chosen per active slot per step.", _K_BUCKETS
        )
        self.k_reasons = count(
            "specgen_k_reasons",
            "Slots' rounds by why their K was chosen (goodput, waiting, slo_ttft, slo_tpot,"
            " probe, fixed, first, catch_up, cut).", "reason",
        )  # fmt: skip
        self.rows = hist("specgen_step_rows", "Target rows decoded per step.", _ROW_BUCKETS)
        self.step_s = hist("specgen_step_seconds", "Wall seconds per batched step.", _STEP_BUCKETS)
        self.host_per_slot = hist(
            "specgen_host_seconds_per_slot",
            "Host seconds per step (outside llama_decode) divided by the active slots.",
            _HOST_BUCKETS,
        )
        self.decode_s = count("specgen_target_decode_seconds", "Seconds in the target's decodes.")
        self.draft_s = count("specgen_draft_seconds", "Seconds drafting.")
        self.host_s = count("specgen_host_seconds", "Seconds of steps outside llama_decode.")
        # fairness between slots: a slot whose request streams slower than the others
        # (it rarely speculates, or waits behind their blocks) shows here, by slot
        self.slot_itl = hist(
            "specgen_slot_inter_token_seconds",
            "Per slot: seconds between two sends of tokens to its request (ITL per streamed"
            " chunk, as bench --url counts it; the first tokens, TTFT, are not in it).",
            _ITL_BUCKETS, "slot",
        )  # fmt: skip
        self.slot_tokens = count(
            "specgen_slot_chunk_tokens",
            "Per slot: tokens in the chunks timed by specgen_slot_inter_token_seconds"
            " (tokens per chunk = this / its _count).", "slot",
        )  # fmt: skip
        self.cost = gauge(
            "specgen_controller_cost_seconds",
            "The batch controller's fitted cost lines: seconds = intercept + slope * x"
            " (x: a target decode's rows, a draft depth's slots); model=\"draft\","
            " term=\"token\": a draft token without a logits row (a catch-up's);"
            " model=\"step\", term=\"spec_overhead\": what a step with K >= 1 costs"
            " beyond its lines.", "model", "term",
        )  # fmt: skip

        self.speed_changes = gauge(
            "specgen_controller_speed_changes",
            "Times the batch controller found the machine's speed changed by 2x or more since"
            " its start-up calibration (its target decodes against it) and rescaled its cost"
            " lines, so far.",
        )  # fmt: skip

    def watch(self, queue_depth: Callable[[], float], slots_busy: Callable[[], float], n: int):
        """Read the scheduler's queue depth and busy slots at every scrape."""
        self.queue_depth.set_function(queue_depth)
        self.slots_busy.set_function(slots_busy)
        self.slots.set(n)

    def observe_batch(self, report: BatchReport) -> None:
        """One batched step (the scheduler's observer; called from its worker thread)."""
        self.steps.inc()
        for k in report.k:
            self.k_chosen.observe(k)
        for reason in report.reasons:
            self.k_reasons.labels(reason=reason).inc()
        self.rows.observe(report.n_rows)
        self.step_s.observe(report.step_s)
        if report.n_slots:
            self.host_per_slot.observe(report.host_s / report.n_slots)
        self.decode_s.inc(report.decode_s)
        self.draft_s.inc(report.draft_s)
        self.host_s.inc(report.host_s)
        for model, line in (("target", report.target_line), ("draft", report.draft_line)):
            if line is not None:
                self.cost.labels(model=model, term="intercept").set(line.intercept_s)
                self.cost.labels(model=model, term="slope").set(line.slope_s)
        if report.draft_token_s is not None:
            self.cost.labels(model="draft", term="token").set(report.draft_token_s)
        if report.spec_overhead_s is not None:
            self.cost.labels(model="step", term="spec_overhead").set(report.spec_overhead_s)
        self.speed_changes.set(report.speed_changes)
        for slot, gap_s, n_tokens in report.itl:
            self.slot_itl.labels(slot=str(slot)).observe(gap_s)
            self.slot_tokens.labels(slot=str(slot)).inc(n_tokens)

    def observe_request(
        self,
        route: str,
        finish: str,
        n_prompt: int,
        n_generated: int,
        steps: Sequence[Step],
        ttft_s: float | None,
        wall_s: float | None,
        n_prefilled: int = 0,
    ) -> None:
        """One request that ended (any way): its tokens, proposals and acceptance;
        `n_prefilled`: prompt tokens its choices evaluated (`Stats.n_prefill` summed)."""
        self.requests.labels(route=route, finish=finish).inc()
        self.prompt_tokens.inc(n_prompt)
        self.prompt_evaluated.inc(n_prefilled)
        self.generated_tokens.inc(n_generated)
        self.draft_tokens.inc(sum(s.n_proposed for s in steps))
        self.accepted_tokens.inc(sum(s.n_accepted for s in steps))
        rounds = [(s.n_proposed, s.n_accepted) for s in steps]
        depth = min(max((m for m, _ in rounds), default=0), MAX_POSITIONS)
        proposed = proposed_counts((m for m, _ in rounds), depth)
        _, accepted = position_counts(rounds, depth)
        for i in range(depth):
            self.position_proposed.labels(position=str(i + 1)).inc(proposed[i])
            if accepted[i]:  # a position's series appears with its first count
                self.position_accepted.labels(position=str(i + 1)).inc(accepted[i])
        if ttft_s is not None and ttft_s > 0:
            self.ttft.observe(ttft_s)
        if wall_s is not None:
            self.request_s.observe(wall_s)

    def observe_refusal(self, status: int) -> None:
        self.refused.labels(status=str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
