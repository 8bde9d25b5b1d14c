"""Helpers the tests use to state expectations in the papers' terms, kept out of the
package (nothing in specgen calls them): a dense probability row (`probs`) and one whole
verification round (`verify`)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from specgen.rejection import Rows, accept, correct
from specgen.sampling import SamplingParams, warp_rows


def probs(logits: npt.NDArray[np.floating], params: SamplingParams) -> npt.NDArray[np.float64]:
    """(n_vocab,) float64 probability row of `logits` under `params` (see `warp`)."""
    return warp_rows(np.asarray(logits)[None, :], params).to_dense()[0]


def verify(x: npt.NDArray[np.int64], q: Rows, p: Rows, rng: np.random.Generator) -> tuple[int, int]:
    """One whole round: (n_accepted, next_token). See `accept` and `correct` for shapes.

    Draws exactly K uniforms for acceptance then one for the correction, so a seed
    fixes the outcome.
    """
    u = rng.random(x.shape[0])
    n = accept(x, q, p, u)
    return n, correct(n, q, p, rng)


def dense(
    ids: npt.NDArray[np.int64], probs: npt.NDArray[np.float64], n_vocab: int
) -> npt.NDArray[np.float64]:
    """Scatter a sparse distribution into a (n_vocab,) float64 row."""
    row = np.zeros(n_vocab, dtype=np.float64)
    row[ids] = probs
    return row
