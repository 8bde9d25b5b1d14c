"""The seams between the loop and the models: `Engine` and `Drafter` protocols.

No third-party imports beyond numpy, so the loop and its tests never need llama.cpp.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from specgen.events import Source
from specgen.sampling import Dists, SamplingParams

Logits = npt.NDArray[np.float32]
"""(n_rows, n_vocab) float32 raw scores, one row per output position."""
Probs = npt.NDArray[np.float64]
"""(n_vocab,) or (n_rows, n_vocab) float64, each row sums to 1."""
TokenIds = npt.NDArray[np.int64]


@dataclass(frozen=True)
class VocabInfo:
    """What llama.cpp's `common_speculative_are_compatible` compares between two models.

    Attributes:
        vocab_type: llama.cpp's `llama_vocab_type` (1 = SPM, 2 = BPE, ...).
        n_vocab: number of tokens.
        bos, eos: special token ids (-1 when absent).
        add_bos, add_eos: whether tokenization adds them.
    """

    vocab_type: int
    n_vocab: int
    bos: int
    eos: int
    add_bos: bool
    add_eos: bool


class Engine(Protocol):
    """One model's KV cache for one sequence, as the loop needs it: a whole context with
    one sequence (id 0), or a per-sequence view of a shared one (`BatchEngine.sequence`).

    Invariant kept by the caller: ``tokens`` is exactly what the cache holds, in order.
    ``decode_s`` is the running total of seconds spent evaluating (inside llama_decode),
    so the loop can tell its own host time apart; 0 for engines that do not count it.
    """

    name: str
    n_vocab: int
    n_ctx: int
    vocab: VocabInfo
    tokens: list[int]
    decode_s: float

    def tokenize(self, text: bytes, add_special: bool = True) -> list[int]:
        """Tokenize UTF-8 bytes (special tokens such as ``<start_of_turn>`` are parsed)."""
        ...

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token renders to (control tokens render to b'')."""
        ...

    def token_text(self, token: int) -> str:
        """The token's vocabulary entry as stored in the GGUF (for compatibility checks)."""
        ...

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT, ...)."""
        ...

    def decode(
        self, tokens: list[int], all_logits: bool = False, rows: Sequence[int] | None = None
    ) -> Logits:
        """Append ``tokens`` to the cache and evaluate them in one batched pass.

        Args:
            tokens: the token ids to append.
            all_logits: a row for every token (else only for the last).
            rows: when given, overrides `all_logits`: the indices into ``tokens``
                (ascending, possibly none) that get a logits row; the others cost no
                output-layer work (llama.cpp's per-token ``batch.logits`` flag). The
                loop skips the rows of positions the grammar forces (`Block.sole`).

        Returns:
            (len(tokens), n_vocab) float32 when ``all_logits``, (len(rows), n_vocab) with
            `rows`, else (1, n_vocab) for the last token. A view into llama.cpp's buffer:
            valid only until the next decode.

        Raises:
            EngineError: llama.cpp failed, or the tokens do not fit in the context.
        """
        ...

    def truncate(self, n: int) -> None:
        """Drop cached positions >= n (rollback). Raises EngineError when the cache
        cannot drop that range."""
        ...

    def close(self) -> None: ...


_E = TypeVar("_E", bound="Engine")


class EngineView(Generic[_E]):
    """An `Engine` over another engine's model: the name, sizes, vocabulary, tokenizer and
    decode time are the wrapped `engine`'s; a subclass says which cells its `tokens`,
    `decode` and `truncate` touch (`specgen.llamacpp.SequenceView`: one sequence of a
    shared cache; the sampling check's prompt cache: lazy truncation)."""

    def __init__(self, engine: _E) -> None:
        self.engine = engine
        # fixed once the model is loaded, so copied; `decode_s` grows, so it is read through
        self.name, self.n_vocab, self.n_ctx = engine.name, engine.n_vocab, engine.n_ctx
        self.vocab = engine.vocab

    @property
    def decode_s(self) -> float:
        return self.engine.decode_s

    def tokenize(self, text: bytes, add_special: bool = True) -> list[int]:
        return self.engine.tokenize(text, add_special)

    def token_bytes(self, token: int) -> bytes:
        return self.engine.token_bytes(token)

    def token_text(self, token: int) -> str:
        return self.engine.token_text(token)

    def is_eog(self, token: int) -> bool:
        return self.engine.is_eog(token)


@dataclass(frozen=True)
class SeqDecode:
    """One sequence's part of a batched decode (`BatchEngine.decode_batch`).

    Attributes:
        seq: the sequence id (0..n_seq-1); each sequence at most once per batch.
        tokens: token ids appended at that sequence's next positions.
        n_rows: logits rows wanted for the last n_rows of `tokens` (0 = none, a prompt
            chunk; len(tokens) = all, a block to score).
        rows: when given, the indices into `tokens` (ascending) that get a row instead of
            the last n_rows; then n_rows == len(rows) (a block whose grammar-forced
            positions need no row: `Block.sole`).
    """

    seq: int
    tokens: list[int]
    n_rows: int
    rows: tuple[int, ...] | None = None

    def wanted(self) -> tuple[int, ...]:
        """The indices into `tokens` that get a logits row, ascending."""
        if self.rows is not None:
            return self.rows
        return tuple(range(len(self.tokens) - self.n_rows, len(self.tokens)))


class BatchEngine(Protocol):
    """One model with a KV cache holding several sequences (llama.cpp's `n_seq_max`):
    the server's target and draft. A sequence's cells are touched only through its own
    id, so one sequence's rollback never moves another's."""

    name: str
    n_vocab: int
    n_seq: int
    n_batch: int  # most tokens one decode_batch may hold
    decode_s: float

    def sequence(self, seq: int) -> Engine:
        """The `Engine` of sequence `seq` (the same object each call); its `n_ctx` is that
        sequence's share of the cache."""
        ...

    def decode_batch(self, parts: list[SeqDecode], copy: bool = True) -> list[Logits]:
        """Evaluate every part in ONE decode (each sequence's positions continue its own
        `tokens`, which are extended).

        Returns:
            per part, in order, (n_rows, n_vocab) float32 rows: row i scores the token
            after tokens[len - n_rows + i]. Copies, which stay valid after the next
            decode; with `copy=False`, views into the engine's buffer, valid only until
            its next decode (a truncation that re-evaluates evicted cells is one).

        Raises:
            EngineError: the parts exceed one batch or a sequence's context, or llama.cpp
                failed; then no sequence has kept any of its new tokens.
        """
        ...


class OneSequence:
    """A plain `Engine` (one sequence, id 0) as a `BatchEngine`, so that the batch engine
    (`specgen.sched`) can drive a model loaded for one stream, or a test's fake, as its
    one slot. A batch holds at most one part: that sequence's.

    Args:
        engine: the engine; its `decode` splits a part longer than one batch itself.
    """

    n_seq = 1

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.name, self.n_vocab = engine.name, engine.n_vocab
        # one part per batch, which the engine's decode splits by n_batch itself
        self.n_batch = max(1, int(getattr(engine, "n_batch", 0)) or engine.n_ctx)

    @property
    def decode_s(self) -> float:
        return self.engine.decode_s

    def sequence(self, seq: int) -> Engine:
        """The engine itself (seq 0).

        Raises:
            ValueError: seq is not 0.
        """
        if seq != 0:
            raise ValueError(f"{self.name} holds one sequence, not sequence {seq}")
        return self.engine

    def decode_batch(self, parts: list[SeqDecode], copy: bool = True) -> list[Logits]:
        """`BatchEngine.decode_batch` for at most one part (sequence 0).

        Raises:
            ValueError: more than one part, or a part for another sequence.
            EngineError: as `Engine.decode`.
        """
        if not parts:
            return []
        if len(parts) > 1 or parts[0].seq != 0:
            raise ValueError(f"{self.name} holds one sequence: one part per decode")
        part = parts[0]
        n, n_rows = len(part.tokens), part.n_rows
        # `decode`'s plain forms where they say it (an engine wrapping another may know
        # only those); `rows` for the rest. Told apart without building `wanted()`: a
        # draft depth comes here once a token
        plain = part.rows is None or part.rows == tuple(range(n - n_rows, n))
        if plain and n_rows == n:
            rows = self.engine.decode(part.tokens, all_logits=True)
        elif plain and n_rows == 1:
            rows = self.engine.decode(part.tokens)
        else:
            rows = self.engine.decode(part.tokens, rows=list(part.wanted()))
        return [np.array(rows) if copy else rows]


def as_batch(engine: Engine | BatchEngine) -> BatchEngine:
    """`engine` where it already holds sequences (`BatchEngine`: llama.cpp's), else the
    one-sequence view of it (`OneSequence`)."""
    if hasattr(engine, "decode_batch") and hasattr(engine, "sequence"):
        return engine  # type: ignore[return-value]
    return OneSequence(engine)  # type: ignore[return-value]


@dataclass
class Block:
    """A drafted block.

    Attributes:
        tokens: (K,) int64 proposed token ids x_1..x_K.
        q: K rows, a `specgen.sampling.Dists`: row i is the exact distribution x_{i+1}
            was sampled from (after the same warpers as the target's p). Sparse, (K, m)
            ids and float64 probabilities over each row's support (m is at most top-k,
            1 for a greedy or prompt-lookup draft), or dense (K, n_vocab) when every
            truncation is off. Rows sum to 1.
    """

    tokens: TokenIds
    q: Dists
    sources: tuple[Source, ...] = ()
    """Who proposed each token, "draft" (a draft model), "lookup" or "prediction" (prompt
    lookup in the context or the predicted output) or "grammar" (a token the grammar
    forces, with a one-hot q); empty means all "draft"."""
    sole: tuple[int, ...] = ()
    """Indices i (ascending) where the grammar allows x_{i+1} alone: the target's
    constrained p there is one-hot on it whatever its logits (every other token is -inf
    before the warpers), so that position needs no logits row. A "grammar" token that is
    not in `sole` (a forced string several tokenizations could spell,
    `specgen.grammar.Matcher.forced`) keeps its row."""

    def source(self, i: int) -> Source:
        """The proposer of x_{i+1} (see `sources`)."""
        return self.sources[i] if self.sources else "draft"


def under(drafter: Drafter | None, params: SamplingParams) -> Drafter | None:
    """`drafter` drawing q under `params`, the generation's own settings: itself when it
    already does (or its q does not depend on them: no ``params``, prompt lookup), else
    `Drafter.with_params` (the same engine and cache). Every single-stream generation
    comes through here (`specgen.generate.generate`), whichever door it came in by: a
    drafter loaded under other settings proposes from another law than the one p is warped
    with (still exact, q being the law x was drawn from, but accepted less: a greedy call
    drafted at the loaded temperature 0.8 accepted 0.70 against 0.95, issue 33)."""
    own = getattr(drafter, "params", None)
    if drafter is None or own is None or own == params:
        return drafter
    return drafter.with_params(params)


class Drafter(Protocol):
    """Proposes up to K tokens after the committed context (llama.cpp's
    `common_speculative_gen_draft`), and keeps whatever cache it has consistent with the
    committed context (`rollback`). Model-free drafters (prompt lookup) make `rollback` a
    no-op and report `cached_tokens` as -1.

    Attributes:
        name: shown in the output.
        engine: the draft model, whose passes the loop times (`Engine.decode_s`, single
            passes for the controller); None for a model-free drafter.
        catchup_s: seconds the last `draft` spent catching up on committed tokens it had
            not seen (after ordinary-decoding rounds), beyond the single-token pass that
            yields x_1's row anyway: a cost of the round after a fallback, not of each
            proposal. 0 for drafters that never fall behind.
    """

    name: str
    catchup_s: float

    @property
    def engine(self) -> Engine | None:
        """The draft model, or None (see the class attributes)."""
        ...

    @property
    def cached_tokens(self) -> int:
        """Positions held in the drafter's KV cache (for `--trace`); -1 without a cache."""
        ...

    def prefill(self, context: list[int]) -> None:
        """Evaluate the committed context except its last token (may be a no-op)."""
        ...

    def draft(
        self, context: list[int], k: int, rng: np.random.Generator, room: int | None = None
    ) -> Block:
        """Propose up to k tokens following ``context`` (which ends with the committed,
        not yet evaluated token). May return fewer than k (even 0). Tokens a grammar
        allows alone (`Block.sole`) do not count against k, only against ``room``, the
        most tokens the block may hold in all (None: k; never below k)."""
        ...

    def rollback(self, context: list[int]) -> None:
        """Drop cached positions that are not a prefix of the committed ``context``
        (stage 5 for the draft's cache; called after every round and on every exit)."""
        ...

    def with_params(self, params: SamplingParams) -> Drafter:
        """This drafter under other sampling settings `params`: q must come from the
        warpers the target's p uses, so a model drafter is rebuilt on the same engine (and
        cache); a drafter whose q does not depend on them (prompt lookup's one-hot rows)
        returns itself."""
        ...

    def close(self) -> None: ...
