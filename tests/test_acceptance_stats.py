"""Acceptance statistics (specgen.acceptance_stats): exact counts from hand-made rounds of
(m proposed, n accepted), with the edge cases every caller meets: no rounds, ordinary
(K = 0) rounds only, and rounds that accepted everything."""

from __future__ import annotations

from specgen.acceptance_stats import (
    acceptance_rate,
    position_counts,
    prefix_acceptance,
    proposed_counts,
    rates,
    tokens_per_pass,
)

# K=4 all accepted; K=4 one accepted then a rejection; K=0; K=2 with 1 proposed, rejected
ROUNDS = [(4, 4), (4, 1), (0, 0), (1, 0)]


def test_acceptance_rate_is_accepted_over_drafted_and_zero_when_nothing_was_drafted() -> None:
    assert acceptance_rate(5, 7) == 5 / 7
    assert acceptance_rate(3, 3) == 1.0
    assert acceptance_rate(0, 4) == 0.0
    assert acceptance_rate(0, 0) == 0.0


def test_tokens_per_pass_is_generated_over_passes_and_zero_without_a_pass() -> None:
    assert tokens_per_pass(9, 4) == 2.25
    assert tokens_per_pass(4, 4) == 1.0  # ordinary decoding
    assert tokens_per_pass(0, 0) == 0.0


def test_position_counts_tests_up_to_the_first_rejection() -> None:
    tested, accepted = position_counts(ROUNDS, 4)
    # position 1: every proposing round; 2: after (4, 4) and (4, 1); 3, 4: only (4, 4)
    assert tested == [3, 2, 1, 1]
    assert accepted == [2, 1, 1, 1]
    assert rates(tested, accepted) == [2 / 3, 0.5, 1.0, 1.0]
    # positions past k_max are left out; deeper k_max pads with zeros (None as a rate)
    assert position_counts(ROUNDS, 2) == ([3, 2], [2, 1])
    tested, accepted = position_counts(ROUNDS, 6)
    assert (tested, accepted) == ([3, 2, 1, 1, 0, 0], [2, 1, 1, 1, 0, 0])
    assert rates(tested, accepted)[4:] == [None, None]


def test_proposed_counts_count_rounds_proposing_at_least_i() -> None:
    assert proposed_counts((m for m, _ in ROUNDS), 4) == [3, 2, 2, 2]
    assert proposed_counts([4, 4], 2) == [2, 2]


def test_prefix_acceptance_is_accepted_over_proposed_at_each_depth() -> None:
    assert prefix_acceptance(ROUNDS) == (2 / 3, 0.5, 0.5, 0.5)
    # unconditional: with a fixed K it cannot rise with depth, unlike the conditional rates
    fixed = [(3, 3), (3, 0), (3, 1)]
    assert prefix_acceptance(fixed) == (2 / 3, 1 / 3, 1 / 3)
    assert rates(*position_counts(fixed, 3)) == [2 / 3, 0.5, 1.0]


def test_no_rounds() -> None:
    assert position_counts([], 3) == ([0, 0, 0], [0, 0, 0])
    assert position_counts([], 0) == ([], [])
    assert proposed_counts([], 2) == [0, 0]
    assert rates([], []) == []
    assert prefix_acceptance([]) == ()


def test_ordinary_rounds_only_test_and_propose_nothing() -> None:
    k0 = [(0, 0)] * 5
    assert position_counts(k0, 2) == ([0, 0], [0, 0])
    assert rates(*position_counts(k0, 2)) == [None, None]
    assert proposed_counts((m for m, _ in k0), 2) == [0, 0]
    assert prefix_acceptance(k0) == ()
    assert acceptance_rate(0, 0) == 0.0


def test_rounds_with_everything_accepted_are_one_at_every_position() -> None:
    full = [(3, 3), (2, 2)]
    assert position_counts(full, 3) == ([2, 2, 1], [2, 2, 1])
    assert rates(*position_counts(full, 3)) == [1.0, 1.0, 1.0]
    assert prefix_acceptance(full) == (1.0, 1.0, 1.0)
    assert acceptance_rate(5, 5) == 1.0
