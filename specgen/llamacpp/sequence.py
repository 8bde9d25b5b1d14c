"""One sequence of a `LlamaEngine` as an `Engine` of its own (the server's slots)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from specgen.engine import Logits, VocabInfo

if TYPE_CHECKING:
    from specgen.llamacpp.engine import LlamaEngine

__all__ = ["SequenceView"]


class SequenceView:
    """Sequence `seq` of a `LlamaEngine`, implementing `specgen.engine.Engine`: the
    vocabulary is the engine's; `decode` and `truncate` touch only this sequence's cells
    (`llama_memory_seq_rm(mem, seq, n, -1)`), so one slot's rollback never moves another's.
    `n_ctx` is this sequence's share of the unified cache; `decode_s` is the engine's
    (shared by all sequences). `close` is a no-op: the engine owns the context."""

    def __init__(self, engine: LlamaEngine, seq: int) -> None:
        self.engine = engine
        self.seq = seq
        self.name = engine.name

    @property
    def n_vocab(self) -> int:
        return self.engine.n_vocab

    @property
    def n_ctx(self) -> int:
        return self.engine.n_ctx

    @property
    def vocab(self) -> VocabInfo:
        return self.engine.vocab

    @property
    def tokens(self) -> list[int]:
        return self.engine._seqs[self.seq]

    @property
    def decode_s(self) -> float:
        return self.engine.decode_s

    @property
    def n_reprocessed(self) -> int:
        return self.engine.n_reprocessed

    def tokenize(self, text: bytes, add_special: bool = True) -> list[int]:
        return self.engine.tokenize(text, add_special)

    def token_bytes(self, token: int) -> bytes:
        return self.engine.token_bytes(token)

    def token_text(self, token: int) -> str:
        return self.engine.token_text(token)

    def is_eog(self, token: int) -> bool:
        return self.engine.is_eog(token)

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
