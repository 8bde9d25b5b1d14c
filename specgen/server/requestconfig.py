"""From a validated request to its `GenerateConfig`: the server's defaults for what it
omits, its grammar, its chat messages as templates take them; and `RequestError`, what a
request that cannot be served as sent becomes (an OpenAI error body, at the HTTP edge).
Pure (no HTTP).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from specgen import ConfigError, GenerateConfig, GrammarError
from specgen.flags import SamplingFlags, in_python_words
from specgen.grammarspec import GrammarSpec
from specgen.sampling import SamplingParams
from specgen.server.schemas import ChatMessage, ErrorInfo, _Generation
from specgen.server.structured import vllm_specs

_V = TypeVar("_V")


class RequestError(Exception):
    """A request that cannot be served as sent: becomes an HTTP 4xx/5xx OpenAI error."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers or {}

    def info(self) -> ErrorInfo:
        return ErrorInfo(message=self.message, type=self.type, param=self.param, code=self.code)

    def within(self, where: str) -> RequestError:
        """The same error, its message saying `where` (which of several prompts)."""
        return RequestError(
            self.status, f"{where}: {self.message}", type_=self.type, param=self.param,
            code=self.code, headers=self.headers,
        )  # fmt: skip


@dataclass(frozen=True)
class Defaults:
    """The server's settings for fields a request omits: its start flags, as `run`'s.

    Attributes:
        sampling: serve's sampling flags (--temp, --top-k, --top-p, --min-p, --seed,
            --verify, -l and the penalties), which a request's own fields replace one by
            one (`generate_config`). Its --verify is every request's acceptance rule:
            "block", "token", or None for auto (each request's own: token when it samples
            greedily, block otherwise; `specgen.flags.verify_rule`).
        max_tokens: -n; -1 (llama-server's default) lets a request run to its slot's
            context when it sets no max_tokens.
    """

    sampling: SamplingFlags = field(default_factory=SamplingFlags)
    max_tokens: int = -1

    @classmethod
    def of(cls, sampling: SamplingFlags, max_tokens: int) -> Defaults:
        """The server's defaults from its start flags (`max_tokens`: serve's own -n)."""
        return cls(sampling, max_tokens)

    @property
    def params(self) -> SamplingParams:
        """The warpers and constraints of a request that sets none of its own."""
        return self.sampling.params()

    @property
    def seed(self) -> int | None:
        """--seed for every request without one; None draws a fresh seed each time."""
        return self.sampling.seed if self.sampling.seed_given else None


def messages_of(chat: Sequence[ChatMessage]) -> list[dict[str, str]]:
    """The messages as chat templates take them: text content only (parts joined),
    ``developer`` as ``system`` (OpenAI's newer name for it).

    Raises:
        RequestError: 400 for a content part that is not text (images, audio).
    """
    out = []
    for i, m in enumerate(chat):
        if m.content is None or isinstance(m.content, str):
            text = m.content or ""
        else:
            for j, part in enumerate(m.content):
                if part.type != "text" or part.text is None:
                    why = (
                        f"only text parts are served, got type {part.type!r}"
                        if part.type != "text"
                        else "a text part needs its 'text'"
                    )
                    raise RequestError(
                        400,
                        f"messages[{i}].content[{j}]: {why}",
                        param=f"messages[{i}].content[{j}]",
                    )
            text = "".join(p.text or "" for p in m.content)
        out.append({"role": "system" if m.role == "developer" else m.role, "content": text})
    return out


