"""One sequence of a `LlamaEngine` as an `Engine` of its own (the server's slots)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from specgen.engine import EngineView, Logits

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

    def close(self) -> None:
        pass
