"""The HTTP routes (FastAPI), streaming through sse-starlette, over a `Backend` whose
scheduler owns the models in its worker thread.

The async side never touches llama.cpp's decode: it tokenizes (the vocabulary is read
only, in the thread pool), submits a `Job`, and turns the events the worker thread hands
it (a step's events for all requests in one ``loop.call_soon_threadsafe``: `deliver`)
into OpenAI bodies (`specgen.server.responses`). A client that goes away mid-request has
its job cancelled, which frees the slot within one step.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/responses``
(OpenAI's Responses API, served as a chat request: `specgen.server.resprequest`),
``GET /v1/models``,
``GET /health`` (503 while loading or shutting down; the one route without the API key)
and ``GET /metrics``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from specgen import (
    ChatTemplateError,
    ConfigError,
    GrammarError,
    Job,
)
from specgen.constraints import check_vocab
from specgen.grammarspec import GrammarSpec
from specgen.server import callgrammar, tools
from specgen.server.guard import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_SEND_TIMEOUT_S,
    ApiKey,
    BodyLimit,
    LoopbackHosts,
    Origins,
)
from specgen.server.invalid import validation_error
from specgen.server.logprobs import Echo
from specgen.server.metrics import CONTENT_TYPE, Metrics
from specgen.server.requestconfig import (
    Defaults,
    RequestError,
    check_choices,
    generate_config,
    messages_of,
)
from specgen.server.respbody import respond
from specgen.server.responses import Run, Streamed, submit
from specgen.server.resprequest import ResponsesRequest
from specgen.server.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    _Generation,
)
from specgen.server.shapes import Shape
from specgen.server.vocabulary import Vocabulary, check_ids
from specgen.server.vocabulary import add_routes as add_vocabulary_routes

OPEN_PATHS = frozenset({"/health"})


class SchedulerLike(Protocol):
    """The part of `specgen.sched.scheduler.Scheduler` the routes use."""

    n_parallel: int
    n_ctx_slot: int
    queue_max: int

    def submit(self, job: Job, sink: Callable[[Any], None]) -> Any: ...
    def cancel(self, ticket: Any) -> None: ...
    def shutdown(self, timeout_s: float | None = None) -> bool: ...
    @property
    def queue_depth(self) -> int: ...
    @property
    def slots_busy(self) -> int: ...


@dataclass
class Backend:
    """What the routes serve once the models are loaded.

    Attributes:
        scheduler: started; owns the models.
        tokenize: (a raw prompt's text, add BOS) -> token ids (special tokens parsed; one
            BOS where the model adds one, none when the flag is false).
        render_chat: (messages, tools or None, more template variables or None, add BOS)
            -> token ids through the target's chat template (BOS as `tokenize`), or None
            when the target has none (the chat route then refuses with 400).
        n_vocab: the vocabulary size (token-id prompts are checked against it).
        model_id: the id in /v1/models and every response (--alias, else the file name).
        card: the model's entry in /v1/models under ``meta`` (files, SHA-256s, draft, build).
        close: frees the models (after the scheduler has shut down).
        tool_template: what the chat template does with tools (whether it renders
            ``tools`` itself, else `specgen.server.tools` writes them into a system
            message; its call syntax, which decides whether ``tool_choice: "auto"`` is
            served).
        vocabulary: the target's tokenizer (the tokenizer routes, and what ``echo``
            shows of a prompt sent as token ids); None: those routes answer 404 and
            ``echo`` is refused.
        check_grammar: compiles a request's grammar for the target's vocabulary (cached per
            grammar text, so the step loop finds it compiled), raising GrammarError naming
            the problem; called in a worker thread before the job is queued. None: no
            grammar is served.
        end_tokens: scans the target's end-of-generation tokens (`specgen.constraints.eog_ids`,
            kept per model), so that a request holding them back (``min_tokens``) does not
            make the step loop scan a whole vocabulary; called in a worker thread before
            the job is queued. None: nothing to prepare.
        max_token_bytes: the most bytes of text one token stands for (its piece, or its
            special-token text): a prompt's text over a slot's context times this cannot
            fit, and is refused before it is tokenized (60 prompts of 1 MiB, each
            tokenized whole only to be refused, held a 4-token request up 7 s). None: no
            such check.
    """

    scheduler: SchedulerLike
    tokenize: Callable[[str, bool], list[int]]
    render_chat: (
        Callable[
            [list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any] | None, bool],
            list[int],
        ]
        | None
    )
    n_vocab: int
    model_id: str
    card: dict[str, Any] = field(default_factory=dict)
    close: Callable[[], None] = lambda: None
    check_grammar: Callable[[GrammarSpec], object] | None = None
    end_tokens: Callable[[], object] | None = None
    vocabulary: Vocabulary | None = None
    tool_template: tools.TemplateTools = field(default_factory=tools.TemplateTools)
    max_token_bytes: int | None = None

    def check_fits(self, text_bytes: int, param: str) -> None:
        """Raises RequestError 400 ``context_length_exceeded`` when `text_bytes` of prompt
        text cannot fit a slot's context whatever its tokens (`max_token_bytes`)."""
        n_ctx = self.scheduler.n_ctx_slot
        if self.max_token_bytes is not None and text_bytes > n_ctx * self.max_token_bytes:
            raise RequestError(
                400,
                f"the prompt's {text_bytes} bytes are more than the {n_ctx} tokens of a slot's"
                f" context can hold (at most {self.max_token_bytes} bytes a token)",
                param=param,
                code="context_length_exceeded",
            )


