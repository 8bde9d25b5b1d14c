"""The server's prompt cache in host memory: the cells of prompts that left their slot,
kept so that a later request sharing their prefix restores them instead of evaluating the
prompt again (llama-server's `--cache-ram`, llama.cpp PR 16391; vLLM's automatic prefix
caching keeps blocks in GPU memory for the same reason).

A slot keeps its last request's cells until another request takes it, and a request goes
to the free slot holding its longest prefix (`Scheduler._admit`). When the slot it gets
would drop cells (they are not a prefix of the new prompt), `PromptCache.save` copies
them out first; when a saved entry shares a longer prefix with the new prompt than the
slot does, the slot takes that entry's cells (`SequenceView.restore_state`), then rolls
back to the common prefix as before. Clients that resend a conversation, a system prompt
or a benchmark's prompts pay their prefill once.

Exact: the restored keys and values are the bytes a decode of the same tokens at the
same positions wrote (`save_state` copies them, `restore_state` writes them back), so a
request's distribution is the one a cold prefill gives, as with a slot's own cells.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from specgen.drafters import common_prefix

__all__ = ["Entry", "PromptCache", "State", "StateView"]


class State(Protocol):
    """A sequence's cells copied out of a cache (`specgen.llamacpp.SavedState`)."""

    @property
    def tokens(self) -> tuple[int, ...]: ...

    @property
    def nbytes(self) -> int: ...


class StateView(Protocol):
    """A slot's sequence that can copy its cells out and take saved ones back
    (`specgen.llamacpp.SequenceView`)."""

    @property
    def tokens(self) -> list[int]: ...

    def save_state(self) -> State: ...

    def restore_state(self, state: State) -> None: ...


@dataclass(frozen=True)
class Entry:
    """One saved prompt: the target's cells and, when the slot had any, the draft's."""

    target: State
    draft: State | None

    @property
    def nbytes(self) -> int:
        return self.target.nbytes + (self.draft.nbytes if self.draft is not None else 0)


class PromptCache:
    """Saved prompts, least recently used first, within `limit_bytes` (None: no limit).

    Args:
        limit_bytes: the most bytes of cells kept (`--cache-ram` MiB x 2^20); the least
            recently used entries go first. None: no limit.
        min_tokens: shorter contents are not worth a copy (their prefill is one chunk).
    """

    def __init__(self, limit_bytes: int | None, min_tokens: int = 16) -> None:
        self.limit_bytes = limit_bytes
        self.min_tokens = min_tokens
        self._entries: collections.OrderedDict[tuple[int, ...], Entry] = collections.OrderedDict()
        self.nbytes = 0
        self.hits = 0  # restores
        self.saves = 0

    def __len__(self) -> int:
        return len(self._entries)

    def save(self, target: StateView, draft: StateView | None) -> bool:
        """Copy a slot's cells in, unless an entry already holds them (its tokens start
        with these); entries whose tokens these start with are replaced. False when
        nothing was kept (too short, already held, or larger than the limit)."""
        tokens = tuple(target.tokens)
        if len(tokens) < self.min_tokens:
            return False
        for key in self._entries:
            if key[: len(tokens)] == tokens:
                self._entries.move_to_end(key)
                return False
        for key in [k for k in self._entries if tokens[: len(k)] == k]:
            self._drop(key)
        entry = Entry(target.save_state(), _draft_state(draft))
        if self.limit_bytes is not None and entry.nbytes > self.limit_bytes:
            return False
        self._entries[tokens] = entry
        self.nbytes += entry.nbytes
        self.saves += 1
        while self.limit_bytes is not None and self.nbytes > self.limit_bytes:
            self._drop(next(iter(self._entries)))
        return True

    def best(self, prompt: Sequence[int]) -> tuple[Entry | None, int]:
        """The entry sharing the longest prefix with `prompt`, and that length (None, 0
        when none shares any)."""
        best: Entry | None = None
        n_best = 0
        for key, entry in self._entries.items():
            n = common_prefix(list(key), list(prompt))
            if n > n_best:
                best, n_best = entry, n
        return best, n_best

    def restore(self, entry: Entry, target: StateView, draft: StateView | None) -> None:
        """Give a slot `entry`'s cells (the draft's only where both have a draft).

        Raises:
            EngineError: from `restore_state` (no room: the sequence is left empty).
        """
        target.restore_state(entry.target)
        if draft is not None and entry.draft is not None:
            draft.restore_state(entry.draft)
        self._entries.move_to_end(entry.target.tokens)
        self.hits += 1

    def _drop(self, key: tuple[int, ...]) -> None:
        self.nbytes -= self._entries.pop(key).nbytes


def _draft_state(draft: StateView | None) -> State | None:
    if draft is None or not draft.tokens:
        return None
    return draft.save_state()
