"""Log-probabilities as OpenAI's responses carry them: chat's ``logprobs.content``
(`chat_logprobs`), the legacy completions' parallel lists (`text_logprobs`), and
completions' ``echo`` (`Echo`): the prompt before the completion, and with ``logprobs``
the prompt's own log-probabilities before the completion's (what evaluation harnesses
score a text by: lm-evaluation-harness's ``loglikelihood`` requests send ``echo: true,
logprobs: 1, max_tokens: 1`` and read the prompt's entries; ``max_tokens: 0`` scores the
prompt alone).

The prompt's values come from the engine (`GenerateConfig.prompt_logprobs`, carried by the
`Prefilled` event): each prompt token after the first under the target's raw logits at
the position before it, the meaning of every other logprob the server reports
(`specgen.logprobs`). The first token has no position before it: its logprob and its
alternatives are null, as OpenAI's are.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from specgen.events import Span
from specgen.logprobs import TokenLogprob

__all__ = ["Echo", "TextOffsets", "chat_logprobs", "text_logprobs"]


def legacy_token(piece: bytes) -> str:
    """A token as the legacy completions' ``logprobs`` name it: its text, or where its bytes
    are no UTF-8 text by themselves (part of a character) ``bytes:`` and their escapes
    (``bytes:\\xe6\\x97``), as OpenAI's legacy API writes them: two such tokens shown as
    U+FFFD would share one ``top_logprobs`` key, the later overwriting the earlier."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in piece)


def _legacy_top(lp: TokenLogprob) -> dict[str, float]:
    """A legacy ``top_logprobs`` object: the most likely tokens (`legacy_token`) to their
    logprob, and the chosen token's too, as OpenAI's legacy API ("up to logprobs + 1
    elements") and vLLM give it (so ``logprobs: 0`` still names the chosen token)."""
    top = {legacy_token(t.piece): t.logprob for t in lp.top}
    top.setdefault(legacy_token(lp.piece), lp.logprob)
    return top


def _entry(lp: TokenLogprob) -> dict[str, Any]:
    return {"token": lp.text, "logprob": lp.logprob, "bytes": list(lp.piece)}


def chat_logprobs(spans: Sequence[Span]) -> dict[str, Any]:
    """OpenAI's chat ``logprobs``: ``{"content": [{token, logprob, bytes, top_logprobs}]}``,
    one entry per generated token (an end-of-generation token has none)."""
    content = []
    for s in spans:
        if s.logprob is not None:
            content.append(
                {**_entry(s.logprob), "top_logprobs": [_entry(t) for t in s.logprob.top]}
            )
    return {"content": content}


class TextOffsets:
    """Each token's first character in a text spelled by token pieces (``text_offset``):
    the characters the pieces before it decode to, a UTF-8 character split across tokens
    counted once, at the token that completes it. Counted from the pieces, not from the
    text released so far: a stop string's first tokens are held back from the text until
    it is known whether the string matches, and they still start where they stand."""

    def __init__(self, start: int = 0) -> None:
        self.n = start
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def advance(self, piece: bytes) -> int:
        """The offset of a token with bytes `piece`, then counts its characters."""
        at = self.n
        self.n += len(self._decoder.decode(piece))
        return at


def text_logprobs(
    spans: Sequence[Span], offsets: TextOffsets | None = None, eos: TokenLogprob | None = None
) -> dict[str, Any]:
    """OpenAI's legacy completions ``logprobs``: parallel lists ``tokens`` (named by
    `legacy_token`), ``token_logprobs``, ``top_logprobs`` (one ``{token: logprob}`` object
    per token) and ``text_offset`` (each token's first character in the completion's text, from
    `offsets`, which it advances: a stream's chunks share one; from 0 when None), then the
    end-of-generation token that ended them (`eos`, `Step.eos_logprob`) as OpenAI and
    vLLM list it. Tokens past a stop string are listed, as vLLM lists them (their
    offsets then reach past the text)."""
    out: dict[str, list[Any]] = {
        "tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": [],
    }  # fmt: skip
    offsets = offsets or TextOffsets()
    for lp in [s.logprob for s in spans] + [eos]:
        if lp is not None:
            out["tokens"].append(legacy_token(lp.piece))
            out["token_logprobs"].append(lp.logprob)
            out["top_logprobs"].append(_legacy_top(lp))
            out["text_offset"].append(offsets.advance(lp.piece if lp is not eos else b""))
    return out


@dataclass
class Echo:
    """One request's echo.

    Attributes:
        text: the prompt as echoed: the string sent, or the text of the token ids sent
            (special tokens as their text, as vLLM's and llama-server's ``/detokenize``).
        pieces: each prompt token's bytes, special tokens as their text (``tokens``).
        offsets: each prompt token's first character in `text` (``text_offset``): the
            characters its bytes before it decode to, UTF-8 split across tokens
            included; a BOS the server added (not in the string sent) takes none.
        logprobs: prompt tokens 2..n with their alternatives, once the prompt has been
            evaluated (`Prefilled.prompt_logprobs` of choice 0: every choice shares its
            prompt), else None.
    """

    text: str
    pieces: list[bytes]
    offsets: list[int]
    logprobs: tuple[TokenLogprob, ...] | None = None

    @classmethod
    def of(cls, text: str | None, prompt: list[int], piece: Callable[[int], bytes]) -> Echo:
        """The echo of a prompt sent as `text` (echoed as sent) or as token ids (`text`
        None: echoed as the text they spell); `prompt`: its token ids, at least one;
        `piece`: a token's bytes, special tokens as their text."""
        pieces = [piece(t) for t in prompt]
        if text is None:
            text = b"".join(pieces).decode("utf-8", "replace")
        counted = list(pieces)
        if not text.startswith(pieces[0].decode("utf-8", "replace")):
            counted[0] = b""  # a BOS the tokenizer added to the string sent
        offsets = TextOffsets()
        return cls(text, pieces, [offsets.advance(b) for b in counted])

    def legacy_logprobs(self) -> dict[str, list[Any]]:
        """The prompt's part of the legacy ``logprobs`` object: ``tokens``,
        ``token_logprobs``, ``top_logprobs`` (null for the first token) and
        ``text_offset``; only the first token's entry until the prompt's log-probabilities
        have come."""
        lps = [None, *(self.logprobs or ())]
        return {
            "tokens": [legacy_token(p) for p in self.pieces[: len(lps)]],
            "token_logprobs": [lp.logprob if lp else None for lp in lps],
            "top_logprobs": [_legacy_top(lp) if lp else None for lp in lps],
            "text_offset": self.offsets[: len(lps)],
        }

    def joined(self, generated: dict[str, list[Any]] | None) -> dict[str, list[Any]] | None:
        """The prompt's entries followed by the completion's (`generated`: its legacy
        ``logprobs``, offsets already counted from the end of the echoed text); None
        when the request asked for no logprobs (`generated` None)."""
        if generated is None:
            return None
        prompt = self.legacy_logprobs()
        return {k: prompt[k] + generated[k] for k in prompt}
