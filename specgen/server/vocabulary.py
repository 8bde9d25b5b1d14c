"""The target's tokenizer over HTTP, as the two servers clients already speak to serve it:
``POST /tokenize`` and ``POST /detokenize`` (vLLM's fields ``prompt`` and
``add_special_tokens``, llama-server's ``content`` and ``add_special``; each answers with
both servers' keys), and vLLM's ``GET /tokenizer_info``.

Clients count tokens with them (context budgets, prompt truncation), and
lm-evaluation-harness's ``local-completions`` model uses them as its tokenizer when they are
there (its ``tokenizer_backend=auto`` probes ``/tokenizer_info`` and ``/tokenize``): its
token-id prompts are then the target's own tokens, with no Hugging Face tokenizer to fetch
and none that could disagree with the GGUF's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict

from specgen.server.requestconfig import RequestError

__all__ = ["Vocabulary", "add_routes", "check_ids"]


@dataclass(frozen=True)
class Vocabulary:
    """The target's tokenizer, as the routes serve it.

    Attributes:
        tokenize: (text, add special tokens) -> token ids; special-token text (``<bos>``,
            ``<|im_end|>``) is parsed; with add True, BOS where the model adds one (never
            twice: `specgen.chat.prompt_tokens`).
        token_bytes: a token id's bytes, a special token's as its text (``<|im_start|>``),
            as vLLM's and llama-server's ``/detokenize`` render them.
        bos, eos: the BOS and EOS tokens' text, None when the model has none.
        chat_template: the chat template served (`--chat-template`'s, else the GGUF's), or
            None.
        n_vocab: the vocabulary's size (ids are checked against it).
    """

    tokenize: Callable[[str, bool], list[int]]
    token_bytes: Callable[[int], bytes]
    bos: str | None
    eos: str | None
    chat_template: str | None
    n_vocab: int

    def detokenize(self, tokens: list[int]) -> str:
        """The text the ids render to, special tokens as their text (an incomplete UTF-8
        sequence shows U+FFFD).

        Raises:
            RequestError: 400 for an id outside the vocabulary.
        """
        check_ids(tokens, self.n_vocab, "tokens")
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", "replace")


def check_ids(tokens: list[int], n_vocab: int, param: str) -> list[int]:
    """`tokens`, every one an id of the vocabulary (`n_vocab` entries).

    Raises:
        RequestError: 400 naming `param` and the first id outside it.
    """
    bad = [t for t in tokens if not 0 <= t < n_vocab]
    if bad:
        message = f"{param}: token {bad[0]} is not in the vocabulary (0..{n_vocab - 1})"
        raise RequestError(400, message, param=param)
    return tokens


class _Tokenize(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    prompt: str | None = None  # vLLM's
    content: str | None = None  # llama-server's
    add_special_tokens: bool | None = None  # vLLM's (default true)
    add_special: bool | None = None  # llama-server's (default false)


class _Detokenize(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    tokens: list[int]


def add_routes(
    api: FastAPI,
    vocabulary: Callable[[], Vocabulary],
    n_ctx_slot: Callable[[], int],
    parse: Callable[[type[BaseModel], bytes], Any],
) -> None:
    """Serve the three routes on `api`; `vocabulary` gives the loaded target's (raising
    `RequestError` 503 while loading or draining, 404 where the server has none),
    `n_ctx_slot` a slot's context (vLLM's ``max_model_len``), `parse` a body as a model
    (raising `RequestError` 400: the server's one way to read a body)."""

    async def tokenize(request: Request) -> Response:
        vocab = vocabulary()
        req = parse(_Tokenize, await request.body())
        if (req.prompt is None) == (req.content is None):
            raise RequestError(400, "send the text as prompt (or content), once", param="prompt")
        # either server's flag with either field; unsaid, the default of the field's server
        given = req.add_special_tokens if req.add_special_tokens is not None else req.add_special
        text = req.prompt if req.prompt is not None else req.content or ""
        add = given if given is not None else req.prompt is not None
        tokens = await run_in_threadpool(vocab.tokenize, text, add)
        body = {"tokens": tokens, "count": len(tokens), "max_model_len": n_ctx_slot()}
        return JSONResponse(body)

    async def detokenize(request: Request) -> Response:
        vocab = vocabulary()
        req = parse(_Detokenize, await request.body())
        text = await run_in_threadpool(vocab.detokenize, req.tokens)
        return JSONResponse({"prompt": text, "content": text})

    async def tokenizer_info() -> Response:
        vocab = vocabulary()
        return JSONResponse({
            "tokenizer_class": "llama.cpp", "bos_token": vocab.bos, "eos_token": vocab.eos,
            "pad_token": None, "chat_template": vocab.chat_template,
            "model_max_length": n_ctx_slot(),
        })  # fmt: skip

    routes: list[tuple[str, str, Callable[..., Awaitable[Response]]]] = [
        ("POST", "/tokenize", tokenize),
        ("POST", "/detokenize", detokenize),
        ("GET", "/tokenizer_info", tokenizer_info),
    ]
    for method, path, endpoint in routes:
        api.add_api_route(path, endpoint, methods=[method])
