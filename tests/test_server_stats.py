"""Per-request statistics (specgen.server.stats): exact values from hand-made Steps."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specgen.events import ACCEPTANCE_HOW, Span, Stats, Step
from specgen.server.stats import acceptance_by_position, speculative, timings


def step(k: int, proposed: int, tested: int, accepted: int, n_out: int, round_s=0.01) -> Step:
    spans = tuple(Span("x", 1, i < accepted) for i in range(n_out))
    return Step(k, proposed, tested, accepted, spans, None, 0.0, round_s, 0.0, round_s)


# K=4: 4 accepted + bonus; K=4: 1 accepted then a rejection (tested 2); K=0: ordinary;
# K=2 with a drafter that proposed only 1, rejected (tested 1)
STEPS = [step(4, 4, 4, 4, 5), step(4, 4, 2, 1, 2), step(0, 0, 0, 0, 1), step(2, 1, 1, 0, 1)]


def test_speculative_counts_proposals_tests_and_acceptance_exactly() -> None:
    s = speculative(STEPS, "eos")
    assert s.num_steps == 4
    assert s.num_spec_steps == 3
    assert s.num_draft_tokens == 9
    assert s.num_accepted_draft_tokens == 5
    assert s.num_tested_draft_tokens == 7
    assert s.mean_acceptance_length == pytest.approx(1 + 5 / 3, abs=1e-6)
    assert s.draft_acceptance_rate == pytest.approx(5 / 9, abs=1e-6)
    assert s.acceptance_rate == pytest.approx(5 / 7, abs=1e-6)
    assert s.acceptance_how == ACCEPTANCE_HOW
    assert s.k_per_step == (4, 4, 0, 2)
    assert s.finish == "eos"


def test_tokens_the_grammar_forced_are_counted_as_their_own_source() -> None:
    steps = [
        replace(STEPS[0], n_drafted_by={"grammar": 2, "draft": 2}, n_accepted_by={"grammar": 2, "draft": 2}),
        replace(STEPS[1], n_drafted_by={"draft": 2}, n_accepted_by={"draft": 1}),
        STEPS[2],
    ]  # fmt: skip
    s = speculative(steps, "stop")
    assert s.num_tested_draft_tokens_by_source == {"draft": 4, "grammar": 2}
    assert s.num_accepted_draft_tokens_by_source == {"draft": 3, "grammar": 2}
    assert list(s.num_tested_draft_tokens_by_source) == ["draft", "grammar"]


def test_each_steps_k_reason_is_reported_in_order() -> None:
    steps = [
        replace(s, k_reason=r)
        for s, r in zip(STEPS, ("first", "goodput", "waiting", "cut"), strict=True)
    ]
    assert speculative(steps, "eos").k_reason_per_step == ("first", "goodput", "waiting", "cut")
    assert speculative(STEPS, "eos").k_reason_per_step == ("",) * 4  # outside the server


def test_proposals_are_split_by_source_summed_over_steps() -> None:
    by = [({"draft": 3, "grammar": 1}, {"draft": 2, "grammar": 1}), ({"grammar": 2}, {"grammar": 2}),
          ({}, {}), ({"draft": 1, "lookup": 0}, {"draft": 0, "lookup": 0})]  # fmt: skip
    steps = [
        replace(s, n_drafted_by=t, n_accepted_by=a) for s, (t, a) in zip(STEPS, by, strict=True)
    ]
    s = speculative(steps, "stop")
    assert s.num_tested_draft_tokens_by_source == {"draft": 4, "grammar": 3}
    assert s.num_accepted_draft_tokens_by_source == {"draft": 2, "grammar": 3}  # zeros left out
    assert speculative(STEPS, "eos").num_tested_draft_tokens_by_source == {}


def test_acceptance_by_position_is_accepted_over_proposed_at_each_depth() -> None:
    # position 1: proposed by steps 1, 2, 4, accepted by 1, 2 -> 2/3
    # positions 2..4: proposed by steps 1 and 2, accepted by step 1 only -> 1/2
    assert acceptance_by_position(STEPS) == (round(2 / 3, 6), 0.5, 0.5, 0.5)
    assert acceptance_by_position([step(0, 0, 0, 0, 1)]) == ()
    # with a fixed K it is vLLM's rate: the share of steps that got past each position
    fixed = [step(3, 3, 3, 3, 4), step(3, 3, 2, 1, 2), step(3, 3, 1, 0, 1)]
    assert acceptance_by_position(fixed) == (round(2 / 3, 6), round(1 / 3, 6), round(1 / 3, 6))


def test_no_speculation_gives_zero_rates_not_errors() -> None:
    s = speculative([step(0, 0, 0, 0, 1)] * 3, "length")
    assert (s.num_spec_steps, s.num_draft_tokens) == (0, 0)
    assert s.mean_acceptance_length == 0.0
    assert s.draft_acceptance_rate == s.acceptance_rate == 0.0
    assert speculative([], "interrupted").num_steps == 0


def test_timings_use_llama_servers_fields_and_units() -> None:
    stats = Stats(n_prompt=20, n_prefill=14, prefill_s=0.05, decode_s=0.5, n_generated=9)
    t = timings(STEPS, stats)
    # 14 evaluated by the prefill + the last prompt token by the first round; 5 were cached
    assert (t.prompt_n, t.cache_n) == (15, 5)
    assert t.prompt_ms == 50.0
    assert t.prompt_per_token_ms == pytest.approx(50 / 15, abs=1e-3)
    assert t.prompt_per_second == pytest.approx(300.0)
    assert t.predicted_n == 9
    assert t.predicted_ms == 500.0
    assert t.predicted_per_second == pytest.approx(18.0)
    assert t.predicted_per_token_ms == pytest.approx(500 / 9, abs=1e-3)
    assert (t.draft_n, t.draft_n_accepted) == (9, 5)
    assert t.draft_n_accepted <= t.draft_n


def test_timings_without_a_done_count_the_steps() -> None:
    t = timings(STEPS, None)
    assert (t.prompt_n, t.cache_n, t.prompt_ms) == (0, 0, 0.0)
    assert t.predicted_n == 9
    assert t.predicted_ms == pytest.approx(40.0)