@dataclass(frozen=True)
class Settings:
    """Server settings fixed at start (the flags)."""

    defaults: Defaults = field(default_factory=Defaults)
    api_key: str | None = None
    cors: tuple[str, ...] = ()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    send_timeout_s: float = DEFAULT_SEND_TIMEOUT_S
    # bound to the loopback interface: requests must name a loopback host (`LoopbackHosts`)
    loopback_only: bool = False


@dataclass
class State:
    """What changes while the server runs: the backend once loaded, draining once a
    signal came. `log` receives one line per request (the runner prints it)."""

    metrics: Metrics = field(default_factory=Metrics)
    backend: Backend | None = None
    draining: bool = False
    created: int = field(default_factory=lambda: int(time.time()))
    log: Callable[[str], None] = lambda line: None
    in_flight: int = 0


def _error_response(e: RequestError) -> JSONResponse:
    body = {"error": e.info().model_dump()}
    return JSONResponse(body, status_code=e.status, headers=e.headers)


def _parse(model: type[BaseModel], body: bytes, context: dict[str, Any] | None = None) -> Any:
    try:
        return model.model_validate_json(body, context=context)
    except ValidationError as e:
        message, param = validation_error(e)
        raise RequestError(400, message, param=param) from None


_LOGGED_MAX = 300
"""Characters of a request's path or error message in a log line."""


def loggable(text: str) -> str:
    """`text` for one log line: control characters escaped (a path's ``%0A`` decodes to a
    newline, which wrote a forged line into the log, and ``%1b`` a terminal escape, for
    any client, no key needed), cut to `_LOGGED_MAX` characters (an error may quote what
    the request sent)."""
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return shown if len(shown) <= _LOGGED_MAX else shown[: _LOGGED_MAX - 1] + "…"


