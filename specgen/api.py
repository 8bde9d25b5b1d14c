"""The public Python API, exported by `specgen` (``import specgen``; modelled on mlx-lm's
``load`` / ``generate`` / ``stream_generate``):

    pair = specgen.load()                                  # the embedded demo pair
    pair = specgen.load("big.gguf", "small.gguf")          # paths or registry names
    pair = specgen.load(pair="qwen2.5-coder-7b")           # a downloaded registry pair
    result = pair.generate("Once upon a time", max_tokens=64, temperature=0)
    for event in pair.stream("def fib(n):", max_tokens=64):   # Prefilled, Step..., Done
        ...

The CLI drives the same path (`events`), so the output, the sampling settings and the
speculative statistics are the ones `specgen run` gives.
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from specgen import session as _session
from specgen.chat import ChatFormatter, Message, TemplateModel, load_template, prompt_tokens
from specgen.engine import Drafter
from specgen.errors import ConfigError, PromptError
from specgen.events import Done, FinishReason, Prefilled, Stats, Step
from specgen.flags import ModelFlags, SamplingFlags, in_python_words, seed_or_random
from specgen.generate import FixedK, GenerateConfig, KPolicy, OneSlot
from specgen.logprobs import TokenLogprob

if TYPE_CHECKING:
    pass

Event = Prefilled | Step | Done


class Models(Protocol):
    """What a `Pair` generates with: `load`'s open `specgen.session.Session`, or engines
    loaded elsewhere (`Pair.of`)."""

    @property
    def target(self) -> TemplateModel: ...

    @property
    def drafter(self) -> Drafter | None: ...

    def policy(self, draft_max: int | None) -> KPolicy:
        """The block-size policy for ``draft_max`` (None = auto)."""
        ...

    def close(self) -> None: ...


M = TypeVar("M", bound=Models)


@dataclass(frozen=True)
class Engines:
    """A target and a drafter loaded elsewhere (`Pair.of`): `close()` leaves them open
    (they are the caller's).

    Attributes:
        target: the target engine; drafter: its drafter, or None (ordinary decoding).
        k_init: the first block size of ``draft_max="auto"`` (None = the controller's).
    """

    target: TemplateModel
    drafter: Drafter | None
    k_init: int | None = None

    def policy(self, draft_max: int | None) -> KPolicy:
        """As `specgen.session.Session.policy`."""
        return _session.make_policy(draft_max, k_init=self.k_init)

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Result:
    """One finished generation.

    Attributes:
        text: the generated text (the prompt excluded).
        tokens: the generated token ids.
        finish: why it ended: "length" (max_tokens), "eos", "stop", "context" or
            "interrupted".
        stats: the counts and timings of `specgen run --json`'s ``stats`` (seconds; see
            docs/reference/json.md), typed: ``stats.n_drafted``, ``stats.n_accepted``,
            ``stats.acceptance_rate``, ``stats.acceptance_how``, ``stats.k_history`` (the
            block size of each round), ``stats.wall_s``, ``stats.tokens_per_s``...;
            ``stats.to_dict()`` is that JSON object, key for key.
        seed: the seed used (a random one when none was given).
        logprobs: with ``logprobs=N``, one `specgen.logprobs.TokenLogprob` per generated
            token (its log-probability under the target's raw logits, natural log, and
            the N most likely tokens there); None when not asked.
        controller: with ``draft_max="auto"`` and a drafter, the block-size controller's
            decisions (`run --json`'s ``controller`` object); None otherwise.
    """

    text: str
    tokens: tuple[int, ...]
    finish: FinishReason
    stats: Stats
    seed: int
    logprobs: tuple[TokenLogprob, ...] | None = None
    controller: dict[str, object] | None = None

    @property
    def acceptance_rate(self) -> float:
        """Accepted proposals over tested proposals (0 when nothing was drafted)."""
        return self.stats.acceptance_rate


@contextmanager
def _argument_names() -> Iterator[None]:
    try:
        yield
    except ConfigError as exc:  # GrammarError stays one
        raise type(exc)(in_python_words(str(exc))) from exc


def sampling_flags(
    settings: Mapping[str, object], base: SamplingFlags | None = None
) -> SamplingFlags:
    """A call's keyword settings as the CLI's `SamplingFlags` (``temperature`` is --temp's
    ``temp``; ``draft_max`` an int or "auto"), over `base` when given (its fields where
    `settings` has none; the defaults otherwise), validated once.

    Raises:
        ConfigError: an unknown setting (with the nearest known name), or a bad value,
            named as the argument (``temperature must be a number, got 'hot'``).
    """
    given = dict(settings)
    if "temperature" in given:
        if "temp" in given:
            raise ConfigError("temperature and temp are the same setting: give one")
        given["temp"] = given.pop("temperature")
    known = [f.name for f in fields(SamplingFlags)]
    for name in given:
        if name not in known:
            names = [*known, "temperature"]
            near = difflib.get_close_matches(name, names, n=1)
            hint = (
                f" (did you mean {near[0]}?)" if near else f": the settings are {', '.join(names)}"
            )
            raise ConfigError(f"unknown setting {name!r}{hint}")
    draft_max = given.get("draft_max")
    if isinstance(draft_max, int) and not isinstance(draft_max, bool):
        given["draft_max"] = str(draft_max)
    with _argument_names():
        if base is not None:
            return replace(base, **given) if given else base  # type: ignore[arg-type]
        return SamplingFlags(**given)  # type: ignore[arg-type]


#: a prompt: text (bytes are UTF-8), or token ids as the target's tokenizer gives them
Prompt = str | bytes | Sequence[int]


class Generation:
    """One generation under way (`Pair.stream`, `Pair.stream_chat`): an iterator over its
    events (`Prefilled`, a `Step` per round, `Done`). Closing it early (``close()``)
    stops generating and leaves the models ready for the next call;
    ``throw(KeyboardInterrupt)`` ends it as Ctrl-C does (the next event is the `Done`,
    finish reason "interrupted").

    Attributes:
        seed: the seed used (a random one when none was given).
        settings: the call's settings, validated (`SamplingFlags`).
        n_prompt: prompt tokens (after the chat template, for a chat).
    """

    def __init__(self, run: OneSlot, seed: int, settings: SamplingFlags, n_prompt: int) -> None:
        self._run = run
        self._events = run.events()
        self.seed = seed
        self.settings = settings
        self.n_prompt = n_prompt

    def __iter__(self) -> Generation:
        return self

    def __next__(self) -> Event:
        return next(self._events)

    def close(self) -> None:
        self._events.close()

    def throw(self, exc: BaseException) -> Event:
        """Raise `exc` inside the loop (Ctrl-C: ``KeyboardInterrupt``); the next event."""
        return self._events.throw(exc)

    @property
    def controller(self) -> dict[str, object] | None:
        """With ``draft_max="auto"`` and a drafter, the block-size controller's decisions
        so far (`run --json`'s ``controller`` object); None otherwise."""
        return self._run.summary()


class Pair(Generic[M]):
    """A loaded target and drafter (`load`); `close()` frees both (also a context manager).

    Every call takes its own settings (temperature, K, seed, constraints...), for both
    models: the drafter samples its proposals under the call's settings as the target
    does. A call is independent of the calls before it: the same call with the same
    ``seed`` and a fixed ``draft_max`` gives the same text, as `specgen run` does.

    Attributes:
        session: the open models: from `load`, a `specgen.session.Session` (``target``,
            ``drafter``, ``draft_name``, and the ``warnings`` and ``notes`` the CLI
            prints); from `Pair.of`, the `Engines` given.
    """

    def __init__(self, opened: M) -> None:
        self.session = opened
        self._formatters: dict[str | None, ChatFormatter] = {}

    @classmethod
    def of(
        cls, target: TemplateModel, drafter: Drafter | None, *, k_init: int | None = None
    ) -> Pair[Engines]:
        """A Pair over a target and a drafter loaded elsewhere (`specgen.session.load`,
        as `specgen bench` measures them); `close()` leaves them open. `k_init`: the first
        block size of ``draft_max="auto"`` (a registry pair's recommended K; None = the
        controller's default)."""
        return Pair(Engines(target, drafter, k_init))

    def generate(
        self,
        prompt: Prompt,
        settings: SamplingFlags | None = None,
        /,
        *,
        ordinary: bool = False,
        **kwargs: object,
    ) -> Result:
        """Generate from `prompt` (the text as it is, no chat template) to the end.

        Args:
            prompt: text (bytes are taken as UTF-8), or token ids.
            settings: a `SamplingFlags` to start from (the CLI's), the keyword arguments
                replacing its fields; None = the defaults.
            **kwargs: `run`'s sampling settings (`SamplingFlags`' fields), each for
                this call only: ``max_tokens`` (256), ``temperature`` or ``temp`` (0.8;
                0 or below = greedy), ``top_k`` (40), ``top_p`` (0.95), ``min_p`` (0.05),
                ``seed`` (None = random), ``draft_max`` (K as an int, or "auto"),
                ``stop`` (a string or strings), ``ignore_eos`` (False), ``verify``
                ("block", "token", or None = auto), ``logit_bias`` (``{token_id: bias}``,
                bias in [-100, 100] or -inf), ``repeat_penalty`` (1.0 = off),
                ``repeat_last_n`` (64; 0 = off, -1 = the whole context),
                ``presence_penalty`` and ``frequency_penalty`` (-2 to 2; 0 = off). The
                bias and the penalties act on the logits before the warpers, on the target
                and the draft alike (`specgen.constraints`), as llama.cpp applies them.
                ``logprobs`` (None, or N in 0..20: `Result.logprobs` with N alternatives
                per token).
                ``grammar`` (GBNF or Lark text) or ``json_schema`` (a dict, JSON text or a
                pydantic model class), or ``grammar_file`` / ``json_schema_file`` (paths):
                the output must match it, exactly as the target samples under the
                grammar's mask (`specgen.grammar`); the result ends with finish reason
                "stop" when the grammar is complete.
            ordinary: decode with the target alone (no drafter, no draft pass, K = 0):
                the baseline speculative decoding is measured against (`specgen bench`'s
                ordinary runs), on the same loaded target.

        Raises:
            ConfigError: an unknown setting or a bad value (the message names the
                argument: ``temperature must be a number, got 'hot'``), a grammar or
                schema that does not compile (GrammarError); PromptError: an empty prompt
                or one that does not fit the context.
        """
        ids = self._prompt_ids(prompt)
        return _result(self._start(ids, settings, kwargs, False, ordinary))

    def stream(
        self,
        prompt: Prompt,
        settings: SamplingFlags | None = None,
        /,
        *,
        trace: bool = False,
        ordinary: bool = False,
        **kwargs: object,
    ) -> Generation:
        """The generation's events as they happen, a `Generation`: one `Prefilled`, then a
        `Step` per round (``.text``: the new text; ``.n_accepted``, ``.k``), then `Done`.
        Arguments and errors as `generate`, all checked at the call (not at the first
        event); `trace` attaches a `RoundTrace` to every Step (`run --trace`). Closing the
        iterator early stops generating and leaves the models ready for the next call."""
        return self._start(self._prompt_ids(prompt), settings, kwargs, trace, ordinary)

    def chat(
        self,
        messages: Sequence[Mapping[str, object]],
        settings: SamplingFlags | None = None,
        /,
        *,
        chat_template: str | Path | None = None,
        **kwargs: object,
    ) -> Result:
        """The assistant's reply to `messages`, rendered with the target's chat template
        (the one `specgen chat`, `run` and `serve` apply: its GGUF's
        ``tokenizer.chat_template``, or the file `chat_template`), then generated as
        `generate` does.

        Args:
            messages: ``[{"role": "system" | "user" | "assistant", "content": text}, ...]``,
                as OpenAI's chat API and transformers take them; the template's
                generation prompt is added after the last one.
            settings, **kwargs: as `generate`'s.
            chat_template: a Jinja2 template file to use instead of the target's own.

        Raises:
            ConfigError: the target has no chat template (a base model) and no
                `chat_template` was given, a template file that cannot be read, malformed
                messages, or a bad setting (as `generate`). ChatTemplateError: the template
                does not compile or fails on these messages. PromptError: no messages, or
                a conversation that does not fit the context.
        """
        ids = self._chat_ids(messages, chat_template)
        return _result(self._start(ids, settings, kwargs, False))

    def stream_chat(
        self,
        messages: Sequence[Mapping[str, object]],
        settings: SamplingFlags | None = None,
        /,
        *,
        chat_template: str | Path | None = None,
        trace: bool = False,
        **kwargs: object,
    ) -> Generation:
        """`chat`'s reply as `stream`'s events (`Prefilled`, `Step`..., `Done`). Arguments
        and errors as `chat` and `stream`."""
        ids = self._chat_ids(messages, chat_template)
        return self._start(ids, settings, kwargs, trace)

    def _prompt_ids(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            prompt = prompt.encode("utf-8")
        if not isinstance(prompt, bytes):
            return self._token_ids(prompt)
        text = prompt
        if not text:
            raise PromptError("the prompt is empty")
        return prompt_tokens(self.session.target, text)

    def _token_ids(self, prompt: object) -> list[int]:
        ids = list(prompt) if isinstance(prompt, Sequence) else None
        if ids is None or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ConfigError(
                f"prompt must be text (str or bytes) or token ids, got {prompt!r:.60}"
            )
        if not ids:
            raise PromptError("the prompt is empty")
        n_vocab = self.session.target.n_vocab
        if not all(0 <= t < n_vocab for t in ids):
            raise ConfigError(f"prompt token ids must be in [0, {n_vocab}) (the vocabulary)")
        return ids

    def _chat_ids(
        self, messages: Sequence[Mapping[str, object]], chat_template: str | Path | None
    ) -> list[int]:
        return self._formatter(chat_template).tokens(check_messages(messages))

    def _formatter(self, path: str | Path | None) -> ChatFormatter:
        """The target's compiled chat template (or the file's), compiled once per Pair."""
        key = None if path is None else str(path)
        if key not in self._formatters:
            target = self.session.target
            with _argument_names():
                template = load_template(target, None if path is None else Path(path))
            if template is None:
                raise ConfigError(
                    f"{target.name} has no chat template (a base model): pass"
                    " chat_template=FILE, or use generate(), which continues the text as it is"
                )
            self._formatters[key] = ChatFormatter(template, target)
        return self._formatters[key]

    def _start(
        self,
        ids: list[int],
        base: SamplingFlags | None,
        settings: Mapping[str, object],
        trace: bool,
        ordinary: bool = False,
    ) -> Generation:
        """Check everything now (not at the first event), then the generation."""
        flags = sampling_flags(settings, base)
        seed = seed_or_random(flags.seed)
        # errors in the caller's words: keyword arguments', or a SamplingFlags' flags
        with _argument_names() if base is None else contextlib.nullcontext():
            run = one_slot(self.session, ids, flags, seed, trace, ordinary)
        return Generation(run, seed, flags, len(ids))

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> Pair[M]:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _result(gen: Generation) -> Result:
    """Run `gen` to its end: the `Result`."""
    asked = gen.settings.logprobs is not None
    done: Done | None = None
    logprobs: list[TokenLogprob] = []
    for ev in gen:
        if isinstance(ev, Done):
            done = ev
        elif isinstance(ev, Step) and asked:
            logprobs.extend(s.logprob for s in ev.spans if s.logprob is not None)
    assert done is not None  # the loop always ends with Done
    return Result(
        done.text, done.tokens, done.finish_reason, done.stats, gen.seed,
        tuple(logprobs) if asked else None, gen.controller,
    )  # fmt: skip


def check_messages(messages: object) -> list[Message]:
    """`messages` as the chat template takes them: a non-empty list of mappings, each with
    a ``role`` and a ``content`` string (other keys, such as ``tool_calls``, pass through).

    Raises:
        PromptError: no messages. ConfigError: a message that is not so, naming its index.
    """
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise ConfigError(
            'messages must be a list of {"role": ..., "content": ...} dicts,'
            f" got {type(messages).__name__}"
        )
    if not messages:
        raise PromptError("no messages: give at least one")
    out: list[Message] = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not all(
            isinstance(m.get(k), str) for k in ("role", "content")
        ):
            raise ConfigError(
                f'messages[{i}] must be a dict with "role" and "content" strings, got {m!r}'
            )
        out.append(dict(m))
    return out


def load(
    target: str | Path | None = None,
    draft: str | Path | None = None,
    *,
    pair: str | None = None,
    models: str | Path | None = None,
    ctx_size: int = 4096,
    n_gpu_layers: int = 0,
    n_gpu_layers_draft: int = 0,
    threads: int = 0,
    draft_p_min: float = 0.0,
    lookup: str | None = None,
    swa_full: bool = False,
    rpc: str | None = None,
) -> Pair[_session.Session]:
    """Load a target and its drafter: GGUF paths or registry names, a registry `pair`, or
    with neither the embedded demo pair (built once, offline). `draft` may be ``"ngram"``
    (prompt lookup, no model) or ``"none"`` (ordinary decoding).

    The other arguments are the CLI's --models, -c, -ngl, -ngld, -t, --draft-p-min,
    --lookup (on, off, or None = auto), --swa-full and --rpc (`specgen.flags.ModelFlags`).

    Raises:
        ConfigError, ModelFileError, ModelLoadError, VocabMismatchError: as `specgen run`
            reports them (the message says what to do), each setting named as the argument.
    """
    with _argument_names():
        flags = ModelFlags(
            target=None if target is None else str(target),
            draft=None if draft is None else str(draft),
            pair=pair,
            models=models,  # type: ignore[arg-type]  # a str is made a Path when checked
            ctx_size=ctx_size,
            n_gpu_layers=n_gpu_layers,
            n_gpu_layers_draft=n_gpu_layers_draft,
            threads=threads,
            draft_p_min=draft_p_min,
            lookup=lookup,
            swa_full=swa_full,
            rpc=rpc,
        )
        return Pair(_session.open(flags))


def one_slot(
    opened: Models,
    ids: list[int],
    sampling: SamplingFlags,
    seed: int,
    trace: bool = False,
    ordinary: bool = False,
) -> OneSlot:
    """The generation for prompt token `ids` on an open session (`OneSlot.events()`: its
    events; `OneSlot.summary()`: the controller's choices, which the CLI's --json
    reports); `trace` attaches a `RoundTrace` to every Step; `ordinary` decodes with the
    target alone (K = 0).

    Raises:
        PromptError: the prompt does not fit the context. GrammarError: the grammar or
            schema does not compile. ConfigError: a setting the engines refuse.
    """
    drafter = None if ordinary else opened.drafter
    # the baseline for the speedup and the controller's choices
    measure = 3 if drafter is not None else 0
    config = GenerateConfig.of(sampling, seed, measure_ordinary=measure, trace=trace)
    policy = FixedK(0) if ordinary else opened.policy(sampling.k)
    return OneSlot(opened.target, drafter, ids, config, policy)
