"""Committed tokens -> output text: UTF-8 across token boundaries, stop strings,
end-of-generation and the token limit. Pure apart from the engine's vocabulary."""

from __future__ import annotations

import codecs
from collections.abc import Callable
from typing import TYPE_CHECKING

from specgen.events import FinishReason, Source, Span

if TYPE_CHECKING:
    from specgen.genconfig import GenerateConfig


class Emitter:
    """Turns committed tokens into `Span`s and decides when generation ends.

    Text is released only when it is valid UTF-8 (a character split across tokens, or
    across blocks, waits for its last byte) and cannot be the start of a stop string
    (so streamed text never has to be taken back). A stop string is cut exactly: the
    text before it is emitted, the stop string and everything after it are not.

    Args:
        token_bytes: token id -> the bytes it renders to.
        is_eog: token id -> True for end-of-generation tokens.
        stop: stop strings.
        ignore_eos: keep going through end-of-generation tokens.
        max_tokens: emit at most this many tokens.
        stop_ids: tokens that end generation once emitted (their text kept), as vLLM's
            ``stop_token_ids``.
        keep_stop: keep the stop string itself in the text (vLLM's
            ``include_stop_str_in_output``); what follows it is still cut.
        min_tokens: a stop string ends the output only where it ends in a token after
            the first `min_tokens` (vLLM's ``min_tokens``, whose detokenizer checks stop
            strings only from then on); text that might start one is still held.
    """

    def __init__(
        self,
        token_bytes: Callable[[int], bytes],
        is_eog: Callable[[int], bool],
        stop: tuple[str, ...] = (),
        ignore_eos: bool = False,
        max_tokens: int = 256,
        stop_ids: tuple[int, ...] = (),
        keep_stop: bool = False,
        min_tokens: int = 0,
    ) -> None:
        self._bytes = token_bytes
        self._is_eog = is_eog
        self._stop = tuple(s for s in stop if s)
        self._ignore_eos = ignore_eos
        self.max_tokens = max_tokens
        self._stop_ids = frozenset(stop_ids)
        self._keep_stop = keep_stop
        self._min_tokens = min_tokens
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._held = ""  # decoded text that might still become a stop string
        self.tokens: list[int] = []
        self.text_parts: list[str] = []
        self.finish: FinishReason | None = None

    @classmethod
    def of(
        cls,
        config: GenerateConfig,
        token_bytes: Callable[[int], bytes],
        is_eog: Callable[[int], bool],
    ) -> Emitter:
        """The emitter of a generation's settings: its stop strings and token ids, whether
        the stop string is kept, `ignore_eos`, -n and ``min_tokens``."""
        return cls(
            token_bytes, is_eog, config.stop, config.ignore_eos, config.max_tokens,
            config.stop_token_ids, config.include_stop, config.min_tokens,
        )  # fmt: skip

    @property
    def remaining(self) -> int:
        """Tokens that may still be emitted."""
        return self.max_tokens - len(self.tokens)

    def push(self, token: int, from_draft: bool, source: Source | None = None) -> Span | None:
        """Commit one token. Returns its Span, or None when it ended generation without
        being emitted (an end-of-generation token). Must not be called after `finish`.
        `source` says who proposed it (see `Span`; default from `from_draft`)."""
        assert self.finish is None
        if self._is_eog(token) and not self._ignore_eos:
            self.finish = "eos"
            tail = self._flush()
            self.text_parts.append(tail)
            return Span(tail, token, from_draft, source) if tail else None
        self.tokens.append(token)
        new_from = len(self._held)  # where this token's own text starts in `text`
        text = self._held + self._decoder.decode(self._bytes(token))
        self._held = ""
        cut = self._find_stop(text, new_from) if len(self.tokens) > self._min_tokens else None
        if cut is not None:
            text = text[: cut[1] if self._keep_stop else cut[0]]
            self.finish = "stop"
        elif token in self._stop_ids:
            self.finish = "stop"
            text += self._flush()
        else:
            hold = self._stop_prefix_len(text)
            if hold:
                text, self._held = text[:-hold], text[-hold:]
            if len(self.tokens) >= self.max_tokens:
                self.finish = "length"
                text += self._flush()
        self.text_parts.append(text)
        return Span(text, token, from_draft, source)

    def close(self, reason: FinishReason) -> str:
        """End generation from outside (context full, interrupt); returns held text."""
        if self.finish is None:
            self.finish = reason
        tail = self._flush()
        self.text_parts.append(tail)
        return tail

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    def _flush(self) -> str:
        tail = self._held + self._decoder.decode(b"", final=True)
        self._held = ""
        return tail

    def _find_stop(self, text: str, after: int) -> tuple[int, int] | None:
        """(start, end) of the earliest stop string in `text` that ends after `after` (in
        the newest token's text: one that ended earlier was passed over under
        `min_tokens`), the first given among those starting there; or None."""
        found = (text.find(s, max(0, after - len(s) + 1)) for s in self._stop)
        hits = [(i, k) for k, i in enumerate(found) if i >= 0]
        if not hits:
            return None
        i, k = min(hits)
        return i, i + len(self._stop[k])

    def _stop_prefix_len(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
        best = 0
        for s in self._stop:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best
