"""Per-request logits processing before the warpers: logit bias and repetition penalties,
applied identically to the target's rows (p) and the draft's (q), position by position.

Where it sits. For one row z of raw logits (n_vocab float32) at a position whose text so
far is ``h`` (the committed tokens, prompt included, then the block's own earlier
proposals), the processed row is ``process(z, h)``; the warpers of `specgen.sampling`
(top-k, top-p, min-p, temperature) and greedy's argmax then run on it. The order is
llama.cpp's `common_sampler_init` (common/sampling.cpp): the logit-bias sampler first,
then the sampler chain, whose default order starts with the penalties
(`COMMON_SAMPLER_TYPE_PENALTIES`) before top-k. A grammar mask (-inf outside the allowed
tokens) commutes with both steps: a -inf logit stays -inf under a bias and a penalty.

The rules, for a row z and the history h:

1. logit bias (`llama_sampler_logit_bias_apply`, src/llama-sampling.cpp):
   z[t] += bias[t] for each biased token t (float32 addition).
2. penalties (`llama_sampler_penalties_apply`, src/llama-sampling.cpp): with c[t] the
   number of times t occurs in the last `repeat_last_n` tokens of h (all of h for -1;
   nothing for 0), for each t with c[t] > 0:
   z[t] = z[t] * repeat_penalty if z[t] <= 0 else z[t] / repeat_penalty, then
   z[t] -= c[t] * frequency_penalty + presence_penalty (all in float32, as there).

The history includes the prompt: llama-cli and llama-server feed every prompt token to
the sampler (`common_sampler_accept(..., accept_grammar=false)`) before generating.

Why speculation stays exact. The rejection rule needs q_i to be the law x_i was drawn
from and p_i to be the target's law at that position. Both depend on h, which inside a
block is the committed text plus x_1..x_{i-1}: row i of the target's decode and the draft's
i-th row are processed with that same h (`Processor.rows`, `Processor.row`). Counting
only the committed text, or updating the counts once per step, gives p_i a law that is not
the target's at that position (SGLang PR 33643, vLLM issue 18902).

Cost: nothing when no constraint is set (`processor_for` returns None and callers keep
their fast paths). Otherwise each processed row is one float32 copy of the row (the
caller's rows are llama.cpp's buffer or the raw logits others read) plus work on the
biased and penalised columns only.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from specgen.errors import ConfigError

Logits = npt.NDArray[np.float32]
"""(n_rows, n_vocab) or (n_vocab,) float32 raw scores."""

BIAS_MAX = 100.0
"""OpenAI's `logit_bias` range is [-100, 100]; -inf (llama.cpp's ``-l 15043-inf``) bans."""
PENALTY_MAX = 2.0
"""OpenAI's `presence_penalty` and `frequency_penalty` range is [-2, 2]."""
REPEAT_PENALTY_MIN, REPEAT_PENALTY_MAX = 0.01, 100.0
"""`repeat_penalty`'s range: a float32 logit (|z| < 1e3 in practice) divided or multiplied
by it stays finite; common values are 1.0-1.5."""


def _bias_pairs(
    logit_bias: Mapping[int, float] | Iterable[tuple[int, float]],
) -> tuple[tuple[int, float], ...]:
    """Sorted (token, bias) pairs; a token given twice adds up, as llama.cpp's list does."""
    items = logit_bias.items() if isinstance(logit_bias, Mapping) else logit_bias
    total: dict[int, float] = {}
    for token, bias in items:
        t, b = int(token), float(bias)
        if t < 0:
            raise ConfigError(f"--logit-bias: token ids are 0 or more, got {t}")
        if not (-BIAS_MAX <= b <= BIAS_MAX or b == -math.inf):
            raise ConfigError(
                f"--logit-bias: a bias must be in [-100, 100] (or -inf to ban), got {b} for"
                f" token {t}"
            )
        total[t] = total.get(t, 0.0) + b
    return tuple(sorted(total.items()))


