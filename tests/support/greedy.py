"""Greedy speculative output against ordinary output, up to near-ties: batched (K+1 rows)
and single-token target passes may differ in the last bits of float arithmetic, so the two
may diverge where the target's top-two logit gap is below `NEAR_TIE_LOGITS`; any other
divergence fails."""

from __future__ import annotations

import numpy as np

from specgen.sampling import SamplingParams

NEAR_TIE_LOGITS = 1e-2
GREEDY = SamplingParams(temp=0.0)


def top2_gap(target, context):
    """Target's top-two logit gap after `context` (a fresh single-token evaluation)."""
    target.truncate(0)
    row = np.array(target.decode(context)[-1], dtype=np.float64)
    target.truncate(0)
    a, b = np.sort(row)[-2:][::-1]
    return a - b


def assert_same_or_near_tie(target, prompt, ordinary, spec):
    """`spec` equals `ordinary`, or first differs where the target's top-two gap is a
    near-tie (and nothing is compared after that point)."""
    for i, (a, b) in enumerate(zip(ordinary, spec, strict=False)):
        if a != b:
            gap = top2_gap(target, prompt + list(ordinary[:i]))
            assert gap < NEAR_TIE_LOGITS, f"diverged at {i} with logit gap {gap:.4f}"
            return
    assert len(ordinary) == len(spec)
