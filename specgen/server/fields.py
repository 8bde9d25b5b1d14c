"""Every request field the server knows, with what it does about it: the one table that
request validation reads (`refusal`) and that the docs' field table is checked against.

A field is

* ``honoured``: a field of the pydantic request models (`specgen.server.schemas`), served
  as OpenAI or llama-server define it;
* ``ignored``: accepted and ignored because it changes nothing generated (``user``,
  ``metadata``, ``store``...): the output is the same with or without it;
* ``refused``: it would change what is generated and is not honoured, so a request that
  gives it a value other than one of its `inert` values (the values that ask for nothing,
  such as ``logit_bias: {}`` or ``tools: []``) gets HTTP 400 naming the field, never a 200
  with output as if it had not been sent.

Fields in no entry (a client's own extras) are accepted and ignored, except a name close
to a field that changes the output (`invalid.NEAR`: ``temprature``, ``maxtokens``,
``streaming``): a misspelt setting would otherwise be served as if never sent, so it is
refused, naming the field it is near.

To honour a refused field: add it to the request model in ``schemas.py`` and flip its
entry here to ``HONOURED``; ``tests/test_server_fields.py`` checks that the honoured
entries are exactly the models' fields and that every field of OpenAI's request types
(from the installed ``openai`` package) has an entry.

Sources: OpenAI's ``CompletionCreateParams`` of ``/v1/chat/completions`` and
``/v1/completions`` (the ``openai`` package's types), and llama-server's
``params_from_json_cmpl`` (``tools/server/server-common.cpp``, ``server-task.cpp``) and
vLLM's ``ChatCompletionRequest`` / ``CompletionRequest``
(``vllm/entrypoints/openai/protocol.py``) for their extras.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

from specgen.server.inert import DEFAULT_CHAIN, NO_REASONING, Beside, When, off, same
from specgen.server.invalid import misspelt, near

Route = Literal["chat", "completions"]
BOTH: frozenset[Route] = frozenset({"chat", "completions"})
CHAT: frozenset[Route] = frozenset({"chat"})
COMPLETIONS: frozenset[Route] = frozenset({"completions"})


class Status(str, Enum):
    HONOURED = "honoured"
    IGNORED = "ignored"
    REFUSED = "refused"


@dataclass(frozen=True)
class Field:
    """One request field.

    Attributes:
        status: honoured, ignored (changes nothing generated) or refused.
        note: what is served instead, or why it changes nothing (one phrase, shown in
            the 400's message and in the docs' table).
        origin: "openai", "llama-server" or "vllm" (whose request defines it), or "other"
            (text-generation-webui's, TabbyAPI's, KoboldCpp's, TGI's or Ollama's names,
            which SillyTavern's presets send).
        routes: the routes that define it.
        inert: values of a refused field that ask for nothing and are accepted (compared
            with ``==`` and the same type, so ``0`` is not ``False``).
        inert_when: rules under which any other value asks for nothing too, read with the
            body's other fields (`specgen.server.inert`: a sampler switched off, a field
            repeated under another name).
    """

    status: Status
    note: str
    origin: Literal["openai", "llama-server", "vllm", "other"] = "openai"
    routes: frozenset[Route] = BOTH
    inert: tuple[Any, ...] = (None,)
    inert_when: tuple[When, ...] = ()


H, IG, R = Status.HONOURED, Status.IGNORED, Status.REFUSED
_TEXT = "only text is generated"
_NO_TOOLS = "the legacy functions API: send tools and tool_choice"
_CHAIN = "the samplers served are temperature, top_k, top_p and min_p"
_CACHING = "prompt caching is automatic"
_K_CHOSEN = "K is chosen per step; the output law is the same"
_VLLM_TEXT = "special tokens are left out of the text"
_DRAFTING = "the drafting is the server's (--draft, --lookup); the output law is the same"
_LS: Literal["llama-server"] = "llama-server"
_DRY_OFF = off("dry_multiplier")
_AS_MAX_TOKENS = same("max_tokens", "max_completion_tokens")

FIELDS: dict[str, Field] = {
    # -- OpenAI, both routes ----------------------------------------------------------
    "model": Field(H, "accepted; the server serves the one model it loaded"),
    "max_tokens": Field(H, "the most tokens to generate"),
    "temperature": Field(H, "0 samples greedily"),
    "top_p": Field(H, "nucleus sampling"),
    "seed": Field(H, "the request's random stream; -1 or none: the server's --seed, if any"),
    "stop": Field(H, "up to 16 stop strings"),
    "n": Field(H, "1 up to the server's slots (--parallel); choice i is seeded seed + i"),
    "stream": Field(H, "server-sent events"),
    "stream_options": Field(
        H,
        "include_usage, with stream true (else a 400, as OpenAI's); vLLM's"
        " continuous_usage_stats is refused",
    ),
    "user": Field(IG, "an end-user id for abuse monitoring: changes nothing generated"),
    "frequency_penalty": Field(H, "-2 to 2, per occurrence in the last repeat_last_n tokens"),
    "presence_penalty": Field(H, "-2 to 2, once for a token in the last repeat_last_n"),
    "logit_bias": Field(H, "token id (a string) -> bias in [-100, 100], on p and q alike"),
    "logprobs": Field(
        H,
        "chat: true; completions: N alternatives (0-20); the target's log-softmax of its raw"
        " logits",
    ),
    "response_format": Field(
        H, "text, json_object, or json_schema (output constrained to it); on both routes"
    ),
    # -- OpenAI, chat ------------------------------------------------------------------
    "messages": Field(H, "text content; image and audio parts are refused", routes=CHAT),
    "max_completion_tokens": Field(H, "max_tokens' newer name (it wins)", routes=CHAT),
    "top_logprobs": Field(H, "0-20 alternatives per token, with logprobs: true", routes=CHAT),
    "tools": Field(
        H,
        "function tools, given to the chat template as `tools` (a system message when the"
        " template does not read them)",
        routes=CHAT,
    ),
    "tool_choice": Field(
        H,
        "none, required or a named function (the output constrained to the call); auto"
        " (the default with tools) for Hermes/Qwen <tool_call> templates only (the call"
        " constrained from its tag on), else 400",
        routes=CHAT,
    ),
    "functions": Field(R, _NO_TOOLS, routes=CHAT, inert=(None, [])),
    "function_call": Field(R, _NO_TOOLS, routes=CHAT, inert=(None, "none")),
    "parallel_tool_calls": Field(
        H,
        "false: one call at most (Hermes/Qwen templates; other templates, and a named"
        " function, make one)",
        routes=CHAT,
    ),
    "audio": Field(R, _TEXT, routes=CHAT),
    "modalities": Field(R, _TEXT, routes=CHAT, inert=(None, ["text"])),
    "prediction": Field(
        H,
        "Predicted Outputs: prompt lookup drafts from its text too (never changes the"
        " output's law); unused without prompt lookup (--lookup off, --draft none)",
        routes=CHAT,
    ),
    "reasoning_effort": Field(R, "the model's reasoning is not controlled", routes=CHAT),
    "verbosity": Field(R, "the answer's length is set by max_tokens only", routes=CHAT),
    "web_search_options": Field(R, "no web search", routes=CHAT),
    "moderation": Field(IG, "OpenAI's moderation: changes nothing generated", routes=CHAT),
    "metadata": Field(IG, "stored tags: changes nothing generated", routes=CHAT),
    "store": Field(IG, "nothing is stored: changes nothing generated", routes=CHAT),
    "service_tier": Field(IG, "one tier: changes nothing generated", routes=CHAT),
    "safety_identifier": Field(IG, "an end-user id: changes nothing generated", routes=CHAT),
    "prompt_cache_key": Field(IG, _CACHING, routes=CHAT),
    "prompt_cache_options": Field(IG, _CACHING, routes=CHAT),
    "prompt_cache_retention": Field(IG, _CACHING, routes=CHAT),
    # -- OpenAI, completions -----------------------------------------------------------
    "prompt": Field(H, "text or token ids, or a list of prompts", routes=COMPLETIONS),
    "echo": Field(
        H, "the prompt first; with logprobs, its own too", routes=COMPLETIONS, inert=(None, False)
    ),
    "suffix": Field(R, "no fill-in-the-middle", routes=COMPLETIONS, inert=(None, "")),
    "best_of": Field(R, "one candidate per choice", routes=COMPLETIONS, inert=(None, 1)),
    # -- llama-server's extras -------------------------------------------------------------
    "top_k": Field(H, "top-k sampling; 0 keeps all", "llama-server"),
    "min_p": Field(H, "min-p sampling", "llama-server"),
    "ignore_eos": Field(
        H,
        "generate past end-of-generation: an end token drawn is kept (empty text) and"
        " generation goes on, as vLLM's; llama-server bans the end tokens instead",
        "llama-server",
    ),
    "return_tokens": Field(H, "the generated token ids in the response", "llama-server"),
    "repeat_penalty": Field(H, "llama.cpp's repeat penalty (1 = off)", "llama-server"),
    "repeat_last_n": Field(H, "tokens the penalties see (0 off, -1 all)", "llama-server"),
    "grammar": Field(H, "a GBNF grammar the output must match", "llama-server"),
    "json_schema": Field(H, "a JSON Schema the output must follow", "llama-server"),
    "n_probs": Field(
        R,
        "llama-server's completion_probabilities are not served: send logprobs",
        "llama-server",
        inert=(None, 0),
    ),
    "post_sampling_probs": Field(
        R, "post-sampling probabilities are not served", "llama-server", inert=(None, False)
    ),
    "n_predict": Field(
        R, "send max_tokens", "llama-server", inert=(None, -1), inert_when=(_AS_MAX_TOKENS,)
    ),
    "parse_tool_calls": Field(
        R,
        "tool calls are parsed whenever tools are given",
        "llama-server",
        routes=CHAT,
        inert=(None, True),
    ),
    "typical_p": Field(R, _CHAIN, "llama-server", inert=(None, 1, 1.0)),
    "typ_p": Field(R, _CHAIN, "llama-server", inert=(None, 1, 1.0)),
    "min_keep": Field(R, _CHAIN, "llama-server", inert=(None, 0)),
    "top_n_sigma": Field(R, _CHAIN, "llama-server", inert=(None, -1, -1.0)),
    "dynatemp_range": Field(R, _CHAIN, "llama-server", inert=(None, 0, 0.0)),
    "dynatemp_exponent": Field(
        R, _CHAIN, _LS, inert=(None, 1, 1.0), inert_when=(off("dynatemp_range"),)
    ),
    "xtc_probability": Field(R, _CHAIN, "llama-server", inert=(None, 0, 0.0)),
    "xtc_threshold": Field(R, _CHAIN, _LS, inert=(None, 0.1), inert_when=(off("xtc_probability"),)),
    "mirostat": Field(R, _CHAIN, "llama-server", inert=(None, 0)),
    "mirostat_tau": Field(R, _CHAIN, _LS, inert=(None, 5, 5.0), inert_when=(off("mirostat"),)),
    "mirostat_eta": Field(R, _CHAIN, _LS, inert=(None, 0.1), inert_when=(off("mirostat"),)),
    "dry_multiplier": Field(R, _CHAIN, "llama-server", inert=(None, 0, 0.0)),
    "dry_base": Field(R, _CHAIN, _LS, inert=(None, 1.75), inert_when=(_DRY_OFF,)),
    "dry_allowed_length": Field(R, _CHAIN, _LS, inert=(None, 2), inert_when=(_DRY_OFF,)),
    "dry_penalty_last_n": Field(R, _CHAIN, _LS, inert=(None, -1), inert_when=(_DRY_OFF,)),
    "dry_sequence_breakers": Field(R, _CHAIN, _LS, inert_when=(_DRY_OFF,)),
    "penalize_nl": Field(
        R,
        "newlines are penalised like any token (true, as llama.cpp since it dropped the"
        " field); false, exempting them, is refused",
        "llama-server",
        inert=(None, True),
    ),
    "samplers": Field(
        R, _CHAIN + ", in that order, after the penalties", _LS, inert_when=(DEFAULT_CHAIN,)
    ),
    "lora": Field(R, "no LoRA adapters", "llama-server", inert=(None, [])),
    "chat_template_kwargs": Field(
        H, "more variables for the chat template (enable_thinking...)", "llama-server", routes=CHAT
    ),
    "n_keep": Field(R, "the context is never shifted", "llama-server", inert=(None, 0)),
    "t_max_predict_ms": Field(R, "no time limit; send max_tokens", "llama-server"),
    "cache_prompt": Field(IG, "prompt caching is automatic and exact", "llama-server"),
    "id_slot": Field(IG, "slots are assigned by the server", "llama-server"),
    "timings_per_token": Field(IG, "timings come in every response", "llama-server"),
    "speculative.n_max": Field(IG, _K_CHOSEN, "llama-server"),
    "speculative.n_min": Field(IG, _K_CHOSEN, "llama-server"),
    "speculative.p_min": Field(IG, _K_CHOSEN, "llama-server"),
    "speculative.type": Field(IG, _DRAFTING, "llama-server"),
    "speculative.ngram_size_n": Field(IG, _DRAFTING, "llama-server"),
    "speculative.ngram_size_m": Field(IG, _DRAFTING, "llama-server"),
    "speculative.ngram_m_hits": Field(IG, _DRAFTING, "llama-server"),
    "backend_sampling": Field(IG, "the sampling is exact wherever it runs", "llama-server"),
    "n_cache_reuse": Field(IG, "prompt caching is automatic and exact", "llama-server"),
    "t_max_prompt_ms": Field(IG, "no time limit (llama-server reads none either)", "llama-server"),
    "n_cmpl": Field(R, "send n", "llama-server", inert=(None, 1)),
    "n_indent": Field(R, "no indentation rule", "llama-server", inert=(None, 0)),
    "n_discard": Field(R, "the context is never shifted", "llama-server", inert=(None, 0)),
    "response_fields": Field(R, "every field is sent", "llama-server", inert=(None, [])),
    "return_progress": Field(
        IG, "no prompt-progress chunks are sent: changes nothing generated", "llama-server"
    ),
    "tfs_z": Field(R, _CHAIN, "llama-server", inert=(None, 1, 1.0)),
    "adaptive_target": Field(R, _CHAIN, "llama-server"),
    "adaptive_decay": Field(R, _CHAIN, "llama-server"),
    "grammar_lazy": Field(
        R, "a lazy grammar is not served: send grammar", "llama-server", inert=(None, False)
    ),
    "grammar_triggers": Field(
        R, "a lazy grammar is not served: send grammar", "llama-server", inert=(None, [])
    ),
    "preserved_tokens": Field(
        R, "a lazy grammar is not served: send grammar", "llama-server", inert=(None, [])
    ),
    "reasoning_format": Field(
        R,
        "the model's reasoning is not parsed out of the answer",
        "llama-server",
        inert=(None, "none"),
        inert_when=(NO_REASONING,),
    ),
    "reasoning_budget_tokens": Field(
        R, "the model's reasoning is not budgeted", "llama-server", inert=(None, -1)
    ),
    # -- vLLM's extras (`vllm/entrypoints/openai/protocol.py`), which its clients send --------
    "guided_json": Field(H, "a JSON Schema the output must follow", "vllm"),
    "guided_regex": Field(H, "a regular expression the whole output must match", "vllm"),
    "guided_choice": Field(H, "the output is exactly one of these strings", "vllm"),
    "guided_grammar": Field(H, "a grammar the output must match (GBNF or Lark)", "vllm"),
    "structured_outputs": Field(
        H, "one of json, regex, choice, grammar, json_object (guided_*'s newer form)", "vllm"
    ),
    "add_special_tokens": Field(
        H,
        "false: no BOS beyond the prompt's or chat template's own text (unsaid or true: a"
        " BOS where the model adds one, never a second)",
        "vllm",
    ),
    "guided_decoding_backend": Field(IG, "the grammars are llguidance's", "vllm"),
    "guided_whitespace_pattern": Field(R, "JSON whitespace is fixed per schema", "vllm"),
    "min_tokens": Field(
        H,
        "the output cannot end before this many tokens: end-of-generation and stop_token_ids"
        " are held back until then, and a stop string counts only from then on (as vLLM's);"
        " not with a grammar",
        "vllm",
    ),
    "stop_token_ids": Field(
        H, "the output ends at any of these token ids, the token kept (as vLLM's)", "vllm"
    ),
    "bad_words": Field(R, "send logit_bias", "vllm", inert=(None, [])),
    "allowed_token_ids": Field(R, "send logit_bias", "vllm"),
    "repetition_penalty": Field(R, "send repeat_penalty", "vllm", inert=(None, 1, 1.0)),
    "length_penalty": Field(R, "no beam search", "vllm", inert=(None, 1, 1.0)),
    "use_beam_search": Field(R, "no beam search", "vllm", inert=(None, False)),
    "include_stop_str_in_output": Field(H, "true: the stop string kept in the text", "vllm"),
    "skip_special_tokens": Field(
        R, "control tokens are left out of the text", "vllm", inert=(None, True)
    ),
    "spaces_between_special_tokens": Field(R, _VLLM_TEXT, "vllm", inert=(None, True)),
    "prompt_logprobs": Field(R, "send echo with logprobs (completions)", "vllm"),
    "truncate_prompt_tokens": Field(R, "a prompt is never truncated", "vllm"),
    "logits_processors": Field(R, "no custom logits processors", "vllm", inert=(None, [])),
    "return_tokens_as_token_ids": Field(R, "send return_tokens", "vllm", inert=(None, False)),
    "return_token_ids": Field(R, "send return_tokens", "vllm", inert=(None, False)),
    "add_generation_prompt": Field(
        R, "the assistant's turn is always opened", "vllm", routes=CHAT, inert=(None, True)
    ),
    "continue_final_message": Field(
        R, "a reply always starts a new turn", "vllm", routes=CHAT, inert=(None, False)
    ),
    "chat_template": Field(R, "set --chat-template at start", "vllm", routes=CHAT),
    "include_reasoning": Field(
        R,
        "the model's reasoning is not parsed out of the answer",
        "vllm",
        routes=CHAT,
        inert=(None, True),
    ),
    "structural_tag": Field(R, "send a grammar or a JSON Schema", "vllm", routes=CHAT),
    "prompt_embeds": Field(R, "send text or token ids", "vllm", routes=COMPLETIONS),
    "mm_processor_kwargs": Field(IG, "text only: changes nothing generated", "vllm"),
    "kv_transfer_params": Field(IG, "one server: changes nothing generated", "vllm"),
    "documents": Field(R, "no documents are rendered", "vllm", routes=CHAT, inert=(None, [])),
    "vllm_xargs": Field(R, "no custom arguments", "vllm", inert=(None, {})),
    "priority": Field(IG, "first come, first served: changes nothing generated", "vllm"),
    "request_id": Field(IG, "the server's own ids: changes nothing generated", "vllm"),
    "cache_salt": Field(IG, _CACHING, "vllm"),
    # -- other servers' names: SillyTavern's text-completion presets, Anthropic's, TGI's ---
    "max_new_tokens": Field(R, "send max_tokens", "other", inert_when=(_AS_MAX_TOKENS,)),
    "num_predict": Field(R, "send max_tokens", "other", inert_when=(_AS_MAX_TOKENS,)),
    "sampler_seed": Field(R, "send seed", "other", inert=(None, -1), inert_when=(same("seed"),)),
    "rep_pen": Field(
        R,
        "send repeat_penalty",
        "other",
        inert=(None, 1, 1.0),
        inert_when=(same("repeat_penalty"),),
    ),
    "rep_pen_range": Field(
        R, "send repeat_last_n", "other", inert_when=(same("repeat_last_n"), off("rep_pen"))
    ),
    "rep_pen_slope": Field(R, _CHAIN, "other", inert=(None, 1, 1.0)),
    "repetition_penalty_range": Field(
        R, "send repeat_last_n", "other", inert=(None, 0), inert_when=(off("repetition_penalty"),)
    ),
    "stopping_strings": Field(
        R, "send stop", "other", inert=(None, []), inert_when=(same("stop"),)
    ),
    # Anthropic's and TGI's names, and llama.cpp's own name for repeat_last_n
    "stop_sequences": Field(R, "send stop", "other", inert=(None, []), inert_when=(same("stop"),)),
    "max_tokens_to_sample": Field(R, "send max_tokens", "other", inert_when=(_AS_MAX_TOKENS,)),
    "penalty_last_n": Field(R, "send repeat_last_n", "other", inert_when=(same("repeat_last_n"),)),
    "grammar_string": Field(
        R, "send grammar", "other", inert=(None, ""), inert_when=(same("grammar"),)
    ),
    "typical": Field(R, _CHAIN, "other", inert=(None, 1, 1.0)),
    "tfs": Field(R, _CHAIN, "other", inert=(None, 1, 1.0)),
    "top_a": Field(R, _CHAIN, "other", inert=(None, 0, 0.0)),
    "mirostat_mode": Field(R, _CHAIN, "other", inert=(None, 0)),
    "smoothing_factor": Field(R, _CHAIN, "other", inert=(None, 0, 0.0)),
    "smoothing_curve": Field(
        R, _CHAIN, "other", inert=(None, 1, 1.0), inert_when=(off("smoothing_factor"),)
    ),
    "skew": Field(R, _CHAIN, "other", inert=(None, 0, 0.0)),
    "epsilon_cutoff": Field(R, _CHAIN, "other", inert=(None, 0, 0.0)),
    "eta_cutoff": Field(R, _CHAIN, "other", inert=(None, 0, 0.0)),
    "banned_strings": Field(R, "send logit_bias", "other", inert=(None, [])),
    "custom_token_bans": Field(R, "send logit_bias", "other", inert=(None, "")),
    "guidance_scale": Field(R, "no classifier-free guidance", "other", inert=(None, 1, 1.0)),
    "negative_prompt": Field(
        R,
        "no classifier-free guidance",
        "other",
        inert=(None, ""),
        inert_when=(off("guidance_scale"),),
    ),  # fmt: skip
    "add_bos_token": Field(R, "send add_special_tokens", "other", inert=(None, True)),
    "ban_eos_token": Field(R, "send ignore_eos", "other", inert=(None, False)),
    "truncation_length": Field(
        IG, "a prompt is never cut (one too long for the context is a 400)", "other"
    ),
    "max_tokens_second": Field(IG, "no rate limit: changes nothing generated", "other"),
    "num_ctx": Field(IG, "the context is the server's (-c): changes nothing generated", "other"),
    # Ollama's settings object, which its native API reads and these routes do not
    "options": Field(
        R,
        "send each setting as a field of the request (temperature, top_p...)",
        "other",
        inert=(None, {}),
    ),  # fmt: skip
}
"""Field name -> its status on this server (`Field`)."""


_CHANGING = tuple(n for n, f in FIELDS.items() if f.status is not Status.IGNORED)
"""The fields that change the output, which an unknown field's name is compared with."""


