"""The public Python API, exported by `specgen` (``import specgen``; modelled on mlx-lm's
``load`` / ``generate`` / ``stream_generate``):

    pair = specgen.load()                                  # the embedded demo pair
    pair = specgen.load("big.gguf", "small.gguf")          # paths or registry names
    pair = specgen.load(pair="qwen2.5-coder-7b")           # a downloaded registry pair
    result = pair.generate("Once upon a time", max_tokens=64, temperature=0)
    for event in pair.stream("def fib(n):", max_tokens=64):   # Prefilled, Step..., Done
        ...

The CLI drives the same path: the output, settings and statistics are `specgen run`'s.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Generic, TypeVar

from specgen import session as _session
from specgen.apiargs import (
    Prompt,
    argument_names,
    check_messages,
    prompt_list,
    sampling_flags,
)
from specgen.apiengine import (
    Engines,
    Models,
    chat_formatter,
    generate_many,
    make_scheduler,
    one_slot,
    prompt_ids,
    prompts_ids,
    text_of,
    tokens_of,
    warn_fit,
)
from specgen.chat import ChatFormatter, ChatSession, TemplateModel
from specgen.engine import Drafter
from specgen.errors import ConfigError
from specgen.flags import ModelFlags, SamplingFlags, seed_or_random
from specgen.genconfig import grammar_spec
from specgen.generation import Busy, Event, Generation, Result, result_of
from specgen.verify.options import VerifyFlags

if TYPE_CHECKING:
    from specgen.sched.jobs import BatchReport, Deliver
    from specgen.sched.scheduler import Scheduler
    from specgen.verify.report import VerifyReport

__all__ = ["Engines", "Event", "Generation", "Models", "Pair", "Result", "load", "one_slot"]

M = TypeVar("M", bound=Models)


class Pair(Generic[M]):
    """A loaded target and drafter (`load`); `close()` frees both (also a context manager).

    Every call takes its own settings (temperature, K, seed...), for both models. A call's
    text is independent of the calls before it (the same call, ``seed`` and fixed
    ``draft_max`` give the same text, as `specgen run` does); its speed measurements are
    taken by the first call with a drafter and kept (`specgen.generate.StartUp`).

    Attributes:
        session: the open models: from `load`, a `specgen.session.Session` (``target``,
            ``drafter``, ``draft_name``, and the ``warnings`` and ``notes`` the CLI
            prints); from `Pair.of`, the `Engines` given.
    """

    def __init__(self, opened: M) -> None:
        self.session = opened
        self._formatters: dict[str | None, ChatFormatter] = {}
        self._busy = Busy()  # one generation at a time (`specgen.BusyError`)

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
                ``stop`` (a string or strings), ``ignore_eos`` (False), ``min_tokens``
                (0; no end, nor stop string, before this many tokens), ``prediction``
                (None, or text the output should contain: drafted from by prompt lookup),
                ``verify``
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
                or one that does not fit the context; BusyError: a stream of this Pair is
                not finished, or another thread's call is running.
        """
        ids = prompt_ids(self.session.target, prompt)
        return result_of(self._start(ids, settings, kwargs, False, ordinary))

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
        return self._start(
            prompt_ids(self.session.target, prompt), settings, kwargs, trace, ordinary
        )

    def generate_many(
        self,
        prompts: Iterable[Prompt],
        settings: SamplingFlags | None = None,
        /,
        *,
        ordinary: bool = False,
        **kwargs: object,
    ) -> list[Result]:
        """Generate from every prompt on the batch engine (`serve`'s): as many at once as
        the models hold sequences (`load`'s ``n_parallel``; one at a time with 1), in one
        target decode per step. Each result is the target's own output law under the
        call's settings, whatever shares the batch; prompt i is seeded ``seed + i``. A
        batched decode's rows can differ from one stream's in their last bits, so a
        seeded text here can differ from `generate`'s with the same seed.

        Args:
            prompts: texts (no chat template) or token ids, as `generate`'s.
            settings, ordinary, **kwargs: as `generate`'s, for every prompt.

        Returns:
            One `Result` per prompt, in order (``controller`` None: the batch's controller
            is shared).

        Raises:
            As `generate`: ConfigError, GrammarError, PromptError (no prompts, an empty
            one, or one that with ``max_tokens`` does not fit the context; the message
            names the prompt's index).
        """
        ids = prompts_ids(self.session.target, prompt_list(prompts))
        flags = sampling_flags(kwargs, settings)
        with self._busy.held(), argument_names() if settings is None else contextlib.nullcontext():
            return generate_many(self.session, ids, flags, seed_or_random(flags.seed), ordinary)

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
        return result_of(self._start(ids, settings, kwargs, False))

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

    def chat_session(
        self,
        settings: SamplingFlags | None = None,
        /,
        *,
        system: str | None = None,
        chat_template: str | Path | None = None,
        **kwargs: object,
    ) -> ChatSession:
        """A multi-turn conversation (what `specgen chat` drives): ``session.reply(text)``
        adds a user message and streams the reply (`stream_chat`'s events), and the
        conversation keeps both. Unlike separate `chat` calls, each reply keeps what the
        target's and the drafter's caches hold of the conversation (its earlier turns) and
        evaluates only the new tokens: the same law, though a reply can differ from a fresh
        `chat` of the same messages where a near-tie meets other arithmetic.

        Args:
            settings, **kwargs: every reply's settings, as `generate`'s; reply i (from 0)
                is seeded ``seed + i`` (a random ``seed`` when none is given).
            system: a system message before the turns.
            chat_template: as `chat`'s.

        Raises:
            ConfigError: as `chat` (no chat template, a bad setting), at the call.
            ChatTemplateError: the template does not compile.
        """
        flags = sampling_flags(kwargs, settings)
        seed = seed_or_random(flags.seed)
        words = settings is None
        formatter = self._formatter(chat_template, words)
        with argument_names() if words else contextlib.nullcontext():
            grammar_spec(flags)  # a grammar file that cannot be read: this call's error

        def start(ids: list[int], reply: int) -> Generation:
            return self._run(ids, flags, seed + reply, words=words, reuse_cache=True)

        opened = self.session
        return ChatSession(formatter, opened.target.n_ctx, start, opened.drafter is not None,
                           system=system)  # fmt: skip

    def verify(
        self,
        settings: SamplingFlags | None = None,
        /,
        *,
        samples: int = VerifyFlags.samples,
        positions: int = VerifyFlags.positions,
        draft_max: int = VerifyFlags.draft_max,
        alpha: float = VerifyFlags.alpha,
        check: str = VerifyFlags.check,
        prompts: Sequence[str] = VerifyFlags.prompts,
        progress: Callable[[str], None] | None = None,
        **kwargs: object,
    ) -> VerifyReport:
        """Check that speculation leaves the target's output unchanged on this pair (what
        `specgen verify` runs): greedy speculative output must equal ordinary output (up
        to near-ties flipped by batched arithmetic), and sampled tokens at the first
        `positions` must follow the target's own law (chi-square, Holm-corrected at
        `alpha`). Each generation is the pair's engine at a fixed K whose first round
        speculates too, so that every tested position goes through the acceptance rule.

        Args:
            settings, **kwargs: the sampling check's settings (`generate`'s, over
                ``temperature=1, top_k=40, top_p=1, min_p=0, seed=0``): ``verify``,
                ``grammar``/``json_schema``, the bias and penalties hold in both checks.
                ``max_tokens``, ``stop``, ``ignore_eos`` and ``logprobs`` are the checks'
                own and refused.
            samples: speculative samples per sampling prompt (at least 20).
            positions: generated positions tested per sample.
            draft_max: the sampling check's block size K (1 to 64).
            alpha: the family-wise significance level.
            check: "all", "greedy" or "sampling".
            prompts: both checks' prompts instead of the built-in ones.
            progress: called with one-line status messages.

        Returns:
            A `specgen.verify.report.VerifyReport` (``passed``; ``verdict``: "pass",
            "fail" or "untested"; ``to_dict()``: `verify --json`'s object); the target's
            cache is left empty.

        Raises:
            ConfigError: a bad or refused setting, the sampling check at temperature 0, or
                no drafter (``draft="none"``). GrammarError: as `generate`.
        """
        # the checks load only when asked for
        from specgen.verify import config as checks
        from specgen.verify.report import verify

        for name in checks.UNUSED:
            if name in kwargs:
                raise ConfigError(f"verify does not take {name}: the checks set it themselves")
        flags = sampling_flags(kwargs, settings or checks.SAMPLING_FLAGS, others=checks.ARGUMENTS)
        with argument_names() if settings is None else contextlib.nullcontext():
            options = VerifyFlags(
                samples=samples, positions=positions, draft_max=draft_max, alpha=alpha,
                check=check, prompts=prompts,  # type: ignore[arg-type]
            )  # fmt: skip
            config = checks.config_of(flags, options)
            make = checks.drafter_factory(self.session.drafter)
        with self._busy.held():
            return verify(self.session.target, make, config, self.session.draft_name, progress)

    def scheduler(
        self,
        *,
        n_parallel: int | None = None,
        queue_max: int = 64,
        draft_max: int | None = None,
        slo_ttft_s: float | None = None,
        slo_tpot_s: float | None = None,
        prompt_cache_mib: int = 0,
        observer: Callable[[BatchReport], None] | None = None,
        deliver: Deliver | None = None,
    ) -> Scheduler:
        """The batch engine that `specgen serve` runs (`specgen.sched.Scheduler`), not
        started: ``start()`` runs its steps in a worker thread, ``submit(Job, sink)``
        queues a request (token ids and a `GenerateConfig`) whose events (`Step`...,
        `Done`, or `Failed`) go to `sink`; ``run_until_idle()`` runs them in this thread.

        Args:
            n_parallel: slots (None: every sequence the models hold, `load`'s
                ``n_parallel``). queue_max: requests that may wait for a slot.
            draft_max: fixed K, or None for the batch controller (auto).
            slo_ttft_s, slo_tpot_s: --slo-ttft, --slo-tpot in seconds (slo_tpot_s 0:
                ordinary decoding's own TPOT at the current load, `control.latency`).
            prompt_cache_mib: MiB of host memory for the cells of prompts that left their
                slot (-1: no limit, 0: none).
            observer, deliver: see `Scheduler`.

        Raises:
            ConfigError: slo_ttft_s not above 0, or slo_tpot_s below 0.
            ValueError: more slots than the models hold sequences, or a drafter that
                cannot draft for several slots.
        """
        return make_scheduler(
            self.session, n_parallel=n_parallel, queue_max=queue_max, draft_max=draft_max,
            slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s, prompt_cache_mib=prompt_cache_mib,
            observer=observer, deliver=deliver,
        )  # fmt: skip

    def _chat_ids(
        self, messages: Sequence[Mapping[str, object]], chat_template: str | Path | None
    ) -> list[int]:
        return self._formatter(chat_template).tokens(check_messages(messages))

    def _formatter(self, path: str | Path | None, words: bool = True) -> ChatFormatter:
        """The target's chat template (or the file's), compiled once per Pair; `words` as
        `_run`'s."""
        key = None if path is None else str(path)
        if key not in self._formatters:
            self._formatters[key] = chat_formatter(self.session.target, path, words)
        return self._formatters[key]

    def tokenize(self, text: str | bytes, add_special: bool = True) -> list[int]:
        """Token ids of `text` as `generate` tokenizes a prompt (special tokens parsed; no
        start token with `add_special` False): for prompts of ids and ``logit_bias``."""
        return tokens_of(self.session.target, text, add_special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        """The text of token ids as the vocabulary spells them (bytes that are not UTF-8
        as U+FFFD); ConfigError for anything but ids in the vocabulary."""
        return text_of(self.session.target, tokens)

    def _start(
        self,
        ids: list[int],
        base: SamplingFlags | None,
        settings: Mapping[str, object],
        trace: bool,
        ordinary: bool = False,
    ) -> Generation:
        """Check everything now (not at the first event), then the generation."""
        flags = sampling_flags(settings, base, {"trace": trace, "ordinary": ordinary})
        return self._run(ids, flags, seed_or_random(flags.seed), words=base is None,
                         trace=trace, ordinary=ordinary)  # fmt: skip

    def _run(
        self,
        ids: list[int],
        flags: SamplingFlags,
        seed: int,
        *,
        words: bool,
        trace: bool = False,
        ordinary: bool = False,
        reuse_cache: bool = False,
    ) -> Generation:
        """The generation of `ids` under validated `flags`; `words`: errors named as
        keyword arguments (else as the flags of a `SamplingFlags` the caller gave)."""
        self._busy.take()
        try:
            with argument_names() if words else contextlib.nullcontext():
                run = one_slot(self.session, ids, flags, seed, trace, ordinary, reuse_cache)
        except BaseException:
            self._busy.release()
            raise
        if words:  # the CLI says it as a note (`specgen.cli.run`)
            warn_fit(len(ids), flags.max_tokens, self.session.target.n_ctx)
        return Generation(run, seed, flags, len(ids), self._busy.release)

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> Pair[M]:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


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
    flash_attn: str = "auto",
    rpc: str | None = None,
    n_parallel: int = 1,
) -> Pair[_session.Session]:
    """Load a target and its drafter: GGUF paths or registry names, a registry `pair`, or
    with neither the embedded demo pair (built once, offline). `draft` may be ``"ngram"``
    (prompt lookup, no model) or ``"none"`` (ordinary decoding).

    The other arguments are the CLI's --models, -c, -ngl, -ngld, -t, --draft-p-min,
    --lookup (on, off, or None = auto), --swa-full, -fa and --rpc (`specgen.flags.ModelFlags`).
    `n_parallel` (`serve`'s -np): sequences each model's cache holds, the slots of
    `Pair.generate_many` and `Pair.scheduler` (each holds -c; with more than one, a
    sliding-window cache is kept full-size, as `serve` keeps it).

    Raises:
        ConfigError, ModelFileError, ModelLoadError, VocabMismatchError: as `specgen run`
            reports them (the message says what to do), each setting named as the argument.
    """
    with argument_names():
        if not isinstance(n_parallel, int) or n_parallel < 1:
            raise ConfigError(f"n_parallel must be an integer of at least 1, got {n_parallel!r}")
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
            swa_full=swa_full or n_parallel > 1,
            flash_attn=flash_attn,
            rpc=rpc,
        )
        return Pair(_session.open(flags, n_seq_max=n_parallel))