@dataclass(frozen=True)
class Constraints:
    """A request's logits processing, validated once; frozen and hashable (it is part of
    `specgen.sampling.SamplingParams`, which the server keys its per-setting pools by).

    Attributes:
        logit_bias: (token id, bias) pairs sorted by id (a mapping or pairs are accepted and
            normalised; repeated ids add up). Bias in [-100, 100] or -inf.
        repeat_penalty: llama.cpp's `penalty_repeat` (`--repeat-penalty`); 1.0 = off; > 0.
        repeat_last_n: tokens the penalties look back (`--repeat-last-n`): 0 = off, -1 =
            the whole context (llama.cpp's "context size"), default 64.
        presence_penalty: subtracted once from a token seen in the window; [-2, 2].
        frequency_penalty: subtracted per occurrence in the window; [-2, 2].

    Raises:
        ConfigError: naming the setting (as its llama.cpp flag).
    """

    logit_bias: tuple[tuple[int, float], ...] = ()
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))
        # bounded: a logit divided by 1e-300 is inf, and a row holding inf has no law (the
        # request failed deep in the sampler); llama.cpp sets no bound
        if not (REPEAT_PENALTY_MIN <= self.repeat_penalty <= REPEAT_PENALTY_MAX):
            raise ConfigError(
                f"--repeat-penalty must be in [{REPEAT_PENALTY_MIN:g}, {REPEAT_PENALTY_MAX:g}]"
                f" (1.0 = off), got {self.repeat_penalty}"
            )
        if self.repeat_last_n < -1:
            raise ConfigError(
                "--repeat-last-n must be -1 (the whole context), 0 (off) or more,"
                f" got {self.repeat_last_n}"
            )
        for flag, value in (
            ("--presence-penalty", self.presence_penalty),
            ("--frequency-penalty", self.frequency_penalty),
        ):
            if not -PENALTY_MAX <= value <= PENALTY_MAX:
                raise ConfigError(f"{flag} must be in [-2, 2] (0 = off), got {value}")

    @property
    def penalizes(self) -> bool:
        """Whether any penalty applies (llama.cpp's early return in
        `llama_sampler_penalties_apply`)."""
        return self.repeat_last_n != 0 and (
            self.repeat_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
        )

    @property
    def active(self) -> bool:
        """Whether rows need processing at all."""
        return bool(self.logit_bias) or self.penalizes


NO_CONSTRAINTS = Constraints()


class Processor(Protocol):
    """A request's logits processing, one object per sequence and side (the target's in
    `specgen.round.Sequence`, the draft's in its `specgen.drafters.ModelDrafter`).

    Each call is given the whole history, so an implementation may be stateless (bias,
    penalties) or keep state keyed by it: a grammar matcher keeps the tokens it consumed
    and, like a drafter's cache (`ModelDrafter.rollback`), rolls back to the common prefix
    with the history it is given, then consumes the rest. Nothing else calls a rollback.
    """

    def rows(self, logits: Logits, context: Sequence[int], block: Sequence[int]) -> Logits:
        """Process a target decode's rows.

        Args:
            logits: (n, n_vocab) float32 raw rows; never written to.
            context: the committed tokens, prompt included (row 0 scores the token after
                them).
            block: the proposals x_1..x_m scored after the context, m >= n - 1.

        Returns:
            (n, n_vocab) float32, a new array: row i processed with history
            context + block[:i].
        """
        ...

    def row(self, logits: Logits, context: Sequence[int], block: Sequence[int]) -> Logits:
        """Process one row (a draft's next q row).

        Args:
            logits: (n_vocab,) float32 raw row; never written to.
            context: the committed tokens, prompt included.
            block: the proposals drawn so far in this block.

        Returns:
            (n_vocab,) float32, a new array: the row processed with history context + block.
        """
        ...


