"""OpenAI's completions ``echo``: the prompt before the completion, and with ``logprobs``
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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specgen.logprobs import TokenLogprob

__all__ = ["Echo"]


@dataclass
class Echo:
    """One request's echo.

    Attributes:
        text: the prompt as echoed: the string sent, or the text of the token ids sent.
        first: the first prompt token's bytes (its entry in ``tokens``).
        logprobs: prompt tokens 2..n with their alternatives, once the prompt has been
            evaluated (`Prefilled.prompt_logprobs` of choice 0: every choice shares its
            prompt), else None.
    """

    text: str
    first: bytes
    logprobs: tuple[TokenLogprob, ...] | None = None

    @classmethod
    def of(cls, text: str | None, prompt: list[int], token_bytes: Callable[[int], bytes]) -> Echo:
        """The echo of a prompt sent as `text` (echoed as sent) or as token ids (`text`
        None: echoed as the text they spell); `prompt`: its token ids, at least one."""
        first = token_bytes(prompt[0])
        if text is None:
            text = b"".join([first, *(token_bytes(t) for t in prompt[1:])]).decode(
                "utf-8", "replace"
            )
        return cls(text, first)

    def legacy_logprobs(self) -> dict[str, list[Any]]:
        """The prompt's part of the legacy ``logprobs`` object: ``tokens``,
        ``token_logprobs``, ``top_logprobs`` (null for the first token) and
        ``text_offset`` (each token's first character in the echoed text)."""
        first = self.first.decode("utf-8", "replace")
        out: dict[str, list[Any]] = {
            "tokens": [first], "token_logprobs": [None], "top_logprobs": [None],
            "text_offset": [0],
        }  # fmt: skip
        offset = len(first)
        for lp in self.logprobs or ():
            out["tokens"].append(lp.text)
            out["token_logprobs"].append(lp.logprob)
            out["top_logprobs"].append({t.text: t.logprob for t in lp.top})
            out["text_offset"].append(offset)
            offset += len(lp.text)
        return out

    def joined(self, generated: dict[str, list[Any]] | None) -> dict[str, list[Any]] | None:
        """The prompt's entries followed by the completion's (`generated`: its legacy
        ``logprobs``, offsets already counted from the end of the echoed text); None
        when the request asked for no logprobs (`generated` None)."""
        if generated is None:
            return None
        prompt = self.legacy_logprobs()
        return {k: prompt[k] + generated[k] for k in prompt}
