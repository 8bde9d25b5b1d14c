"""Log-probabilities of emitted tokens, as OpenAI reports them: the target's log-softmax
over its whole vocabulary of its *raw* logits at that position (before any logit bias,
penalty, temperature or truncation), natural log.

Every emitted token has a target row, whatever proposed it: the round scores
``[last, x_1..x_K]`` in one decode and row i scores the token after to_score[i] (see
`specgen.round.Sequence.commit`), so an accepted draft or lookup token, a residual draw
and a bonus token all read their own row. The values are then exact, not estimated; they
are computed from the rows the round already decoded (no extra decode), and only when a
generation asks for them (`GenerateConfig.logprobs` not None). Numpy only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

MAX_TOP = 20
"""The most alternatives per token (OpenAI's top_logprobs bound)."""


@dataclass(frozen=True)
class TokenLogprob:
    """One token with its log-probability.

    Attributes:
        token: the token id.
        logprob: ln p(token) under the target's raw logits at its position (<= 0).
        piece: the token's bytes (a token may hold part of a UTF-8 character).
        top: the `n` most likely tokens at that position (each with an empty `top`), most
            likely first, ties by lower id; empty when no alternatives were asked.
    """

    token: int
    logprob: float
    piece: bytes
    top: tuple[TokenLogprob, ...] = ()

    @property
    def text(self) -> str:
        """The piece as text (an incomplete UTF-8 sequence shows U+FFFD, as OpenAI's)."""
        return self.piece.decode("utf-8", "replace")

    def to_dict(self, alternatives: bool = True) -> dict[str, Any]:
        """``run --json``'s shape: token, text, logprob, and (for an emitted token, not
        for an alternative) top_logprobs."""
        out: dict[str, Any] = {"token": self.token, "text": self.text, "logprob": self.logprob}
        if alternatives:
            out["top_logprobs"] = [t.to_dict(False) for t in self.top]
        return out


def log_softmax_at(row: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """ln softmax(row)[tokens], accumulated in float64.

    Args:
        row: (n_vocab,) float32 raw logits.
        tokens: (m,) int64 ids.

    Returns:
        (m,) float64 log-probabilities.
    """
    m = float(row.max())
    lse = m + float(np.log(np.exp(row - m, dtype=np.float32).sum(dtype=np.float64)))
    return row[tokens].astype(np.float64) - lse


def top_ids(row: np.ndarray, n: int) -> np.ndarray:
    """The n largest entries' ids, largest first, ties by lower id.

    The n-th largest of a strided sample (4,096 entries) is at most the row's n-th
    largest, so the entries at or above it hold the row's n largest: one comparison pass
    over the row instead of an ``argpartition`` of all of it (18 ms for nine rows of a
    262k vocabulary, FIELD.md).

    Args:
        row: (n_vocab,) float32; n: 1..n_vocab.

    Returns:
        (n,) int64.
    """
    if n == 1:
        return np.array([int(np.argmax(row))], dtype=np.int64)
    stride = row.shape[0] // _SAMPLE
    if stride >= 2:
        floor = np.partition(row[::stride], -n)[-n]
        cand = np.flatnonzero(row >= floor)
    else:
        cand = np.arange(row.shape[0])
    order = np.lexsort((cand, -row[cand].astype(np.float64)))[:n]
    return cand[order].astype(np.int64)


_SAMPLE = 4096


def token_logprobs(
    rows: np.ndarray,
    tokens: Sequence[int],
    n_top: int,
    piece: Callable[[int], bytes],
) -> list[TokenLogprob]:
    """The log-probability of each token under its row, with the n_top most likely.

    Args:
        rows: (m', n_vocab) float32 raw target logits, m' >= len(tokens): row i scores
            tokens[i].
        tokens: the emitted tokens, in order.
        n_top: alternatives per token, 0..MAX_TOP.
        piece: token id -> its bytes (the target's vocabulary).

    Returns:
        one `TokenLogprob` per token.
    """
    out = []
    for i, tok in enumerate(tokens):
        row = np.asarray(rows[i])
        ids = top_ids(row, n_top) if n_top > 0 else np.zeros(0, dtype=np.int64)
        lp = log_softmax_at(row, np.concatenate([[tok], ids]).astype(np.int64))
        top = tuple(
            TokenLogprob(int(t), float(v), piece(int(t))) for t, v in zip(ids, lp[1:], strict=True)
        )
        out.append(TokenLogprob(int(tok), float(lp[0]), piece(int(tok)), top))
    return out