def generate_config(
    req: _Generation, defaults: Defaults, n_prompt: int, n_ctx: int, predicted: Sequence[int]
) -> GenerateConfig:
    """The request's settings, omitted fields from `defaults`, `predicted` its prediction's ids.

    A slot's context (-c) must hold the prompt and every token generated: an omitted
    max_tokens is the server's -n cut to what fits, a given one must fit.

    Raises:
        RequestError: 400 for an empty prompt, a prompt that fills the context, or a
            max_tokens beyond it (code ``context_length_exceeded``).
    """
    if n_prompt == 0:
        raise RequestError(400, "the prompt is empty", param="prompt")
    room = n_ctx - n_prompt
    if room <= 0:
        raise RequestError(
            400,
            f"the prompt is {n_prompt} token{'s' * (n_prompt != 1)} and a slot's context"
            f" holds {n_ctx}"
            " (-c): shorten it, or restart the server with a larger -c",
            param="messages" if hasattr(req, "messages") else "prompt",
            code="context_length_exceeded",
        )
    limit = req.token_limit
    if limit is None:
        limit = min(defaults.max_tokens, room) if defaults.max_tokens > 0 else room
    elif limit > room:
        name = "max_completion_tokens" if getattr(req, "max_completion_tokens", None) else None
        raise RequestError(
            400,
            f"{name or 'max_tokens'} {limit} is beyond the context: the prompt is {n_prompt}"
            f" token{'s' * (n_prompt != 1)} and a slot holds {n_ctx} (-c), so at most"
            f" {room} can be generated",
            param=name or "max_tokens",
            code="context_length_exceeded",
        )
    # llama.cpp's -1 asks for a random one, as an omitted seed does; another negative seed
    # is a fixed one, wrapped to 32 bits as llama-server's (a client's seed must reproduce)
    if req.seed is None or req.seed == -1:
        seed = defaults.seed
    else:
        seed = req.seed if req.seed >= 0 else req.seed % 2**32
    base = defaults.sampling
    try:
        sampling = replace(
            base,
            temp=_given(req.temperature, base.temp),
            top_k=_given(req.top_k, base.top_k),
            top_p=_given(req.top_p, base.top_p),
            min_p=_given(req.min_p, base.min_p),
            seed=seed,
            max_tokens=max(limit, 1),  # 0 (echo's prompt alone) is set below: no -n 0 flag
            stop=req.stop_strings,
            ignore_eos=bool(req.ignore_eos),
            min_tokens=req.min_tokens or 0,
            # a given logit_bias replaces the server's whole map
            logit_bias=_given(req.logit_bias, base.logit_bias),
            repeat_penalty=_given(req.repeat_penalty, base.repeat_penalty),
            repeat_last_n=_given(req.repeat_last_n, base.repeat_last_n),
            presence_penalty=_given(req.presence_penalty, base.presence_penalty),
            frequency_penalty=_given(req.frequency_penalty, base.frequency_penalty),
            logprobs=req.n_logprobs,
        )
        # echo with logprobs: the prompt's own too (`specgen.server.logprobs`)
        scored = req.n_logprobs if getattr(req, "echo", None) else None
        config = GenerateConfig.of(
            sampling, seed, grammar=grammar_of(req), prompt_logprobs=scored, prediction=predicted
        )
        config = replace(
            config,
            stop_token_ids=tuple(req.stop_token_ids or ()),
            include_stop=bool(req.include_stop_str_in_output),
        )
        return replace(config, max_tokens=0) if limit == 0 else config
    except ConfigError as e:  # a value the schema lets through, said in the request's words
        message = in_python_words(str(e))
        raise RequestError(400, message, param=message.split(" ", 1)[0]) from e


def _given(value: _V | None, default: _V) -> _V:
    """A request's field, or the server's default where the request omits it."""
    return default if value is None else value


def grammar_of(req: _Generation) -> GrammarSpec | None:
    """What the request constrains its output to: ``response_format`` (json_object, or
    json_schema's schema), llama-server's ``json_schema`` or ``grammar`` (GBNF; a Lark
    grammar is taken too), vLLM's ``guided_*`` or ``structured_outputs``
    (`specgen.server.structured`), or None. Not compiled here (see `Backend.check_grammar`).

    Raises:
        RequestError: 400 when more than one is given, or a schema that is no JSON object.
    """
    specs: list[GrammarSpec] = []
    try:
        fmt = getattr(req, "response_format", None)
        if fmt is not None and fmt.type != "text":
            js = fmt.json_schema
            if fmt.type == "json_schema" and js is None:
                raise RequestError(
                    400,
                    "response_format.json_schema is required with type json_schema",
                    param="response_format.json_schema",
                )
            if js is not None and js.schema_ is not None:
                source = "response_format.json_schema.schema"
                specs.append(GrammarSpec.json_schema(js.schema_, source))
            elif fmt.schema_ is not None:
                specs.append(GrammarSpec.json_schema(fmt.schema_, "response_format.schema"))
            else:  # JSON mode, or a json_schema without a schema: any JSON object
                specs.append(GrammarSpec("json_object", "", "response_format"))
        if req.json_schema is not None:
            specs.append(GrammarSpec.json_schema(req.json_schema, "json_schema"))
        if req.grammar:
            specs.append(GrammarSpec("gbnf", req.grammar, "grammar"))
        specs += vllm_specs(req)
    except GrammarError as e:
        raise RequestError(
            400, str(e), param=str(e).split(":")[0], code="invalid_grammar"
        ) from None
    if len(specs) > 1:
        raise RequestError(
            400,
            f"{specs[0].source} and {specs[1].source} both constrain the output: give one",
            param=specs[1].source,
        )
    return specs[0] if specs else None


def check_choices(n: int, n_prompts: int, slots: int, queue_max: int) -> None:
    """Refuse a request whose choices (n per prompt) can never be served together: n above
    the slots (a prompt's choices share its cells, each in a slot), or more choices than
    the slots and the queue (--parallel, --queue) hold.

    Raises:
        RequestError: 400 naming ``n`` or ``prompt``.
    """
    if n > slots:
        raise RequestError(
            400,
            f"n {n} is more choices than the server's {slots} slots (--parallel): each"
            f" choice takes a slot; ask for at most {slots}, or restart the server with a"
            " larger --parallel",
            param="n",
        )
    room = slots + queue_max
    if n_prompts * n > room:
        raise RequestError(
            400,
            f"{n_prompts} prompts with n {n} are {n_prompts * n} choices, more than the"
            f" server's {slots} slots and {queue_max} queued requests (--parallel, --queue)"
            f" hold: send at most {room // n} prompts per request",
            param="prompt",
        )
