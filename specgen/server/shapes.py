"""From a request's events to OpenAI response bodies: the full response, one chunk per
round, the final chunk and the usage chunk. Pure (no HTTP, no clock besides the `created`
the caller passes). From the request to its settings: `specgen.server.requestconfig`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specgen import Done, FinishReason, Stats, Step
from specgen.server import stats as request_stats
from specgen.server.logprobs import Echo, TextOffsets, chat_logprobs, text_logprobs
from specgen.server.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChunkChoice,
    Completion,
    ErrorInfo,
    PromptTokensDetails,
    TextChoice,
    Usage,
)
from specgen.server.tools import Choice, parse

_OPENAI_FINISH: dict[str, str] = {
    "eos": "stop",
    "stop": "stop",
    "length": "length",
    "context": "length",
    "interrupted": "abort",
}


def openai_finish(reason: FinishReason | str) -> str:
    """OpenAI's finish_reason for specgen's: stop, length, or abort (shutdown, failure)."""
    return _OPENAI_FINISH.get(reason, "abort")


def _calls_finish(finish: str) -> str:
    """An answer with tool calls: finish reason ``tool_calls``, or ``length`` where
    max_tokens (or the context) cut it, so a client knows a later call may be missing."""
    return finish if finish == "length" else "tool_calls"


SHUTDOWN_ERROR = ErrorInfo(
    message="the server is shutting down: generation stopped before its end",
    type="unavailable_error",
    code="shutdown",
)


@dataclass
class Outcome:
    """How a request ended, as the response reports it."""

    text: str
    finish: str  # specgen's reason, "failed" or "cancelled"
    stats: Stats | None
    error: ErrorInfo | None
    tokens: tuple[int, ...] = ()

    @classmethod
    def of_done(cls, done: Done) -> Outcome:
        error = SHUTDOWN_ERROR if done.finish_reason == "interrupted" else None
        return cls(done.text, done.finish_reason, done.stats, error, done.tokens)


def _cached(outcomes: Sequence[Outcome]) -> PromptTokensDetails:
    """OpenAI's ``usage.prompt_tokens_details``: the prompt tokens found cached, summed
    over `outcomes` (one per prompt)."""
    cached = sum(request_stats.cached_tokens(o.stats) for o in outcomes)
    return PromptTokensDetails(cached_tokens=cached)


@dataclass
class Shape:
    """Builds one request's bodies. `chat` picks the chat or the text completion shape;
    `n_prompts`: each prompt's tokens (completions take several), whose choices are
    ``p * n + i`` (prompt p's i-th, as OpenAI orders them); `logprobs`: whether the request
    asked for them (chat ``logprobs: true``, completions ``logprobs: N``)."""

    chat: bool
    id: str
    model: str
    created: int
    n_prompts: Sequence[int]
    return_tokens: bool = False
    logprobs: bool = False
    tools: Choice | None = None  # the answer may hold tool calls (`specgen.server.tools`)
    # completions' echo, one per prompt: the prompt first (`specgen.server.logprobs`)
    echoes: Sequence[Echo] = ()
    n: int = 1  # choices per prompt
    predicted: bool = False  # the request gave a prediction: usage counts its tokens
    # a streamed completion's tokens' characters so far per choice (its text_offset)
    _offsets: dict[int, TextOffsets] = field(default_factory=dict)

    @property
    def n_prompt(self) -> int:
        """The request's prompt tokens: each prompt once, whatever n."""
        return sum(self.n_prompts)

    def echo_of(self, index: int) -> Echo | None:
        """Choice `index`'s echo (its prompt's), or None without echo."""
        return self.echoes[index // self.n] if self.echoes else None

    def _logprobs(
        self, steps: Sequence[Step], offsets: TextOffsets | None = None
    ) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        spans = [s for x in steps for s in x.spans]
        if self.chat:  # OpenAI's chat lists no end-of-generation token
            return chat_logprobs(spans)
        eos = steps[-1].eos_logprob if steps else None
        return text_logprobs(spans, offsets, eos)

    def _head(self) -> dict[str, Any]:
        return {"id": self.id, "created": self.created, "model": self.model}

    def _meta(self, steps: Sequence[Step], outcome: Outcome) -> dict[str, Any]:
        return {
            "timings": request_stats.timings(steps, outcome.stats),
            "speculative": request_stats.speculative(
                steps, outcome.finish, outcome.stats.verify_rule if outcome.stats else None
            ),
            "error": outcome.error,
            "tokens": list(outcome.tokens) if self.return_tokens else None,
        }

    def full(self, steps: Sequence[Step], outcome: Outcome) -> dict[str, Any]:
        """The non-streaming response of one choice."""
        return self.full_n([steps], [outcome])

    def full_n(
        self, steps: Sequence[Sequence[Step]], outcomes: Sequence[Outcome]
    ) -> dict[str, Any]:
        """The non-streaming response with one choice per outcome (``index`` in order);
        usage counts each prompt once and every choice's tokens; the statistics, the error
        and ``tokens`` are choice 0's."""
        head = self._head()
        meta = self._meta(steps[0], outcomes[0])
        usage = self._usage_n(steps, outcomes)
        chat_choices, text_choices = [], []
        for i, (st, outcome) in enumerate(zip(steps, outcomes, strict=True)):
            finish = openai_finish(outcome.finish)
            echo = self.echo_of(i)
            # a completion's offsets count from the end of its echoed prompt
            lps = self._logprobs(st, TextOffsets(len(echo.text) if echo is not None else 0))
            if self.chat:
                content, calls = self.parsed(outcome.text)
                if calls is not None:
                    message = AssistantMessage(content=content, tool_calls=calls)
                    finish = _calls_finish(finish)
                else:  # no tools, or the first call cut short (finish "length"): the text as is
                    message = AssistantMessage(content=outcome.text)
                chat_choices.append(
                    ChatChoice(index=i, message=message, logprobs=lps, finish_reason=finish)
                )
            else:
                text = outcome.text
                if echo is not None:
                    text = echo.text + text
                    lps = echo.joined(lps)
                text_choices.append(
                    TextChoice(index=i, text=text, logprobs=lps, finish_reason=finish)
                )
        if self.chat:
            return ChatCompletion(**head, choices=chat_choices, usage=usage, **meta).wire()
        return Completion(**head, choices=text_choices, usage=usage, **meta).wire()

    def _usage_n(self, steps: Sequence[Sequence[Step]], outcomes: Sequence[Outcome]) -> Usage:
        n = sum(
            o.stats.n_generated if o.stats is not None else sum(len(x.spans) for x in st)
            for st, o in zip(steps, outcomes, strict=True)
        )
        return Usage(
            prompt_tokens=self.n_prompt,
            completion_tokens=n,
            total_tokens=self.n_prompt + n,
            # a prompt's choices share one prefill: its first one's (`Scheduler`'s share_from)
            prompt_tokens_details=_cached(outcomes[:: self.n]) if outcomes else None,
            completion_tokens_details=request_stats.predicted(steps) if self.predicted else None,
        )

    def parsed(self, text: str) -> tuple[str | None, list[dict[str, Any]] | None]:
        """``(content, tool_calls)`` of a chat answer (`specgen.server.tools.parse`);
        tool_calls None without calls."""
        if self.tools is None or not self.chat:
            return text, None
        return parse(text, self.tools.syntax)

    def _chunk(
        self,
        delta: str | None,
        finish: str | None,
        lps: dict[str, Any] | None = None,
        index: int = 0,
        **extra: Any,
    ) -> dict[str, Any]:
        head = self._head()
        if self.chat:
            d = {} if delta is None else {"content": delta}
            choices = [ChunkChoice(index=index, delta=d, logprobs=lps, finish_reason=finish)]
            return ChatCompletionChunk(**head, choices=choices, **extra).wire()
        choice = TextChoice(index=index, text=delta or "", logprobs=lps, finish_reason=finish)
        return Completion(**head, choices=[choice], **extra).wire()

    def first_chunk(self, index: int = 0) -> dict[str, Any] | None:
        """The chat stream's opening chunk of a choice (the role, as OpenAI sends); None
        for text. Its content is null where the answer is all calls (``required``, a named
        function), as the whole answer's message is, else ""."""
        if not self.chat:
            return None
        head = self._head()
        calls_only = self.tools is not None and self.tools.kind in ("required", "named")
        delta = {"role": "assistant", "content": None if calls_only else ""}
        choice = ChunkChoice(index=index, delta=delta, finish_reason=None)
        return ChatCompletionChunk(**head, choices=[choice]).wire()

    def echo_chunk(self, index: int = 0) -> dict[str, Any]:
        """A streamed completion's first chunk of choice `index` with ``echo``: the prompt,
        and its log-probabilities when asked; the completion's offsets continue after it."""
        echo = self.echo_of(index)
        assert echo is not None
        self._offsets[index] = TextOffsets(len(echo.text))
        lps = echo.legacy_logprobs() if self.logprobs else None
        return self._chunk(echo.text, None, lps, index)

    def step_chunk(
        self, step: Step, text: str | None = None, index: int = 0, held: Sequence[Step] = ()
    ) -> dict[str, Any]:
        """One round's committed text of choice `index` (or `text`: the content that may go
        out now, with tool calls), with its tokens' log-probabilities when asked, after
        those of the `held` rounds before it (rounds whose text the tool-call gate held
        back: their tokens go out with the chunk that releases their text)."""
        lps = self._logprobs([*held, step], self._offsets.setdefault(index, TextOffsets()))
        return self._chunk(step.text if text is None else text, None, lps, index)

    def final_chunks(
        self,
        steps: Sequence[Step],
        outcome: Outcome,
        rest: str,
        released: int = 0,
        index: int = 0,
        held: Sequence[Step] = (),
    ) -> list[dict[str, Any]]:
        """Choice `index`'s last chunks: what is not sent yet, then an empty delta with the
        finish_reason, the statistics and any error (as OpenAI and llama-server end it;
        openai-python's stream helper never closed a call sent beside the finish_reason).
        `rest`: text the rounds held back (UTF-8 bytes). With tools, the answer is parsed
        whole: its content after the `released` characters streamed (`tools.ContentGate`)
        and its calls go out here, with the logprobs of the `held` rounds, whose text the
        gate kept back, so that a stream lists every token the whole response lists."""
        meta = self._meta(steps, outcome)
        lps = self._logprobs(held) if held else None
        finish = openai_finish(outcome.finish)
        if self.tools is not None and self.chat:
            content, calls = self.parsed(outcome.text)
            if calls is not None:
                delta: dict[str, Any] = {"tool_calls": [
                    {"index": i, **c} for i, c in enumerate(calls)
                ]}  # fmt: skip
                if content and content[released:]:
                    delta["content"] = content[released:]
                choice = ChunkChoice(index=index, delta=delta, logprobs=lps, finish_reason=None)
                calls_chunk = ChatCompletionChunk(**self._head(), choices=[choice]).wire()
                return [calls_chunk, self._chunk(None, _calls_finish(finish), None, index, **meta)]
            rest = outcome.text[released:]
        if not rest:
            return [self._chunk(None, finish, lps, index, **meta)]
        return [self._chunk(rest, None, lps, index), self._chunk(None, finish, None, index, **meta)]

    def usage_chunk(self, steps: Sequence[Step], outcome: Outcome) -> dict[str, Any]:
        """stream_options.include_usage: the last chunk, with no choices."""
        return self.usage_chunk_n([steps], [outcome])

    def usage_chunk_n(
        self, steps: Sequence[Sequence[Step]], outcomes: Sequence[Outcome]
    ) -> dict[str, Any]:
        """The usage chunk of a request with one or more choices."""
        head = self._head()
        cls = ChatCompletionChunk if self.chat else Completion
        return cls(**head, choices=[], usage=self._usage_n(steps, outcomes)).wire()
