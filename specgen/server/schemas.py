"""The OpenAI wire format as pydantic models: requests (validated here, never by hand) and
responses, and the error body every refusal uses.

Requests refuse, with a 400 naming it, a field that would change what is generated and is
not served (``tools``, ``audio``...: the table of `specgen.server.fields`, read before the
fields are validated); they ignore fields that change nothing (``user``, ``metadata``...)
and fields they do not know, and refuse known fields of the wrong type: the models are
strict (``"10"`` is no integer, ``1`` is no boolean; an integer is a number), and a number
must be finite. Omitted or null sampling fields take the server's defaults (`Defaults`).
"""

from __future__ import annotations

import collections
from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from specgen.logprobs import MAX_TOP
from specgen.server.fields import Route, refusal
from specgen.server.inert import normalized
from specgen.server.invalid import NoNearMisses
from specgen.server.stats import Speculative, Timings

MAX_STOP = 16
"""Stop strings allowed per request (OpenAI allows 4, llama-server has no limit)."""


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class _Nested(NoNearMisses, _Request):
    """An object inside a request body: a misspelt key is refused (`NoNearMisses`)."""


class ContentPart(_Nested):
    """One part of a message's content; only ``{"type": "text", "text": ...}`` is served."""

    type: str
    text: str | None = None


class Prediction(_Nested):
    """OpenAI's Predicted Outputs: text the answer is expected to contain (an edited
    file's unchanged parts), which prompt lookup drafts from (`GenerateConfig.prediction`)."""

    type: Literal["content"]
    content: str | list[ContentPart]

    @field_validator("content")
    @classmethod
    def _text_only(cls, given: str | list[ContentPart]) -> str | list[ContentPart]:
        if isinstance(given, list) and any(p.type != "text" or p.text is None for p in given):
            raise ValueError("a prediction's content parts must be text parts")
        return given

    @property
    def text(self) -> str:
        c = self.content
        return c if isinstance(c, str) else "".join(p.text or "" for p in c)


class FunctionCall(_Nested):
    """A call an assistant message made: the function's name and its arguments (JSON text)."""

    name: str
    arguments: str


class ToolCall(_Nested):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Nested):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool message: the call it answers
    name: str | None = None


class FunctionDef(_Nested):
    """A tool's function: its name and the JSON Schema of its arguments."""

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Nested):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Nested):
    name: str


class ToolChoiceNamed(_Nested):
    """``{"type": "function", "function": {"name": ...}}``: call that function."""

    type: Literal["function"]
    function: NamedFunction


class StreamOptions(_Nested):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage in every chunk (refused)

    @field_validator("continuous_usage_stats")
    @classmethod
    def _one_usage(cls, every: bool) -> bool:
        if every:
            raise refused(
                "stream_options",
                "stream_options.continuous_usage_stats is not supported by this server: the"
                " usage comes once, in the last chunk (include_usage)",
            )
        return every


class JsonSchemaFormat(_Nested):
    """OpenAI's ``response_format.json_schema``: the schema the answer must follow
    (``strict`` is accepted: the output always follows the schema)."""

    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Nested):
    """OpenAI's ``response_format`` (``text``, ``json_object``, ``json_schema``); llama-server
    also takes ``{"type": "json_object", "schema": {...}}``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")


class StructuredOutputs(BaseModel):
    """vLLM's ``structured_outputs`` (`specgen.server.structured`): one of ``json``,
    ``regex``, ``choice``, ``grammar``, ``json_object``; its other options (whitespace
    patterns, structural tags, backend switches) are refused, not ignored."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


def refused(param: str, message: str) -> PydanticCustomError:
    """A field refused with `message`: `validation_error` answers it as the 400 naming
    `param` (not pydantic's wording)."""
    return PydanticCustomError("refused_field", message, {"param": param})