def create_app(state: State, settings: Settings) -> ASGIApp:
    """The ASGI application: routes, then (outermost first) the refusal of a Host that
    is not loopback on a loopback server, the refusal of other web pages' origins, CORS
    when asked, the API key when set, and the body size limit."""
    # no redirect for a trailing slash: Starlette's 307 names the Host header the client sent
    api = FastAPI(docs_url=None, redoc_url=None, openapi_url=None, redirect_slashes=False)

    @api.exception_handler(RequestError)
    async def _refused(request: Request, e: RequestError) -> JSONResponse:
        state.metrics.observe_refusal(e.status)
        state.log(
            f"{request.method} {loggable(request.url.path)}: {e.status} {loggable(e.message)}"
        )
        return _error_response(e)

    @api.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        message = f"{request.method} {request.url.path}: {e.detail}"
        if request.url.path.startswith(("/v1/responses/", "/responses/")):  # retrieve, delete
            message += " (this server stores no response: `store` changes nothing)"
        return _error_response(RequestError(e.status_code, message, type_=kind))

    @api.exception_handler(Exception)
    async def _unexpected(request: Request, e: Exception) -> JSONResponse:
        # a bug: the client gets OpenAI's shape (Starlette's own 500 is plain text) and the
        # log one line; Starlette raises it on after this answer, which `_quiet` ends
        what = f"{type(e).__name__}: {e}"
        state.metrics.observe_refusal(500)
        state.log(f"{request.method} {loggable(request.url.path)}: 500 unexpected {loggable(what)}")
        message = f"internal error ({type(e).__name__}): a bug, please report it"
        return _error_response(RequestError(500, message, type_="server_error", code="internal"))

    async def _quiet(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await api(scope, receive, send)
        except Exception:
            if os.environ.get("SPECGEN_DEBUG", "") not in ("", "0"):
                raise  # the traceback, in the log
            # answered (`_unexpected`) and logged in one line: the traceback would add the
            # server's paths to the log and nothing for the client

    def ready() -> Backend:
        if state.draining:
            raise RequestError(
                503, "the server is shutting down", type_="unavailable_error", code="shutdown"
            )
        if state.backend is None:
            raise RequestError(503, "Loading model", type_="unavailable_error", code="loading")
        return state.backend

    # HEAD too: health checkers and load balancers probe with it
    @api.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> Response:
        if state.draining or state.backend is None:
            message = "the server is shutting down" if state.draining else "Loading model"
            body = {"error": {"code": 503, "message": message, "type": "unavailable_error"}}
            return JSONResponse(body, status_code=503)
        return JSONResponse({"status": "ok"})

    @api.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    def model_entry(b: Backend) -> dict[str, Any]:
        return {
            "id": b.model_id,
            "object": "model",
            "created": state.created,
            "owned_by": "specgen",
            "meta": b.card,
        }

    @api.get("/v1/models")
    @api.get("/models")  # llama-server serves both: a base URL given without /v1
    async def models() -> Response:
        return JSONResponse({"object": "list", "data": [model_entry(ready())]})

    @api.get("/v1/models/{model_id:path}")
    @api.get("/models/{model_id:path}")
    async def model(model_id: str) -> Response:  # OpenAI's models.retrieve
        b = ready()
        if model_id != b.model_id:
            raise RequestError(
                404, f"this server serves {b.model_id!r}, not {model_id!r}",
                type_="not_found_error", param="model", code="model_not_found",
            )  # fmt: skip
        return JSONResponse(model_entry(b))

    def vocabulary() -> Vocabulary:
        b = ready()
        if b.vocabulary is None:
            raise RequestError(404, "this server serves no tokenizer", type_="not_found_error")
        return b.vocabulary

    add_vocabulary_routes(api, vocabulary, lambda: ready().scheduler.n_ctx_slot, _parse)

    @api.post("/v1/chat/completions")
    @api.post("/chat/completions")
    async def chat(request: Request) -> Response:
        b = ready()
        # what refusal needs of the template: whether it writes reasoning (`refusal`)
        thinks = b.tool_template.thinks
        req = _parse(ChatCompletionRequest, await request.body(), {"thinks": thinks})
        return await _answer(req, await _chat(request, b, req), request)

    @api.post("/v1/responses")
    @api.post("/responses")
    async def responses(request: Request) -> Response:
        b = ready()
        asked = ResponsesRequest.of(await request.body())
        with asked.names_in_errors():  # the chat request's field names as the Responses API's
            body = json.dumps(asked.chat).encode()  # read as the chat route reads JSON
            req = _parse(ChatCompletionRequest, body, {"thinks": b.tool_template.thinks})
            run = await _chat(request, b, req, "responses")
        return await respond(run, asked, request, settings.send_timeout_s)

    async def _chat(
        request: Request, b: Backend, req: ChatCompletionRequest, route: str = "chat"
    ) -> Run:
        """A chat request's run: its messages through the chat template, its tools;
        `route`: its name in the log and the metrics."""
        if b.render_chat is None:
            raise RequestError(
                400,
                f"the model {b.model_id} has no chat template (a base model): send a raw"
                " prompt to /v1/completions instead",
                param="messages",
                code="no_chat_template",
            )
        tt = b.tool_template
        try:
            choice = tools.choice_of(req.tools, req.tool_choice, tt, req.parallel_tool_calls)
        except ValueError as e:
            raise RequestError(400, str(e), param="tool_choice") from None
        listed = req.tools if choice is not None else None  # "none" too: rendered
        plain = messages_of(req.messages)
        b.check_fits(
            sum(len(m["content"].encode("utf-8", "surrogatepass")) for m in plain), "messages"
        )
        msgs = tools.render_messages(
            plain, req.messages, listed, tt,
            instruct=choice is not None and choice.calls,
        )  # fmt: skip
        given = tools.tool_dicts(listed) if listed and tt.native else None
        try:
            prompt = await run_in_threadpool(
                b.render_chat, msgs, given, req.chat_template_kwargs, req.adds_bos
            )
        except ChatTemplateError as e:
            raise RequestError(400, str(e), param="messages", code="template_error") from None
        calls = choice if choice is not None and choice.calls else None
        predicted: list[int] = []
        if req.prediction is not None and req.prediction.text:
            text = req.prediction.text
            if b.max_token_bytes is not None:  # more than a slot's output could follow
                text = text[: b.scheduler.n_ctx_slot * b.max_token_bytes]
            predicted = await run_in_threadpool(b.tokenize, text, False)
        return await _start(b, req, [prompt], route, calls=calls, predicted=predicted)

    @api.post("/v1/completions")
    @api.post("/completions")
    async def completions(request: Request) -> Response:
        b = ready()
        req = _parse(CompletionRequest, await request.body())
        prompts: list[list[int]] = []
        echoes: list[Echo] = []
        for p in req.prompts:
            text = None
            if isinstance(p, list):
                prompt = check_ids(p, b.n_vocab, "prompt")
            else:
                text = p
                b.check_fits(len(text.encode("utf-8", "surrogatepass")), "prompt")
                prompt = await run_in_threadpool(b.tokenize, text, req.adds_bos)
            prompts.append(prompt)
            if req.echo and prompt:  # (an empty prompt is refused below)
                if b.vocabulary is None:
                    raise RequestError(400, "this server does not echo prompts", param="echo")
                piece = b.vocabulary.token_bytes
                echoes.append(await run_in_threadpool(Echo.of, text, prompt, piece))
        run = await _start(b, req, prompts, "completions", echoes=echoes)
        return await _answer(req, run, request)

    async def _answer(req: _Generation, run: Run, request: Request) -> Response:
        if req.streaming:
            return Streamed(run, req.include_usage, settings.send_timeout_s)
        return await run.whole(request)

    async def _start(
        b: Backend,
        req: _Generation,
        prompts: list[list[int]],
        route: str,
        calls: tools.Choice | None = None,
        echoes: Sequence[Echo] = (),
        predicted: Sequence[int] = (),
    ) -> Run:
        """Submit the request's jobs, n per prompt (choice ``p * n + i``: prompt p's i-th):
        their run, to answer when they end (or to stream)."""
        if req.stream_options is not None and not req.stream:  # as OpenAI and vLLM answer
            raise RequestError(400, "stream_options needs stream: true", param="stream_options")
        configs = []
        for p, prompt in enumerate(prompts):
            try:
                configs.append(
                    generate_config(
                        req, settings.defaults, len(prompt), b.scheduler.n_ctx_slot, predicted
                    )
                )
            except RequestError as e:  # which of several prompts
                raise e.within(f"prompt {p}") if len(prompts) > 1 else e from None
        config = configs[0]
        call, fmt = None, config.grammar  # the request's own format, if any
        if calls is not None:  # tool_choice: the answer is, or may hold, tool calls
            assert isinstance(req, ChatCompletionRequest) and req.tools
            try:
                call = callgrammar.with_format(req.tools, calls, fmt)
            except ValueError as e:
                raise RequestError(400, str(e), param=fmt.source if fmt else None) from None
        if call is not None:
            if config.min_tokens:
                raise RequestError(
                    400, "min_tokens cannot be used with tool_choice: the tool call's grammar"
                    " decides where the output ends", param="min_tokens",
                )  # fmt: skip
            config = configs[0] = dataclasses.replace(config, grammar=call)  # (one prompt)
        check_ids(list(config.stop_token_ids), b.n_vocab, "stop_token_ids")
        if config.min_tokens and b.end_tokens is not None:
            await run_in_threadpool(b.end_tokens)  # 0.7 s once for Gemma's vocabulary
        try:
            check_vocab(config.params.constraints, b.n_vocab)
        except ConfigError as e:
            message = str(e).replace("--logit-bias", "logit_bias")
            raise RequestError(400, message, param="logit_bias") from None
        if config.grammar is not None:
            # compiled here, off the step loop, before any slot is taken (cached per text)
            if b.check_grammar is None:
                raise RequestError(400, "this server serves no grammars", param="grammar")
            try:
                await run_in_threadpool(b.check_grammar, config.grammar)
            except GrammarError as e:
                source, message = config.grammar.source, str(e)
                if call is not None:  # which tool, in its own words, not the calls' grammar's
                    assert isinstance(req, ChatCompletionRequest) and req.tools and calls
                    check = b.check_grammar
                    found = await run_in_threadpool(
                        callgrammar.culprit, req.tools, calls, check, fmt
                    )
                    source, message = found or (source, message)
                raise RequestError(400, message, param=source, code="invalid_grammar") from None
        n = req.n or 1
        check_choices(n, len(prompts), b.scheduler.n_parallel, b.scheduler.queue_max)
        chat = route != "completions"  # /v1/responses is a chat request
        job_id = f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(12)}"
        jobs, tickets, events = submit(b.scheduler, job_id, prompts, configs, n)
        shape = Shape(
            chat, job_id, b.model_id, int(time.time()), [len(p) for p in prompts],
            bool(req.return_tokens), req.n_logprobs is not None, tools=calls,
            echoes=tuple(echoes), n=n, predicted=bool(predicted),
        )  # fmt: skip
        return Run(state, b, jobs, tickets, events, shape, route)

    def refused(scope: Scope, status: int, why: str) -> None:
        state.metrics.observe_refusal(status)
        state.log(f"{scope.get('method', '')} {loggable(scope.get('path', ''))}: {status} {why}")

    app: ASGIApp = BodyLimit(_quiet, settings.max_body_bytes, refused, settings.body_timeout_s)
    if settings.api_key:
        app = ApiKey(app, settings.api_key, OPEN_PATHS, refused)
    if settings.cors:
        app = CORSMiddleware(
            app,
            allow_origins=list(settings.cors),
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type"],
        )
    # outside CORS: another origin's preflight too gets the 403 in OpenAI's shape (CORS's
    # own answer to it is a 400 in plain text); an allowed origin's is CORS's to answer
    app = Origins(app, settings.cors, refused)
    if settings.loopback_only:
        app = LoopbackHosts(app, refused)
    return app
