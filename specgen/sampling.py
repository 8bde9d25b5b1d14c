"""Logits row -> probability row under temperature / top-k / top-p / min-p, and draws.

The warpers run in llama.cpp's default sampler-chain order (`common_sampler`: top-k,
top-p, min-p, then temperature), so a given setting means what it means in llama-cli.
The same function builds p (target) and q (draft): the rejection rule is exact only
when q is the distribution the draft token was really drawn from.

Distributions are kept sparse as (ids, probs) while being built: after top-k the
work is on ~40 numbers instead of the 262,144 of a Gemma 3 row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from specgen.errors import ConfigError


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings, applied identically to target (p) and draft (q).

    Attributes:
        temp: temperature; <= 0 means greedy (p is one-hot at the argmax).
        top_k: keep the k largest logits; <= 0 disables.
        top_p: keep the smallest set of most likely tokens whose mass is >= top_p; 1 disables.
        min_p: keep tokens with probability >= min_p * max probability; 0 disables.
    """

    temp: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05

    def __post_init__(self) -> None:
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"--top-p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ConfigError(f"--min-p must be in [0, 1], got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temp <= 0.0


def _top_k_ids(logits: npt.NDArray[np.floating], k: int) -> npt.NDArray[np.int64]:
    """Ids of the k largest logits, unordered. Avoids a full argpartition over a large
    vocabulary by first keeping only logits within `delta` of the max (O(V) compares),
    widening until at least k survive."""
    n = logits.shape[0]
    if k >= n:
        return np.arange(n, dtype=np.int64)
    top = float(logits.max())
    for delta in (8.0, 16.0, 32.0, 64.0):
        cand = np.flatnonzero(logits >= top - delta)
        if cand.size >= k:
            part = np.argpartition(-logits[cand], k - 1)[:k]
            return cand[part].astype(np.int64)
    return np.argpartition(-logits, k - 1)[:k].astype(np.int64)


def warp(
    logits: npt.NDArray[np.floating], params: SamplingParams
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Apply the warpers to one logits row.

    Args:
        logits: (n_vocab,) float32 or float64 raw scores.
        params: the sampling settings.

    Returns:
        (ids, probs): (m,) int64 kept token ids and (m,) float64 probabilities summing
        to 1, m >= 1. Greedy gives the single argmax with probability 1.
    """
    if params.greedy:
        return np.array([int(np.argmax(logits))], dtype=np.int64), np.ones(1)
    if params.top_k > 0:
        ids = _top_k_ids(logits, params.top_k)
    else:
        ids = np.arange(logits.shape[0], dtype=np.int64)
    z = logits[ids].astype(np.float64)
    if params.top_p < 1.0:
        order = np.argsort(-z, kind="stable")
        ids, z = ids[order], z[order]
        w = np.exp(z - z[0])
        cum = np.cumsum(w) / w.sum()
        # smallest prefix whose mass reaches top_p (llama_sampler_top_p_apply)
        m = int(np.searchsorted(cum, params.top_p)) + 1
        ids, z = ids[:m], z[:m]
    if params.min_p > 0.0:
        keep = z >= z.max() + np.log(params.min_p)
        ids, z = ids[keep], z[keep]
    z = z / params.temp
    w = np.exp(z - z.max())
    return ids, w / w.sum()


def dense(
    ids: npt.NDArray[np.int64], probs: npt.NDArray[np.float64], n_vocab: int
) -> npt.NDArray[np.float64]:
    """Scatter a sparse distribution into a (n_vocab,) float64 row."""
    row = np.zeros(n_vocab, dtype=np.float64)
    row[ids] = probs
    return row


def probs(logits: npt.NDArray[np.floating], params: SamplingParams) -> npt.NDArray[np.float64]:
    """(n_vocab,) float64 probability row of `logits` under `params` (see `warp`)."""
    ids, p = warp(logits, params)
    return dense(ids, p, logits.shape[0])


def draw(
    ids: npt.NDArray[np.int64], probs: npt.NDArray[np.float64], rng: np.random.Generator
) -> int:
    """Draw one token id from a sparse distribution by inverse CDF (one uniform)."""
    if ids.size == 1:
        return int(ids[0])
    cum = np.cumsum(probs)
    i = int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))
    return int(ids[min(i, ids.size - 1)])


def draw_dense(row: npt.NDArray[np.float64], rng: np.random.Generator) -> int:
    """Draw one token id from a (n_vocab,) row of non-negative weights (need not sum to 1)."""
    ids = np.flatnonzero(row)
    return draw(ids.astype(np.int64), row[ids], rng)
