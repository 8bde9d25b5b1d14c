"""Acceptance statistics, each defined once: the acceptance rate, acceptance by block
position and tokens per target pass. `run --json`, bench, trace summaries, the server's
per-request ``speculative`` object and its metrics all count with these.

A round is described by (m, n): m tokens proposed (the block size the drafter returned,
0 for an ordinary pass) and n <= m of them accepted. Acceptance is a prefix: the target
tests x_1, x_2, ... in order and stops at the first rejection, so position i (1-based) is

- proposed when i <= m,
- tested when i <= min(m, n + 1) (reached: every proposal before it was accepted),
- accepted when i <= n.

(The controller's running estimates of the same quantities, with forgetting, are
`specgen.control.acceptance`; these are plain counts over finished rounds.)

Pure: the standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def acceptance_rate(n_accepted: int, n_drafted: int) -> float:
    """The acceptance rate alpha: n_accepted / n_drafted, in [0, 1]; 0.0 when nothing was
    drafted.

    Which proposals count as drafted is the caller's: specgen's own rate counts the tested
    ones (`specgen.events.ACCEPTANCE_HOW`), vLLM's and llama-server's every proposal; at a
    block position, the proposals tested there.
    """
    return n_accepted / n_drafted if n_drafted else 0.0


def tokens_per_pass(n_generated: int, n_passes: int) -> float:
    """Tokens emitted per target pass (forward pass of the target model): 1.0 for
    ordinary decoding, up to K + 1 for speculative rounds of block K; 0.0 without a pass."""
    return n_generated / n_passes if n_passes else 0.0


def position_counts(rounds: Iterable[tuple[int, int]], k_max: int) -> tuple[list[int], list[int]]:
    """Acceptance by position from rounds of (m proposed, n accepted).

    Args:
        rounds: (m, n) per round, n <= m.
        k_max: positions counted (deeper ones are left out).

    Returns:
        (tested, accepted), two lists of length k_max: entry i counts the rounds in which
        position i + 1 was tested (i + 1 <= min(m, n + 1)), respectively accepted
        (i + 1 <= n). ``accepted[i] / tested[i]`` is alpha at position i + 1, conditional
        on reaching it (`rates`).
    """
    tested = [0] * k_max
    accepted = [0] * k_max
    for m, n in rounds:
        for i in range(min(m, n + 1, k_max)):
            tested[i] += 1
            if i < n:
                accepted[i] += 1
    return tested, accepted


def proposed_counts(block_sizes: Iterable[int], k_max: int) -> list[int]:
    """Entry i: the rounds that proposed at least i + 1 tokens, for i < k_max (m per
    round in `block_sizes`)."""
    proposed = [0] * k_max
    for m in block_sizes:
        for i in range(min(m, k_max)):
            proposed[i] += 1
    return proposed


def rates(tested: Sequence[int], accepted: Sequence[int]) -> list[float | None]:
    """accepted / tested per position; None where nothing was tested."""
    return [a / t if t else None for t, a in zip(tested, accepted, strict=True)]


def prefix_acceptance(rounds: Sequence[tuple[int, int]]) -> tuple[float, ...]:
    """Entry i: of the rounds that proposed at least i + 1 tokens, the share whose first
    i + 1 were all accepted (vLLM's per-position rate when every round proposes the same
    number). Unconditional, unlike `rates`: non-increasing when every round proposes the
    same number; as long as the largest proposal; () without proposals.

    Args:
        rounds: (m proposed, n accepted) per round, n <= m.
    """
    depth = max((m for m, _ in rounds), default=0)
    _, accepted = position_counts(rounds, depth)
    proposed = proposed_counts((m for m, _ in rounds), depth)
    return tuple(a / p for a, p in zip(accepted, proposed, strict=True))