class BiasPenalties:
    """`Processor` for a `Constraints`' logit bias and penalties (the module's rules 1-2).

    Args:
        constraints: the settings (at least one active).
        n_vocab: row width; every biased token id must be below it.

    Raises:
        ConfigError: a biased token id outside the vocabulary.
    """

    def __init__(self, constraints: Constraints, n_vocab: int) -> None:
        c = constraints
        self.constraints = c
        self.n_vocab = n_vocab
        # compared as Python ints first: an id past int64 (an HTTP request's 2**70) made
        # numpy raise OverflowError, a 500
        top = max((t for t, _ in c.logit_bias), default=-1)
        if top >= n_vocab:
            raise ConfigError(
                f"--logit-bias names token {top} but the vocabulary has"
                f" {n_vocab} tokens (ids 0 to {n_vocab - 1})"
            )
        self.bias_ids = np.array([t for t, _ in c.logit_bias], dtype=np.int64)
        self.bias = np.array([b for _, b in c.logit_bias], dtype=np.float32)
        self.penalizes = c.penalizes
        self.last_n = c.repeat_last_n  # > 0, or -1 (everything)
        self.repeat = np.float32(c.repeat_penalty)
        self.frequency = np.float32(c.frequency_penalty)
        self.presence = np.float32(c.presence_penalty)

    def rows(self, logits: Logits, context: Sequence[int], block: Sequence[int]) -> Logits:
        z = np.array(logits, dtype=np.float32)  # a copy: the raw rows stay as they were
        n = z.shape[0]
        if self.bias_ids.size:
            z[:, self.bias_ids] += self.bias
        if self.penalizes:
            hist, start = self._history(context, block, n - 1)
            for i in range(n):
                self._penalize(z[i], self._window(hist, start + i))
        return z

    def row(self, logits: Logits, context: Sequence[int], block: Sequence[int]) -> Logits:
        z = np.array(logits, dtype=np.float32)
        if self.bias_ids.size:
            z[self.bias_ids] += self.bias
        if self.penalizes:
            hist, start = self._history(context, block, len(block))
            self._penalize(z, self._window(hist, start + len(block)))
        return z

    def _history(
        self, context: Sequence[int], block: Sequence[int], m: int
    ) -> tuple[npt.NDArray[np.int64], int]:
        """(tail, start): the tokens any window of rows 0..m can reach, the last
        `repeat_last_n` of the context then block[:m], and where the context part ends."""
        n = len(context)
        head = context if self.last_n < 0 or n <= self.last_n else context[n - self.last_n :]
        hist = np.fromiter((*head, *block[:m]), dtype=np.int64, count=len(head) + m)
        return hist, len(head)

    def _window(self, hist: npt.NDArray[np.int64], end: int) -> npt.NDArray[np.int64]:
        """The last `repeat_last_n` tokens of hist[:end]."""
        return hist[:end] if self.last_n < 0 else hist[max(0, end - self.last_n) : end]

    def _penalize(self, z: Logits, window: npt.NDArray[np.int64]) -> None:
        """Rule 2 on one (n_vocab,) float32 row, in place, float32 arithmetic."""
        if not window.size:
            return
        ids, counts = np.unique(window, return_counts=True)
        v = z[ids]
        v = np.where(v <= 0, v * self.repeat, v / self.repeat)
        v -= counts.astype(np.float32) * self.frequency + self.presence
        z[ids] = v


class Chain:
    """Processors applied in order (e.g. a grammar's mask, then `BiasPenalties`)."""

    def __init__(self, parts: Sequence[Processor]) -> None:
        self.parts = tuple(parts)

    def rows(self, logits: Logits, context: Sequence[int], block: Sequence[int]) -> Logits:
        for part in self.parts:
            logits = part.rows(logits, context, block)
        return logits

    def row(self, logits: Logits, context: Sequence[int], block: Sequence[int]) -> Logits:
        for part in self.parts:
            logits = part.row(logits, context, block)
        return logits


