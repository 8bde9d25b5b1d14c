"""One sequence of a `LlamaEngine` as an `Engine` of its own (the server's slots)."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import TYPE_CHECKING

import llama_cpp

from specgen.engine import EngineView, Logits
from specgen.errors import EngineError

if TYPE_CHECKING:
    from specgen.llamacpp.engine import LlamaEngine

__all__ = ["SequenceView"]


class SequenceView(EngineView["LlamaEngine"]):
    """Sequence `seq` of a `LlamaEngine`, implementing `specgen.engine.Engine`: the
    vocabulary is the engine's; `decode` and `truncate` touch only this sequence's cells
    (`llama_memory_seq_rm(mem, seq, n, -1)`), so one slot's rollback never moves another's.
    `n_ctx` is this sequence's share of the unified cache; `decode_s` is the engine's
    (shared by all sequences). `close` is a no-op: the engine owns the context."""

    def __init__(self, engine: LlamaEngine, seq: int) -> None:
        super().__init__(engine)
        self.seq = seq

    @property
    def tokens(self) -> list[int]:
        return self.engine._seqs[self.seq]

    @property
    def n_reprocessed(self) -> int:
        return self.engine.n_reprocessed

    def decode(
        self, tokens: list[int], all_logits: bool = False, rows: Sequence[int] | None = None
    ) -> Logits:
        """`LlamaEngine.decode` on this sequence (a view valid until the next decode)."""
        return self.engine._decode_seq(self.seq, tokens, all_logits, rows)

    def truncate(self, n: int) -> None:
        """`LlamaEngine.truncate` on this sequence only."""
        self.engine._truncate_seq(self.seq, n)

    def copy_prefix(self, src: SequenceView, n: int) -> None:
        """Hold the first n positions of `src` (another sequence of the same engine),
        sharing its cells: see `LlamaEngine._copy_prefix`."""
        assert src.engine is self.engine
        self.engine._copy_prefix(src.seq, self.seq, n)

    def save_state(self) -> SavedState:
        """This sequence's cells, copied out of the cache (`llama_state_seq_get_data`:
        keys and values of every layer for its positions; of a sliding-window layer only
        the cells it still holds), with the tokens they are for.

        Raises:
            EngineError: llama.cpp wrote fewer bytes than it asked for.
        """
        e = self.engine
        e._check_open()
        n = int(llama_cpp.llama_state_seq_get_size(e._ctx, self.seq))
        buf = (ctypes.c_uint8 * n)()
        if int(llama_cpp.llama_state_seq_get_data(e._ctx, buf, n, self.seq)) != n:
            raise EngineError(f"{self.name}: could not copy sequence {self.seq}'s cells")
        return SavedState(tuple(self.tokens), buf)

    def restore_state(self, state: SavedState) -> None:
        """Replace this sequence's cells with `state`'s (`llama_state_seq_set_data`: the
        cells are written back, not evaluated again, so the next decode sees the keys and
        values `save_state` copied, bit for bit).

        Raises:
            EngineError: the cache has no room for them (the sequence is left empty), or
                they do not hold `state.tokens`' positions.
        """
        e = self.engine
        e._check_open()
        e._truncate_seq(self.seq, 0)
        data = state.data
        if int(llama_cpp.llama_state_seq_set_data(e._ctx, data, len(data), self.seq)) == 0:
            llama_cpp.llama_memory_seq_rm(e._mem, self.seq, -1, -1)
            raise EngineError(f"{self.name}: no room in the cache to restore sequence {self.seq}")
        if int(llama_cpp.llama_memory_seq_pos_max(e._mem, self.seq)) != len(state.tokens) - 1:
            llama_cpp.llama_memory_seq_rm(e._mem, self.seq, -1, -1)
            raise EngineError(f"{self.name}: restored cells do not match their tokens")
        e._seqs[self.seq] = list(state.tokens)

    def close(self) -> None:
        pass


class SavedState:
    """A sequence's cells copied out of a llama.cpp cache (`SequenceView.save_state`).

    Attributes:
        tokens: the tokens at positions 0..len-1 that the cells hold.
        data: llama.cpp's serialized sequence state (`llama_state_seq_get_data`), bytes.
    """

    __slots__ = ("tokens", "data")

    def __init__(self, tokens: tuple[int, ...], data: ctypes.Array[ctypes.c_uint8]) -> None:
        self.tokens = tokens
        self.data = data

    @property
    def nbytes(self) -> int:
        return len(self.data)
