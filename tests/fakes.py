"""A scripted in-memory engine for testing the loop's logic exactly and fast.

Its logits are a deterministic function of the last two cached tokens, so the exact
next-token distribution is known in closed form, and it checks the cache discipline the
real engine relies on (positions are contiguous, rollback only shrinks).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specgen.engine import VocabInfo


class FakeEngine:
    """A bigram-ish model over a small vocabulary.

    Args:
        n_vocab: vocabulary size (token 0 renders as b'' and is EOS when eos=True).
        seed: picks the logit table.
        scale: logit scale (larger = more peaked).
        n_ctx: context size.
        noise: added to the table from `noise_seed` (a draft "close to" the target).
        pieces: token id -> bytes; default: token i renders as a letter.
    """

    def __init__(
        self,
        n_vocab: int = 8,
        seed: int = 0,
        scale: float = 2.0,
        n_ctx: int = 256,
        noise: float = 0.0,
        noise_seed: int = 1,
        pieces: dict[int, bytes] | None = None,
        eos: int | None = None,
    ) -> None:
        rng = np.random.default_rng(seed)
        self.table = rng.standard_normal((n_vocab, n_vocab, n_vocab)).astype(np.float32) * scale
        if noise:
            self.table += (
                np.random.default_rng(noise_seed).standard_normal(self.table.shape) * noise
            ).astype(np.float32)
        self.name = f"fake-{seed}"
        self.n_vocab = n_vocab
        self.n_ctx = n_ctx
        self.eos = eos
        self.vocab = VocabInfo(1, n_vocab, 1, eos if eos is not None else 2, True, False)
        self.tokens: list[int] = []
        self.pieces = pieces or {i: bytes([97 + i % 26]) for i in range(n_vocab)}
        self.n_decode_calls = 0
        # each logits row computed, as the tokens it scores the next one after
        self.row_contexts: list[tuple[int, ...]] = []
        self.decode_s = 0.0  # no time counted: everything the loop does is host time
        self.closed = False

    def logits_after(self, context: list[int]) -> np.ndarray:
        """(n_vocab,) float32: the row the model gives after `context`."""
        a = context[-2] if len(context) >= 2 else 0
        b = context[-1]
        return self.table[a, b]

    def tokenize(self, text: bytes, add_special: bool = True) -> list[int]:
        return [c % self.n_vocab for c in text]

    def token_bytes(self, token: int) -> bytes:
        return self.pieces.get(token, b"")

    def token_text(self, token: int) -> str:
        return self.pieces.get(token, b"").decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return self.eos is not None and token == self.eos

    def decode(
        self, tokens: list[int], all_logits: bool = False, rows: list[int] | None = None
    ) -> np.ndarray:
        assert tokens, "decode of nothing"
        assert len(self.tokens) + len(tokens) <= self.n_ctx, "context overflow"
        self.n_decode_calls += 1
        start = len(self.tokens)
        self.tokens.extend(tokens)
        wanted = _wanted(len(tokens), all_logits, rows)
        self.row_contexts += [tuple(self.tokens[: start + j + 1]) for j in wanted]
        return _stack([self.logits_after(self.tokens[: start + j + 1]) for j in wanted], self)

    def truncate(self, n: int) -> None:
        del self.tokens[n:]

    def close(self) -> None:
        self.closed = True


def _wanted(n: int, all_logits: bool, rows: list[int] | None) -> list[int]:
    """The indices of n decoded tokens that get a row (`Engine.decode`'s rules)."""
    if rows is not None:
        assert list(rows) == sorted(set(rows)) and all(0 <= j < n for j in rows), rows
        return list(rows)
    return list(range(n)) if all_logits else [n - 1]


def _stack(rows: list[np.ndarray], model: FakeEngine) -> np.ndarray:
    if not rows:
        return np.zeros((0, model.n_vocab), dtype=np.float32)
    return np.stack(rows)


class WrongDrafter:
    """Always proposes a token the target's argmax is not, with q one-hot on it."""

    name = "wrong"
    cached_tokens = -1

    engine = None
    catchup_s = 0.0

    def __init__(self, target: FakeEngine) -> None:
        self.target = target

    def prefill(self, context: list[int]) -> None:
        pass

    def rollback(self, context: list[int]) -> None:
        pass

    def with_params(self, params):
        return self

    def draft(self, context, k, rng, room=None):
        from specgen.engine import Block
        from specgen.sampling import Dists

        toks, ctx = [], list(context)
        for _ in range(k):
            best = int(np.argmax(self.target.logits_after(ctx)))
            x = (best + 1) % self.target.n_vocab
            toks.append(x)
            ctx.append(x)
        return Block(
            tokens=np.array(toks, dtype=np.int64), q=Dists.one_hot(toks, self.target.n_vocab)
        )

    def close(self) -> None:
        pass


class FakeBatchEngine:
    """`FakeEngine`'s model with `n_seq` sequences in one cache (`specgen.engine.BatchEngine`):
    `sequence(i)` is an Engine over sequence i, `decode_batch` evaluates several sequences
    in one call and checks what llama.cpp would refuse (a sequence twice, more than n_batch
    tokens, a sequence past its context). `fail_next` makes the next batched decode raise
    EngineError (a llama.cpp failure) after checking it; `batches` records each batch as
    (seq, n_tokens, n_rows) tuples; `copies` each `copy_prefix` as (src, dst, n)."""

    def __init__(
        self, n_seq: int = 4, n_batch: int = 64, model: FakeEngine | None = None, **kwargs: object
    ) -> None:
        self.model = model or FakeEngine(**kwargs)  # type: ignore[arg-type]
        self.name = self.model.name
        self.n_vocab = self.model.n_vocab
        self.n_seq = n_seq
        self.n_batch = n_batch
        self.decode_s = 0.0
        self.fail_next = False
        self.batches: list[tuple[tuple[int, int, int], ...]] = []
        # each logits row computed: (sequence, the tokens it scores the next one after)
        self.row_contexts: list[tuple[int, tuple[int, ...]]] = []
        self.copies: list[tuple[int, int, int]] = []
        # each `restore_state` as (seq, n_tokens); `no_room` makes restores fail
        self.restores: list[tuple[int, int]] = []
        self.no_room = False
        self._views = [FakeSeqView(self, i) for i in range(n_seq)]

    def sequence(self, seq: int) -> FakeSeqView:
        return self._views[seq]

    def decode_batch(self, parts, copy=True):  # rows are fresh arrays either way
        from specgen.errors import EngineError

        seqs = [p.seq for p in parts]
        assert parts and len(set(seqs)) == len(seqs), seqs
        assert sum(len(p.tokens) for p in parts) <= self.n_batch
        for p in parts:
            assert p.tokens and 0 <= p.n_rows <= len(p.tokens)
            assert p.rows is None or (len(p.rows) == p.n_rows and list(p.rows) == sorted(p.rows))
            assert len(self._views[p.seq].tokens) + len(p.tokens) <= self.model.n_ctx
        self.batches.append(tuple((p.seq, len(p.tokens), p.n_rows) for p in parts))

        if self.fail_next:
            self.fail_next = False
            raise EngineError("fake: llama_decode failed (code -3)")
        out = []
        for p in parts:
            view = self._views[p.seq]
            start = len(view.tokens)
            view.tokens.extend(p.tokens)
            rows = [start + j for j in p.wanted()]
            self.row_contexts += [(p.seq, tuple(view.tokens[: i + 1])) for i in rows]
            out.append(
                np.stack([self.model.logits_after(view.tokens[: i + 1]) for i in rows])
                if rows
                else np.zeros((0, self.n_vocab), dtype=np.float32)
            )
            assert len(view.tokens) - start == len(p.tokens)
        return out


class FakeSeqView:
    """Sequence `seq` of a FakeBatchEngine, as an Engine."""

    def __init__(self, engine: FakeBatchEngine, seq: int) -> None:
        self.engine = engine
        self.seq = seq
        m = engine.model
        self.name, self.n_vocab, self.n_ctx, self.vocab = m.name, m.n_vocab, m.n_ctx, m.vocab
        self.tokens: list[int] = []
        self.decode_s = 0.0

    def tokenize(self, text: bytes, add_special: bool = True) -> list[int]:
        return self.engine.model.tokenize(text, add_special)

    def token_bytes(self, token: int) -> bytes:
        return self.engine.model.token_bytes(token)

    def token_text(self, token: int) -> str:
        return self.engine.model.token_text(token)

    def is_eog(self, token: int) -> bool:
        return self.engine.model.is_eog(token)

    def decode(
        self, tokens: list[int], all_logits: bool = False, rows: list[int] | None = None
    ) -> np.ndarray:
        assert tokens and len(self.tokens) + len(tokens) <= self.n_ctx
        start = len(self.tokens)
        self.tokens.extend(tokens)
        wanted = _wanted(len(tokens), all_logits, rows)
        self.engine.row_contexts += [
            (self.seq, tuple(self.tokens[: start + j + 1])) for j in wanted
        ]
        model = self.engine.model
        return _stack([model.logits_after(self.tokens[: start + j + 1]) for j in wanted], model)

    def truncate(self, n: int) -> None:
        del self.tokens[n:]

    def copy_prefix(self, src: FakeSeqView, n: int) -> None:
        """`SequenceView.copy_prefix`: hold src's first n positions, none evaluated."""
        assert src.engine is self.engine and len(src.tokens) >= n
        self.tokens = list(src.tokens[:n])
        self.engine.copies.append((src.seq, self.seq, n))

    def save_state(self) -> FakeState:
        """`SequenceView.save_state`: the cells are the tokens (8 bytes each)."""
        return FakeState(tuple(self.tokens))

    def restore_state(self, state: FakeState) -> None:
        """`SequenceView.restore_state`; with `no_room` the sequence is left empty and
        EngineError raised, as llama.cpp without contiguous free cells."""
        from specgen.errors import EngineError

        self.tokens = []
        if self.engine.no_room:
            raise EngineError("fake: no room in the cache to restore")
        self.tokens = list(state.tokens)
        self.engine.restores.append((self.seq, len(state.tokens)))

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class FakeState:
    """A fake sequence's saved cells (`FakeSeqView.save_state`)."""

    tokens: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return 8 * len(self.tokens)


#: a small vocabulary for grammar tests: multi-letter pieces, so one string has several
#: tokenizations ("ab" is token 3, or 1 then 2); token 0 is the end of generation. The
#: 256 byte tokens follow (ids 8..263): llguidance's token trie needs every byte spelled
#: by some token (a SentencePiece vocabulary's byte fallback; measured: without them it
#: allowed nothing but EOS).
GRAMMAR_PIECES: dict[int, bytes] = {
    0: b"",
    1: b"a",
    2: b"b",
    3: b"ab",
    4: b"c",
    5: b"{",
    6: b"}",
    7: b"x",
    **{8 + i: bytes([i]) for i in range(256)},
}


class TextEngine(FakeEngine):
    """A fake model over `GRAMMAR_PIECES` whose tokenizer spells text with its pieces
    (longest match first; llguidance tokenizes forced strings with it). Token 0 is EOS.

    Its logits are closed-form in the last two tokens: ``T1[b] + T2[a]`` (two
    (n_vocab, n_vocab) tables, where FakeEngine's cube would be 73 MB at 264 tokens)."""

    def __init__(
        self,
        seed: int = 0,
        scale: float = 2.0,
        n_ctx: int = 256,
        noise: float = 0.0,
        noise_seed: int = 1,
    ) -> None:
        super().__init__(n_vocab=2, seed=seed, n_ctx=n_ctx, eos=0)
        n = len(GRAMMAR_PIECES)
        rng = np.random.default_rng(seed)
        self.t1 = rng.standard_normal((n, n)).astype(np.float32) * scale
        self.t2 = rng.standard_normal((n, n)).astype(np.float32) * (scale / 2)
        if noise:
            nz = np.random.default_rng(noise_seed)
            self.t1 += (nz.standard_normal((n, n)) * noise).astype(np.float32)
            self.t2 += (nz.standard_normal((n, n)) * noise).astype(np.float32)
        self.n_vocab = n
        self.vocab = VocabInfo(1, n, 1, 0, True, False)
        self.pieces = dict(GRAMMAR_PIECES)
        self.name = f"text-{seed}"
        self._by_len = sorted(
            ((p, t) for t, p in self.pieces.items() if p), key=lambda pt: -len(pt[0])
        )

    def logits_after(self, context: list[int]) -> np.ndarray:
        a = context[-2] if len(context) >= 2 else 0
        return self.t1[context[-1]] + self.t2[a]

    def tokenize(self, text: bytes, add_special: bool = True) -> list[int]:
        out, i = [], 0
        while i < len(text):
            for piece, t in self._by_len:
                if text.startswith(piece, i):
                    out.append(t)
                    i += len(piece)
                    break
        return out