class _Generation(_Request):
    """The fields both routes share (OpenAI's, and llama-server's ``ignore_eos``)."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, gt=0)
    temperature: float | None = None
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: int | None = None
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    ignore_eos: bool | None = None
    return_tokens: bool | None = None  # llama-server's: the generated token ids too
    stop_token_ids: list[int] | None = None  # vLLM's: end at any of these, kept in the text
    include_stop_str_in_output: bool | None = None  # vLLM's: the stop string kept too
    min_tokens: int | None = Field(default=None, ge=0)  # vLLM's: no end before this many
    # vLLM's; false: no BOS beyond the prompt's (or the chat template's) own text
    add_special_tokens: bool | None = None
    # logits processing before the warpers, on p and q alike (specgen.constraints)
    logit_bias: dict[str, float] | None = None  # OpenAI's: token id (a string) -> bias
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repeat_penalty: float | None = Field(default=None, gt=0.0)  # llama-server's
    repeat_last_n: int | None = Field(default=None, ge=-1)  # llama-server's; -1 = context
    # structured output (specgen.grammar): OpenAI's response_format (on /v1/completions
    # too, as vLLM serves it), llama-server's GBNF grammar and JSON schema
    response_format: ResponseFormat | None = None
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    # vLLM's (`specgen.server.structured`)
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: StructuredOutputs | None = None

    route: ClassVar[Route]

    @model_validator(mode="before")
    @classmethod
    def _refused(cls, body: Any, info: ValidationInfo) -> Any:
        body = normalized(body)  # llama-server's max_tokens -1 and logit_bias list
        found = refusal(body, cls.route, thinks=bool((info.context or {}).get("thinks")))
        if found is not None:
            name, message = found
            raise refused(name, message)
        return body

    @field_validator("n")
    @classmethod
    def _choices(cls, n: int | None) -> int | None:
        # the bound above is the server's slots (--parallel), checked by the route
        if n is not None and n < 1:
            raise ValueError(f"must be at least 1, got {n}")
        return n

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        for token, value in (bias or {}).items():
            if not token.isdigit():
                raise ValueError(f"keys are token ids (decimal strings), got {token!r}")
            if not -100.0 <= value <= 100.0:
                raise ValueError(f"a bias must be in [-100, 100], got {value} for token {token}")
        return bias

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, stop: str | list[str] | None) -> str | list[str] | None:
        items = [stop] if isinstance(stop, str) else stop or []
        if any(s == "" for s in items):
            raise ValueError("a stop string must not be empty")
        if len(items) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings, got {len(items)}")
        return stop

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def streaming(self) -> bool:
        return bool(self.stream)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def token_limit(self) -> int | None:
        return self.max_tokens

    @property
    def adds_bos(self) -> bool:
        """Whether the prompt gets a BOS where the model adds one (unless its text starts
        with one): vLLM's ``add_special_tokens``, true unless said false. On the chat
        route vLLM's default is false, and the two agree wherever the chat template writes
        the BOS itself (Gemma's, Llama's, Mistral's)."""
        return self.add_special_tokens is not False

    @property
    def n_logprobs(self) -> int | None:
        """Alternatives per token when log-probabilities are asked (0..20), else None."""
        return None


TEMPLATE_VARIABLES = frozenset(
    {"messages", "tools", "tool_choice", "functions", "function_call", "bos_token",
     "eos_token", "add_generation_prompt", "raise_exception", "strftime_now"}
)  # fmt: skip
"""What the server itself gives the chat template (`specgen.llamacpp.compile_chat_template`)."""


class ChatCompletionRequest(_Generation):
    route: ClassVar[Route] = "chat"
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceNamed | None = None
    parallel_tool_calls: bool | None = None
    max_completion_tokens: int | None = Field(default=None, gt=0)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP)
    # llama-server's: more variables for the chat template (Qwen 3's enable_thinking)
    chat_template_kwargs: dict[str, Any] | None = None
    prediction: Prediction | None = None

    @field_validator("tools")
    @classmethod
    def _each_name_once(cls, given: list[Tool] | None) -> list[Tool] | None:
        # counted once each: names.count per name was quadratic, and it runs on the event
        # loop (21,000 tools froze every client for 4 s)
        counts = collections.Counter(tool.function.name for tool in given or ())
        twice = sorted(name for name, n in counts.items() if n > 1)
        if twice:  # a call names its tool: with two of a name it would not say which
            raise ValueError(f"each tool's name once: {', '.join(twice)} given twice")
        return given

    @field_validator("chat_template_kwargs")
    @classmethod
    def _own_variables(cls, given: dict[str, Any] | None) -> dict[str, Any] | None:
        taken = sorted(set(given or {}) & TEMPLATE_VARIABLES)
        if taken:
            raise ValueError(f"{', '.join(taken)}: set by the server, not by chat_template_kwargs")
        return given

    @model_validator(mode="after")
    def _top_needs_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            # OpenAI refuses it too: alternatives without the chosen token's value
            raise refused("top_logprobs", "top_logprobs needs logprobs: true")
        return self

    @property
    def n_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def token_limit(self) -> int | None:
        # OpenAI deprecated max_tokens for max_completion_tokens: the newer one wins
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Generation):
    route: ClassVar[Route] = "completions"
    prompt: str | list[int] | list[str] | list[list[int]]
    # OpenAI's legacy field: a count of alternatives (OpenAI allows 5; llama.cpp's 20)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP)
    echo: bool | None = None
    # 0 with echo: the prompt alone, scored (`specgen.server.logprobs`)
    max_tokens: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _nothing_asked(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo:
            why = "generates nothing: it is served with echo (the prompt scored alone)"
            raise refused("max_tokens", f"max_tokens 0 {why}")
        return self

    @property
    def n_logprobs(self) -> int | None:
        return self.logprobs

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompts_given(cls, prompt: Any) -> Any:
        """Text or token ids, alone or as a list of prompts (OpenAI's array forms,
        ``[text, ...]`` and ``[[ids], ...]``: lm-evaluation-harness sends ``[[ids], ...]``),
        none empty, a list all of one kind (said plainly: pydantic's own error for a
        mixed list names one member of the union)."""
        listed = prompt if isinstance(prompt, list) else [prompt]
        if not listed or any(p in ("", []) for p in listed):
            raise ValueError("the prompt is empty")
        if len({isinstance(p, list) for p in listed}) > 1:
            raise ValueError("a list of prompts holds all text or all token-id lists")
        return prompt

    @property
    def prompts(self) -> list[str | list[int]]:
        """The request's prompts in order, each text or token ids (one choice each per n)."""
        if isinstance(self.prompt, str) or isinstance(self.prompt[0], int):
            return [self.prompt]
        return list(self.prompt)


# -- responses ---------------------------------------------------------------------------


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorBody(BaseModel):
    error: ErrorInfo


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens not evaluated again (llama-server's cache_n)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None
    # a request with a prediction: `specgen.server.stats.predicted`
    completion_tokens_details: dict[str, int] | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[dict[str, Any]] | None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: dict[str, Any] | None = None  # {"content": [...]}: `shapes.chat_logprobs`
    finish_reason: str


class TextChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: dict[str, Any] | None = None  # the legacy shape: `shapes.text_logprobs`
    finish_reason: str | None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: dict[str, Any]
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None


class _Response(BaseModel):
    id: str
    created: int
    model: str
    system_fingerprint: str | None = None
    usage: Usage | None = None
    timings: Timings | None = None
    speculative: Speculative | None = None
    error: ErrorInfo | None = None
    tokens: list[int] | None = None

    def wire(self) -> dict[str, Any]:
        """The JSON object sent: fields left None are omitted, except a choice's
        ``finish_reason`` and ``logprobs``, a message's ``content`` (null beside tool
        calls) and an error's ``param``, which OpenAI always sends."""
        body = self.model_dump(exclude_none=True)
        body.get("error", {}).setdefault("param", None)
        for choice, model in zip(
            body.get("choices", []), getattr(self, "choices", []), strict=True
        ):
            choice.setdefault("finish_reason", model.finish_reason)
            choice.setdefault("logprobs", None)
            if "message" in choice:
                choice["message"].setdefault("content", None)
        return body


class ChatCompletion(_Response):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]


class ChatCompletionChunk(_Response):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChunkChoice]


class Completion(_Response):
    object: Literal["text_completion"] = "text_completion"
    choices: list[TextChoice]
