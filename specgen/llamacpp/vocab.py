"""The vocabulary half of `LlamaEngine`: tokenizing, token pieces and texts, the chat
template and end-of-generation tokens, through the model's `llama_vocab` pointer."""

from __future__ import annotations

import ctypes
from typing import Any

import llama_cpp

from specgen.errors import EngineError

__all__ = ["VocabularyMixin"]


class VocabularyMixin:
    """`LlamaEngine`'s vocabulary methods (`specgen.engine.Engine`'s tokenize, token_bytes,
    token_text, is_eog), over the attributes the engine sets when it opens the model."""

    name: str
    _model: Any
    _vocab: Any
    _piece_cache: dict[int, bytes]

    def _check_open(self) -> None:
        """EngineError once `close` has freed the model: llama.cpp would read freed memory
        (a freed vocabulary aborts the whole process, or segfaults)."""
        if self._model is None:
            raise EngineError(f"{self.name}: the model is closed")

    def _open_vocab(self) -> Any:
        """The `llama_vocab` pointer, after `_check_open`."""
        self._check_open()
        return self._vocab

    def tokenize(self, text: bytes, add_special: bool = True) -> list[int]:
        """Tokenize UTF-8 bytes; special-token text (e.g. ``<start_of_turn>``) is parsed."""
        n_max = len(text) + 8
        buf = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(
            self._open_vocab(), text, len(text), buf, n_max, add_special, True
        )
        if n < 0:  # buffer too small: -n is the size needed
            n_max = -n
            buf = (llama_cpp.llama_token * n_max)()
            n = llama_cpp.llama_tokenize(
                self._open_vocab(), text, len(text), buf, n_max, add_special, True
            )
        if n < 0:
            raise EngineError(f"{self.name}: tokenization failed")
        return list(buf[:n])

    def token_bytes(self, token: int) -> bytes:
        """Bytes the token renders to in output text; control tokens give b''."""
        piece = self._piece_cache.get(token)
        if piece is None:
            buf = ctypes.create_string_buffer(64)
            n = llama_cpp.llama_token_to_piece(self._open_vocab(), token, buf, 64, 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, -n, 0, False)
            piece = buf.raw[: max(n, 0)]
            self._piece_cache[token] = piece
        return piece

    def token_text(self, token: int) -> str:
        """The vocabulary entry as stored (`llama_vocab_get_text`)."""
        raw = llama_cpp.llama_vocab_get_text(self._open_vocab(), token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    def llama_vocab(self) -> Any:
        """The model's `llama_vocab` pointer, valid while the engine is open: what
        `specgen.grammar` builds its tokenizer from (llguidance's `lltokenizer_from_vocab`)."""
        return self._open_vocab()

    def chat_template(self) -> str | None:
        """The GGUF's default chat template (`tokenizer.chat_template`), or None."""
        self._check_open()
        raw = llama_cpp.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8", errors="replace") if raw else None

    def is_eog(self, token: int) -> bool:
        """End-of-generation token (EOS, EOT, ...) per `llama_vocab_is_eog`."""
        return bool(llama_cpp.llama_vocab_is_eog(self._open_vocab(), token))