def processor_for(constraints: Constraints, n_vocab: int) -> Processor | None:
    """A new `Processor` for one sequence and side, or None when nothing is set (callers
    then keep their fast paths: no copy, greedy's plain argmax).

    Raises:
        ConfigError: a biased token outside the vocabulary.
    """
    if not constraints.active:
        return None
    return BiasPenalties(constraints, n_vocab)


def check_vocab(constraints: Constraints, n_vocab: int) -> None:
    """Raises ConfigError when a biased token id is outside a vocabulary of n_vocab."""
    processor_for(constraints, n_vocab)


class MinTokens:
    """`Processor` for vLLM's ``min_tokens``: at the first `min_tokens` generated positions
    every end-of-generation token and the request's ``stop_token_ids`` are held back
    (logit -inf), so the output cannot end there; after them rows pass unchanged. vLLM's
    `MinTokensLogitsProcessor` (vllm/v1/sample/logits_processor) does the same to the
    target's logits; here the draft's rows get it too (`specgen.drafters.attach_min_tokens`),
    so q proposes what p can accept. A -inf logit commutes with the grammar's mask, the
    bias and the penalties, so the order in a `Chain` does not matter.

    Args:
        ids: the token ids held back (`eog_ids` and the stop token ids), each below the
            row width.
        n_prompt: the prompt's length: row i of a call scores generated position
            len(context) + i - n_prompt (0-based), as the grammar counts its text from it.
        min_tokens: positions held, >= 1.
    """

    def __init__(self, ids: Iterable[int], n_prompt: int, min_tokens: int) -> None:
        self.ids = np.array(sorted(set(ids)), dtype=np.int64)
        self.n_prompt = n_prompt
        self.min_tokens = min_tokens

    def _held(self, first: int, n: int) -> int:
        """How many of n rows, the first at generated position `first`, are held."""
        return max(0, min(n, self.min_tokens - first))

    def rows(self, logits: Logits, context: Sequence[int], block: Sequence[int]) -> Logits:
        held = self._held(len(context) - self.n_prompt, logits.shape[0])
        if not held:
            return logits  # past min_tokens: the rows themselves, as with no processor
        z = np.array(logits, dtype=np.float32)
        z[np.ix_(np.arange(held), self.ids)] = -np.inf
        return z

    def row(self, logits: Logits, context: Sequence[int], block: Sequence[int]) -> Logits:
        if not self._held(len(context) + len(block) - self.n_prompt, 1):
            return logits
        z = np.array(logits, dtype=np.float32)
        z[self.ids] = -np.inf
        return z


class Vocabulary(Protocol):
    """What `eog_ids` reads of a model (an `specgen.engine.Engine` has it)."""

    n_vocab: int

    def is_eog(self, token: int) -> bool: ...


_EOG: weakref.WeakKeyDictionary[object, tuple[int, ...]] = weakref.WeakKeyDictionary()
_EOG_LOCK = threading.Lock()


def vocab_owner(vocab: Any) -> Any:
    """The object that owns `vocab`'s vocabulary: a llama.cpp sequence view's is its
    engine's (what per-model caches are keyed by)."""
    inner = getattr(vocab, "engine", None)
    if inner is not None and hasattr(inner, "llama_vocab"):
        return inner
    return vocab


def eog_ids(vocab: Vocabulary) -> tuple[int, ...]:
    """Every end-of-generation token id of `vocab`'s model (`is_eog`, llama.cpp's
    `llama_vocab_is_eog`, over the whole vocabulary), ascending; scanned once per model and
    kept as long as it (about 0.7 s for 262,144 tokens)."""
    owner = vocab_owner(vocab)
    with _EOG_LOCK:
        ids = _EOG.get(owner)
        if ids is None:
            ids = tuple(t for t in range(int(owner.n_vocab)) if owner.is_eog(t))
            _EOG[owner] = ids
        return ids