def is_inert(value: Any, inert: tuple[Any, ...]) -> bool:
    """Whether `value` is one of `inert`, of the same type (``0`` is not ``False``)."""
    return any(type(value) is type(v) and value == v for v in inert)


def _inert_field(name: str, value: Any) -> bool:
    """Whether `value` of field `name` asks for nothing by itself (None: not sent)."""
    f = FIELDS.get(name)
    return value is None or (f is not None and is_inert(value, f.inert))


def _asks_nothing(f: Field, value: Any, body: dict[str, Any], beside: Beside) -> bool:
    return is_inert(value, f.inert) or any(w.test(value, body, beside) for w in f.inert_when)


def refusal(body: Any, route: Route, thinks: bool = False) -> tuple[str, str] | None:
    """The first refused field the body gives a value that asks for something, or the
    first unknown field whose name is near one that changes the output (`invalid.NEAR`).

    Args:
        body: the request's decoded JSON (anything; only a dict is looked at).
        route: which route the body came to.
        thinks: the served chat template writes reasoning (`TemplateTools.thinks`):
            ``reasoning_format: "auto"`` then asks for it parsed out of a chat answer, and
            is refused (`specgen.server.inert.NO_REASONING`).

    Returns:
        (field, message) for the 400, or None when nothing is refused.
    """
    if not isinstance(body, dict):
        return None
    # a chat template's reasoning is parsed out of chat answers only (llama-server's)
    beside = Beside(_inert_field, thinks=thinks and route == "chat")
    for name, value in body.items():
        f = FIELDS.get(name)
        if f is None:
            close = near(name, _CHANGING)
            if close is not None:
                return name, misspelt(name, close)
            continue
        if _asks_nothing(f, value, body, beside):
            continue
        if route not in f.routes and f.status is not Status.IGNORED:
            # another route's field (tools, messages, prompt...): a client that sends it
            # here expects it used, and this route has nothing to use it for
            other = "/v1/chat/completions" if route == "completions" else "/v1/completions"
            return name, (
                f"{name} is a field of {other}, not of this route: the request is refused"
                " rather than served without it"
            )
        if f.status is not Status.REFUSED or route not in f.routes:
            continue
        shown = "; ".join(
            [", ".join(json.dumps(v) for v in f.inert), *(w.says for w in f.inert_when)]
        )
        return name, (
            f"{name} is not supported by this server: {f.note}. It would change what is"
            f" generated, so the request is refused rather than served without it (values"
            f" accepted: {shown})"
        )
    return None
