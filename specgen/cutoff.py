"""The confidence cut-off `--draft-p-min P` (llama.cpp's `p_min` in `common_speculative`).

A drafter stops its block early when its own most likely next token has probability
below P: at such positions the draft is unsure, so a proposal would likely be rejected
and only lengthen the target's batch.

Why the target distribution is preserved: the decision at position i is a function of
the draft's distribution q_i, which depends only on the context and the draft's earlier
proposals x_1..x_{i-1}, all known before the target scores anything, and never on the
token x_i that would be drawn, nor on the target's p or the acceptance uniforms. If
x_1..x_{i-1} are all accepted, the history is exactly context + x_1..x_{i-1}. Given
that history, either x_i is proposed (drawn from q_i) and the accept / residual rule of
Leviathan et al. 2023 (Algorithm 1) emits a token distributed as p_i, or the block ends
and the target emits its bonus token from the same p_i. Both branches give p_i, so
conditioning on the cut-off changes how many tokens are proposed, never the law of
what is emitted. (A rule that looked at the drawn x_i, e.g. "stop if x_i is unlikely",
would select which draws get verified and break exactness.)
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def should_stop(q_row_max: float, p_min: float) -> bool:
    """True when the block should end before proposing at this position.

    Args:
        q_row_max: the draft's largest probability at this position, max_x q_i(x), from
            the draft alone (see `top_probability` for a greedy draft, whose q is one-hot).
        p_min: the `--draft-p-min` threshold in [0, 1]; 0 disables the cut-off.

    Returns:
        q_row_max < p_min (llama.cpp's `cur_p->data[0].p < p_min`).
    """
    return p_min > 0.0 and q_row_max < p_min


def top_probability(logits: npt.NDArray[np.floating]) -> float:
    """max softmax(logits) at temperature 1, without building the softmax row.

    For a greedy draft q is one-hot (its max is always 1), so the cut-off needs another
    measure of confidence; like llama.cpp, use the draft's unwarped softmax. Any function
    of the draft's logits keeps the rule exact (see the module docstring).

    Args:
        logits: (n_vocab,) raw draft scores.

    Returns:
        Probability of the most likely token, in (0, 1].
    """
    z = np.asarray(logits, dtype=np.float64)
    return float(1.0 / np.exp(z - z.max()).sum())
