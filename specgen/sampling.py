"""Logits rows -> probability rows under temperature / top-k / top-p / min-p, and draws.

The warpers run in llama.cpp's default sampler-chain order (`common_sampler`: top-k,
top-p, min-p, then temperature), so a given setting means what it means in llama-cli.
The same function builds p (target) and q (draft): the rejection rule is exact only
when q is the distribution the draft token was really drawn from.

The rule, for one row z of raw logits (float32 or float64; arithmetic in float64):

1. top-k (0 < k < n_vocab): keep the k largest logits. Ties at the boundary go to the
   lowest token ids. (llama.cpp's `llama_sampler_top_k_impl` leaves them to
   `std::partial_sort` or its bucket sort, whose order among equal logits is
   unspecified; a fixed rule keeps p a function of the logits alone.) The survivors are
   ordered z_(1) >= z_(2) >= ... by logit, ties by ascending id.
2. top-p (top_p < 1; `llama_sampler_top_p_apply`): with w_j = exp(z_(j) - z_(1)),
   W = the sum of w over all survivors added left to right in ascending id order, and
   C_j = w_(1) + ... + w_(j) added left to right, keep the smallest prefix whose
   C_j / W >= top_p.
3. min-p (min_p > 0; `llama_sampler_min_p_apply`, on logits): keep z_(j) >=
   z_(1) + log(min_p).
4. temperature T: p_(j) = exp((z_(j) - z_(1)) / T) / sum of the same over the kept tokens.
   Tokens left with p = 0 (-inf logits) are not part of the support.

Greedy (T <= 0) is the argmax, lowest id among ties, with probability 1.

Rows are sparse: a batch is a `Dists`, (ids, probs) over each row's support, built by one
vectorized call over all rows (`warp_rows`). Finding the top-k never sorts or partitions
a whole row: block maxima bound the k-th largest logit from below, and only the few
blocks that can hold a survivor are read again. A row is dense (n_vocab wide) only when
its support really is the whole vocabulary: every truncation off
(``--top-k 0 --top-p 1 --min-p 0``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from specgen.constraints import NO_CONSTRAINTS, Constraints
from specgen.errors import ConfigError

TokenIds = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]

_BLOCK = 64
"""Logits per block for the block maxima (a row is read as (_BLOCK, n_blocks): the max
over axis 0 is elementwise and vectorizes well)."""
_MIN_BLOCKS = 256
"""Rows narrower than _BLOCK * _MIN_BLOCKS use one logit per block."""
_SUB_BLOCKS = 8
"""Sub-blocks per block: a block whose maximum reaches the threshold is read only in
the sub-blocks that do too."""
_DRAW_BLOCK = 1024
"""Rows wider than this are drawn from in two levels (block sums, then one block)."""


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings, applied identically to target (p) and draft (q).

    Attributes:
        temp: temperature; <= 0 means greedy (p is one-hot at the argmax).
        top_k: keep the k largest logits; <= 0 disables.
        top_p: keep the smallest set of most likely tokens whose mass is >= top_p; 1 disables,
            0 keeps the most likely token alone.
        min_p: keep tokens with probability >= min_p * max probability; 0 disables.
        constraints: logit bias and penalties, applied to the logits before the warpers
            (`specgen.constraints`). They live here, not in the generation's settings,
            because everything that builds q from these settings (`Drafter.with_params`,
            the server's drafter per slot) then processes q exactly as p is processed.
    """

    temp: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    constraints: Constraints = NO_CONSTRAINTS

    def __post_init__(self) -> None:
        # 0 keeps the one most likely token, as llama.cpp's top-p sampler (its first token
        # already has mass >= 0) and OpenAI's API take it
        if not 0.0 <= self.top_p <= 1.0:
            raise ConfigError(f"--top-p must be in [0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ConfigError(f"--min-p must be in [0, 1], got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temp <= 0.0

    def whole_vocabulary(self, n_vocab: int) -> bool:
        """True when no truncation applies: the support is every token with a finite logit."""
        truncated = 0 < self.top_k < n_vocab or self.top_p < 1.0 or self.min_p > 0.0
        return not self.greedy and not truncated


@lru_cache(maxsize=4)
def _arange(n: int) -> TokenIds:
    a = np.arange(n, dtype=np.int64)
    a.setflags(write=False)
    return a


@dataclass(frozen=True)
class Dists:
    """A batch of n probability distributions (rows) over a vocabulary of n_vocab tokens.

    Sparse (``ids`` is an array): row i puts probability probs[i, j] on token ids[i, j].
    Each row's support is sorted by probability, descending (ties by ascending id), and
    padded at its end with id -1 and probability 0 up to the batch's width m.
    Dense (``ids`` is None): probs is (n, n_vocab) and column j is token j; used only
    when a row's support is the whole vocabulary (`SamplingParams.whole_vocabulary`).

    Attributes:
        ids: (n, m) int64, or None when dense.
        probs: (n, m) float64 (m = n_vocab when dense); each row sums to 1.
        n_vocab: vocabulary size.
    """

    ids: TokenIds | None
    probs: Floats
    n_vocab: int

    def __len__(self) -> int:
        return int(self.probs.shape[0])

    @property
    def dense(self) -> bool:
        return self.ids is None

    def __getitem__(self, rows: slice) -> Dists:
        """Rows `rows` (a slice) as a batch."""
        return Dists(None if self.ids is None else self.ids[rows], self.probs[rows], self.n_vocab)

    def at(self, x: TokenIds) -> Floats:
        """(n,) float64: row i's probability of token x[i] (x: (n,) int64)."""
        rows = np.arange(len(self))
        if self.ids is None:
            return self.probs[rows, x]
        # a token appears at most once in a support: the masked sum is that one entry
        return np.where(self.ids == x[:, None], self.probs, 0.0).sum(axis=1)

    def row(self, i: int) -> tuple[TokenIds, Floats]:
        """Row i's support: (m_i,) int64 ids and (m_i,) float64 probabilities (the whole
        vocabulary when dense, zeros included)."""
        if self.ids is None:
            return _arange(self.n_vocab), self.probs[i]
        ids = self.ids[i]
        m = int(np.count_nonzero(ids >= 0))
        return ids[:m], self.probs[i, :m]

    def on(self, i: int, ids: TokenIds) -> Floats:
        """(len(ids),) float64: row i's probabilities of `ids` (0 outside its support)."""
        if self.ids is None:
            return self.probs[i, ids]
        own, p = self.row(i)
        if ids.size > 4 * own.size + 64:  # e.g. a dense p against a sparse q: scatter
            full = np.zeros(self.n_vocab, dtype=np.float64)
            full[own] = p
            return full[ids]
        order = np.argsort(own)
        sorted_ids = own[order]
        pos = np.minimum(np.searchsorted(sorted_ids, ids), own.size - 1)
        return np.where(sorted_ids[pos] == ids, p[order][pos], 0.0)

    def to_dense(self) -> Floats:
        """(n, n_vocab) float64 rows."""
        if self.ids is None:
            return self.probs
        out = np.zeros((len(self), self.n_vocab), dtype=np.float64)
        r, j = np.nonzero(self.ids >= 0)
        out[r, self.ids[r, j]] = self.probs[r, j]
        return out

    @staticmethod
    def empty(n_vocab: int) -> Dists:
        """A batch of no rows."""
        return Dists(np.zeros((0, 0), dtype=np.int64), np.zeros((0, 0)), n_vocab)

    @staticmethod
    def one_hot(tokens: TokenIds, n_vocab: int) -> Dists:
        """Row i puts all its mass on tokens[i] (a deterministic proposal's q)."""
        t = np.asarray(tokens, dtype=np.int64).reshape(-1, 1)
        return Dists(t, np.ones(t.shape, dtype=np.float64), n_vocab)

    @staticmethod
    def concat(parts: Sequence[Dists], n_vocab: int) -> Dists:
        """The rows of `parts`, in order, as one batch (sparse parts padded to one width;
        parts must be all sparse or all dense)."""
        if not parts:
            return Dists.empty(n_vocab)
        if len(parts) == 1:
            return parts[0]
        if parts[0].ids is None:
            return Dists(None, np.concatenate([d.probs for d in parts]), n_vocab)
        m = max(d.probs.shape[1] for d in parts)
        n = sum(len(d) for d in parts)
        ids = np.full((n, m), -1, dtype=np.int64)
        probs = np.zeros((n, m), dtype=np.float64)
        r = 0
        for d in parts:
            assert d.ids is not None, "cannot mix dense and sparse rows"
            ids[r : r + len(d), : d.ids.shape[1]] = d.ids
            probs[r : r + len(d), : d.ids.shape[1]] = d.probs
            r += len(d)
        return Dists(ids, probs, n_vocab)


# -- warping ----------------------------------------------------------------------------


def _blocks(z: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(z3, sub, bm): the rows as (n, b, n_blocks) blocks, block j holding the ids
    i * n_blocks + j (i < b); (n, g, n_blocks) maxima of sub-blocks (sub-block a of block j
    holds the i = a mod g); (n, n_blocks) block maxima. Rows are padded with -inf to a
    multiple of b.

    Both maxima come from reductions whose innermost axis is the contiguous one (n_blocks),
    so numpy runs them as elementwise np.maximum over whole lines: one streaming pass over
    the row, then one over the (n, g, n_blocks) sub-block maxima."""
    n, v = z.shape
    b = _BLOCK if v >= _BLOCK * _MIN_BLOCKS else 1
    nb = -(-v // b)
    if nb * b != v:
        padded = np.full((n, nb * b), -np.inf, dtype=z.dtype)
        padded[:, :v] = z
        z = padded
    z3 = z.reshape(n, b, nb)
    g = min(b, _SUB_BLOCKS)
    # i = m * g + a: reducing over m leaves sub-block a = the i with i mod g = a
    sub = np.maximum.reduce(z3.reshape(n, b // g, g, nb), axis=1)
    return z3, sub, sub.max(axis=1)


def _at_least(
    z3: np.ndarray, sub: np.ndarray, bm: np.ndarray, t: Floats, n_vocab: int
) -> tuple[TokenIds, TokenIds, Floats]:
    """Every (row, id, logit) with z[row, id] >= t[row], sorted by row, then logit
    descending, then id ascending. Reads only the sub-blocks whose maximum reaches t."""
    b, nb = z3.shape[1], z3.shape[2]
    g = sub.shape[1]
    # flat indices into contiguous arrays: np.take is much cheaper than 3-d fancy indexing
    r, j = np.divmod(np.flatnonzero(bm >= t[:, None]), nb)
    sub_at = np.take(sub, (r * (g * nb) + j)[:, None] + nb * np.arange(g))  # (s, g)
    si, a = np.nonzero(sub_at >= t[r][:, None])
    r, j = r[si], j[si]
    i = a[:, None] + g * np.arange(b // g)  # (s, b / g): the sub-block's offsets in a block
    flat = (r * (b * nb) + j)[:, None] + i * nb
    vals = np.take(z3, flat)
    hit = np.flatnonzero(vals >= t[r][:, None])
    rows = r[hit // (b // g)]
    ids = flat.ravel()[hit] - rows * (b * nb)
    z = vals.ravel()[hit].astype(np.float64)
    if ids.size and ids.max() >= n_vocab:  # -inf padding reached by t = -inf
        keep = ids < n_vocab
        rows, ids, z = rows[keep], ids[keep], z[keep]
    order = np.lexsort((ids, -z, rows))
    return rows[order].astype(np.int64), ids[order].astype(np.int64), z[order]


_LOWEST = -float(np.finfo(np.float64).max)
"""A threshold below every finite logit and above -inf."""


def _top_k_floor(bm: np.ndarray, k: int) -> Floats:
    """(n,) float64 thresholds that every top-k logit of each row reaches: the k-th
    largest block maximum (k blocks reach it, so >= k logits do, and every logit >= the
    row's k-th largest does too); -inf with fewer than k blocks."""
    nb = bm.shape[1]
    if nb < k:
        t = np.full(bm.shape[0], -np.inf)
    else:
        t = np.partition(bm, nb - k, axis=1)[:, nb - k].astype(np.float64)
    # -inf logits are never in the support: with fewer than k finite block maxima (a row
    # masked by a grammar or banned by a bias), read only the finite logits, not a whole
    # 262,144-wide row of -inf (measured: 63 ms a row under a JSON schema's mask)
    return np.maximum(t, _LOWEST)


def _pad(
    rows: TokenIds, ids: TokenIds, z: Floats, n: int, cap: int | None = None
) -> tuple[TokenIds, Floats, TokenIds]:
    """Ragged sorted candidates -> (n, m) ids (-1 padding), (n, m) logits (-inf padding)
    and (n,) row lengths, keeping at most `cap` per row."""
    counts = np.bincount(rows, minlength=n)
    starts = np.cumsum(counts) - counts
    rank = np.arange(rows.size) - starts[rows]
    if cap is not None:
        keep = rank < cap
        rows, ids, z, rank = rows[keep], ids[keep], z[keep], rank[keep]
        counts = np.minimum(counts, cap)
    m = max(int(counts.max()), 1)
    out_ids = np.full((n, m), -1, dtype=np.int64)
    out_z = np.full((n, m), -np.inf, dtype=np.float64)
    out_ids[rows, rank] = ids
    out_z[rows, rank] = z
    return out_ids, out_z, counts


def _top_p_len(w: Floats, ids: TokenIds, top_p: float, total: Floats) -> TokenIds:
    """(n,) prefix lengths of rule 2: w (n, m) sorted weights (0 in padding), total (n,) W."""
    cum = np.cumsum(w, axis=1) / total[:, None]
    return np.minimum((cum < top_p).sum(axis=1) + 1, np.count_nonzero(ids >= 0, axis=1))


def _id_order_sum(w: Floats, ids: TokenIds) -> Floats:
    """(n,) W of rule 2: each row's w added left to right in ascending id order."""
    key = np.where(ids >= 0, ids, np.iinfo(np.int64).max)  # padding (w = 0) last
    order = np.argsort(key, axis=1, kind="stable")
    return np.cumsum(np.take_along_axis(w, order, axis=1), axis=1)[:, -1]


def _dense(z: np.ndarray, temp: float) -> Dists:
    """Every truncation off: softmax(z / T) over the whole vocabulary, (n, n_vocab)."""
    p = z.astype(np.float64)
    p -= p.max(axis=1, keepdims=True)
    p /= temp
    np.exp(p, out=p)
    p /= p.sum(axis=1, keepdims=True)
    return Dists(None, p, z.shape[1])


def _sorted_support(z: np.ndarray, params: SamplingParams, k: int) -> tuple[TokenIds, Floats]:
    """Rules 1-3: (n, m) ids (-1 padding) and float64 logits (-inf padding) of the kept
    tokens, sorted by logit descending, ties by id."""
    n, v = z.shape
    z3, sub, bm = _blocks(z)
    zmax = bm.max(axis=1).astype(np.float64)
    if k > 0:
        ids, zs, _ = _pad(*_at_least(z3, sub, bm, _top_k_floor(bm, k), v), n, cap=k)
        if params.top_p < 1.0:
            w = np.exp(zs - zs[:, :1])
            length = _top_p_len(w, ids, params.top_p, _id_order_sum(w, ids))
        else:
            length = np.count_nonzero(ids >= 0, axis=1)
    elif params.top_p < 1.0:
        # no top-k: W runs over the whole row; the prefix is found among the logits
        # within delta of the max, widened until its mass reaches top_p
        w_all = np.exp(z.astype(np.float64) - zmax[:, None])
        total = np.cumsum(w_all, axis=1)[:, -1]
        for delta in (8.0, 16.0, 32.0, 64.0, np.inf):
            rows, cand, zc = _at_least(z3, sub, bm, zmax - delta, v)
            ids, zs, _ = _pad(rows, cand, zc, n)
            w = np.where(ids >= 0, w_all[np.arange(n)[:, None], np.maximum(ids, 0)], 0.0)
            reached = np.cumsum(w, axis=1)[:, -1] / total >= params.top_p
            if reached.all() or delta == np.inf:
                break
        length = _top_p_len(w, ids, params.top_p, total)
    else:  # min-p alone: its threshold is the candidate threshold
        ids, zs, length = _pad(*_at_least(z3, sub, bm, zmax + math.log(params.min_p), v), n)
    if params.min_p > 0.0:
        keep_min = (zs >= zs[:, :1] + math.log(params.min_p)).sum(axis=1)
        length = np.minimum(length, keep_min)
    live = np.arange(ids.shape[1])[None, :] < length[:, None]
    return np.where(live, ids, -1), np.where(live, zs, -np.inf)


def warp_rows(logits: npt.NDArray[np.floating], params: SamplingParams) -> Dists:
    """Apply the warpers to every row at once (the rule in the module docstring).

    Args:
        logits: (n, n_vocab) float32 or float64 raw scores, n >= 1.
        params: the sampling settings.

    Returns:
        n rows: sparse (greedy: one id with probability 1 per row), or dense when
        `params.whole_vocabulary(n_vocab)`.
    """
    z = np.asarray(logits)
    n, v = z.shape
    if params.greedy:
        top = np.argmax(z, axis=1).astype(np.int64)[:, None]
        return Dists(top, np.ones((n, 1)), v)
    if params.whole_vocabulary(v):
        return _dense(z, params.temp)
    k = params.top_k if 0 < params.top_k < v else 0
    if n == 1 and k > 0:
        return _warp_one(z[0], params, k)
    ids, zs = _sorted_support(z, params, k)
    p = np.exp((zs - zs[:, :1]) / params.temp)  # padding: exp(-inf) = 0
    # added left to right: a row's padding (zeros at its end) then cannot change its sum,
    # so a row gets the same bits in a batch as alone
    p /= np.cumsum(p, axis=1)[:, -1:]
    ids = np.where(p > 0.0, ids, -1)  # -inf logits kept by top-k carry no mass
    m = max(int(np.count_nonzero(ids >= 0, axis=1).max()), 1)
    return Dists(ids[:, :m], p[:, :m], v)


def top_k_one(z: np.ndarray, k: int) -> tuple[TokenIds, Floats]:
    """One row's top-k candidates: (m,) int64 ids and float64 logits, m <= k, sorted by
    logit descending, ties by id, -inf logits included only to fill k. The same set and
    order as `_at_least` at `_top_k_floor`'s threshold cut to k (`_warp_one`'s caller
    relies on it: a row drafted alone and the same row in a batch get the same bits),
    with 1-d arrays: a draft block warps one row per depth, and the 3-d bookkeeping of
    `_at_least` cost more than the row's one streaming pass."""
    v = z.shape[0]
    b = _BLOCK if v >= _BLOCK * _MIN_BLOCKS else 1
    nb = -(-v // b)
    if nb * b != v:
        z = np.concatenate([z, np.full(nb * b - v, -np.inf, dtype=z.dtype)])
    z2 = z.reshape(b, nb)  # block j holds the ids i * nb + j
    g = min(b, _SUB_BLOCKS)
    bm = np.maximum.reduce(np.maximum.reduce(z2.reshape(b // g, g, nb), axis=0), axis=0)
    t = (
        np.float64(-np.inf)
        if nb < k
        else np.float64(max(float(np.partition(bm, nb - k)[nb - k]), _LOWEST))
    )
    j = np.flatnonzero(bm >= t)  # >= k blocks, each holding a logit >= t
    vals = z2[:, j]  # (b, s)
    i, c = np.nonzero(vals >= t)
    ids = i * nb + j[c]
    zs = vals[i, c].astype(np.float64)
    if ids.size and ids.max() >= v:  # -inf padding reached by t = -inf
        keep = ids < v
        ids, zs = ids[keep], zs[keep]
    order = np.lexsort((ids, -zs))[:k]
    return ids[order].astype(np.int64), zs[order]


def _warp_one(z: np.ndarray, params: SamplingParams, k: int) -> Dists:
    """`warp_rows` for one row with top-k on (the draft's and ordinary decoding's case):
    the same candidates and the same float operations, on 1-d arrays after the top-k."""
    ids, zs = top_k_one(z, k)
    m = k
    if params.top_p < 1.0:
        w = np.exp(zs - zs[0])
        total = w[ids.argsort(kind="stable")].cumsum()[-1]
        m = min(int((w.cumsum() / total < params.top_p).sum()) + 1, m)
    if params.min_p > 0.0:
        m = min(int((zs >= zs[0] + math.log(params.min_p)).sum()), m)
    ids, zs = ids[:m], zs[:m]
    p = np.exp((zs - zs[0]) / params.temp)
    p /= p.cumsum()[-1]
    if p[-1] == 0.0:  # -inf logits kept by top-k carry no mass
        live = p > 0.0
        ids, p = ids[live], p[live]
    return Dists(ids[None, :], p[None, :], z.shape[0])


def warp(
    logits: npt.NDArray[np.floating], params: SamplingParams
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Apply the warpers to one logits row (`warp_rows` on a batch of one).

    Args:
        logits: (n_vocab,) float32 or float64 raw scores.
        params: the sampling settings.

    Returns:
        (ids, probs): (m,) int64 kept token ids and (m,) float64 probabilities summing
        to 1, m >= 1, most likely first. Greedy gives the single argmax with probability
        1; with every truncation off, m = n_vocab (zeros for -inf logits).
    """
    return warp_rows(np.asarray(logits)[None, :], params).row(0)


# -- drawing ----------------------------------------------------------------------------


def _inverse_cdf(w: Floats, target: float) -> int:
    """Index of the entry whose cumulative interval [C_{i-1}, C_i) holds `target`, never
    an entry of weight 0 (rounding past the end falls back on the last positive one)."""
    cum = np.cumsum(w)
    i = int(np.searchsorted(cum, target, side="right"))
    if i >= w.size:
        i = int(np.flatnonzero(w)[-1])
    return i


def draw(
    ids: npt.NDArray[np.int64], probs: npt.NDArray[np.float64], rng: np.random.Generator
) -> int:
    """Draw one token id from a sparse distribution by inverse CDF (one uniform).

    Args:
        ids: (m,) int64 token ids.
        probs: (m,) float64 non-negative weights (need not sum to 1), not all zero.
        rng: consumes exactly one uniform.
    """
    if ids.size == 1:
        return int(ids[0])
    u = rng.random()
    if probs.size <= _DRAW_BLOCK:
        return int(ids[_inverse_cdf(probs, u * float(np.cumsum(probs)[-1]))])
    # a whole-vocabulary row: the same inverse CDF in two levels, block sums then one
    # block, so no sequential cumsum runs over n_vocab entries
    starts = np.arange(0, probs.size, _DRAW_BLOCK)
    sums = np.add.reduceat(probs, starts)
    target = u * float(np.cumsum(sums)[-1])
    b = _inverse_cdf(sums, target)
    before = float(np.cumsum(sums[:b])[-1]) if b else 0.0
    inside = probs[starts[b] : starts[b] + _DRAW_BLOCK]
    return int(ids[starts[b] + _inverse_cdf(inside, max(0.0, target - before))])
