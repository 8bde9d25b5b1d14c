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

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from specgen import session as _session
from specgen.chat import prompt_tokens
from specgen.engine import Drafter
from specgen.errors import ConfigError, PromptError
from specgen.events import Done, FinishReason, Prefilled, Stats, Step
from specgen.flags import ModelFlags, SamplingFlags, seed_or_random
from specgen.generate import GenerateConfig, KPolicy, check_prompt, generate
from specgen.logprobs import TokenLogprob
from specgen.sampling import SamplingParams

if TYPE_CHECKING:
    from specgen.grammar import GrammarSpec

Event = Prefilled | Step | Done


@dataclass(frozen=True)
class Result:
    """One finished generation.

    Attributes:
        text: the generated text (the prompt excluded).
        tokens: the generated token ids.
        finish: why it ended: "length" (max_tokens), "eos", "stop", "context" or
            "interrupted".
        stats: the counts and timings (seconds), with the speculative statistics:
            ``stats.n_drafted``, ``stats.n_accepted`` (acceptance rate = their ratio),
            ``stats.k_history`` (the block size of each round); ``stats.to_dict()`` for JSON.
        seed: the seed used (a random one when none was given).
        logprobs: with ``logprobs=N``, one `specgen.logprobs.TokenLogprob` per generated
            token (its log-probability under the target's raw logits, natural log, and
            the N most likely tokens there); None when not asked.
    """

    text: str
    tokens: tuple[int, ...]
    finish: FinishReason
    stats: Stats
    seed: int
    logprobs: tuple[TokenLogprob, ...] | None = None

    @property
    def acceptance_rate(self) -> float:
        """Accepted proposals over tested proposals (0 when nothing was drafted)."""
        s = self.stats
        return s.n_accepted / s.n_drafted if s.n_drafted else 0.0


#: the CLI's flags, as this API's arguments call them (errors are raised in CLI words)
_ARGUMENT_OF_FLAG = {
    "-m": "target",
    "-md": "draft",
    "--pair": "pair",
    "--models": "models",
    "-c": "ctx_size",
    "-ngl": "n_gpu_layers",
    "-ngld": "n_gpu_layers_draft",
    "-t": "threads",
    "--draft-p-min": "draft_p_min",
    "-n": "max_tokens",
    "--temp": "temperature",
    "--top-k": "top_k",
    "--top-p": "top_p",
    "--min-p": "min_p",
    "--seed": "seed",
    "--draft-max": "draft_max",
    "--stop": "stop",
    "--ignore-eos": "ignore_eos",
    "--verify": "verify",
    "--logit-bias": "logit_bias",
    "--repeat-penalty": "repeat_penalty",
    "--repeat-last-n": "repeat_last_n",
    "--presence-penalty": "presence_penalty",
    "--frequency-penalty": "frequency_penalty",
    "--logprobs": "logprobs",
    "--grammar": "grammar",
    "--json-schema": "json_schema",
}
_FLAG = re.compile(r"(?<![\w-])--?[a-z][a-z-]*")


def in_python_words(message: str) -> str:
    """A CLI error message with each flag named as this API's argument (``--top-p`` ->
    ``top_p``); flags without an argument here are left as they are."""
    return _FLAG.sub(lambda m: _ARGUMENT_OF_FLAG.get(m[0], m[0]), message)


@contextmanager
def _argument_names() -> Iterator[None]:
    try:
        yield
    except ConfigError as exc:  # GrammarError stays one
        raise type(exc)(in_python_words(str(exc))) from exc


class Pair:
    """A loaded target and drafter (`load`); `close()` frees both (also a context manager).

    Attributes:
        session: the open models (`specgen.session.Session`): ``target``, ``drafter``,
            ``draft_name``, and the ``warnings`` and ``notes`` the CLI prints.
    """

    def __init__(self, opened: _session.Session) -> None:
        self.session = opened

    def generate(self, prompt: str | bytes, **sampling: object) -> Result:
        """Generate from `prompt` (the text as it is, no chat template) to the end.

        Args:
            prompt: text; bytes are taken as UTF-8.
            **sampling: `SamplingFlags` fields: ``max_tokens`` (256), ``temperature`` or
                ``temp`` (0.8; 0 or below = greedy), ``top_k`` (40), ``top_p`` (0.95),
                ``min_p`` (0.05), ``seed`` (None = random), ``draft_max`` (K as an int, or
                "auto"), ``stop`` (strings), ``ignore_eos`` (False), ``logit_bias``
                (``{token_id: bias}``, bias in [-100, 100] or -inf), ``repeat_penalty``
                (1.0 = off), ``repeat_last_n`` (64; 0 = off, -1 = the whole context),
                ``presence_penalty`` and ``frequency_penalty`` (-2 to 2; 0 = off). The
                bias and the penalties act on the logits before the warpers, on the target
                and the draft alike (`specgen.constraints`), as llama.cpp applies them.
                ``logprobs`` (None, or N in 0..20: `Result.logprobs` with N alternatives
                per token).
                ``grammar`` (GBNF or Lark text) or ``json_schema`` (a dict, JSON text or a
                pydantic model class): the output must match it, exactly as the target
                samples under the grammar's mask (`specgen.grammar`); the result ends
                with finish reason "stop" when the grammar is complete.

        Raises:
            ConfigError: a bad setting (the message names it), a grammar or schema that
                does not compile (GrammarError); PromptError: an empty prompt or one that
                does not fit the context.
        """
        asked = sampling.get("logprobs") is not None
        it, seed = self._start(prompt, sampling)
        done: Done | None = None
        logprobs: list[TokenLogprob] = []
        for ev in it:
            if isinstance(ev, Done):
                done = ev
            elif isinstance(ev, Step) and asked:
                logprobs.extend(s.logprob for s in ev.spans if s.logprob is not None)
        assert done is not None  # the loop always ends with Done
        return Result(
            done.text, done.tokens, done.finish_reason, done.stats, seed,
            tuple(logprobs) if asked else None,
        )  # fmt: skip

    def stream(self, prompt: str | bytes, **sampling: object) -> Iterator[Event]:
        """The generation's events as they happen: one `Prefilled`, then a `Step` per round
        (``.text``: the new text; ``.n_accepted``, ``.k``), then `Done`. Arguments and errors
        as `generate`. Closing the iterator early stops generating and leaves the models
        ready for the next call."""
        return self._start(prompt, sampling)[0]

    def _start(
        self, prompt: str | bytes, sampling: dict[str, object]
    ) -> tuple[Iterator[Event], int]:
        """Check everything now (not at the first event), then the events and the seed."""
        if "temperature" in sampling:
            sampling["temp"] = sampling.pop("temperature")
        if "draft_max" in sampling:
            sampling["draft_max"] = str(sampling["draft_max"])
        with _argument_names():
            flags = SamplingFlags(**sampling)  # type: ignore[arg-type]
        text = prompt.encode("utf-8") if isinstance(prompt, str) else prompt
        if not text:
            raise PromptError("the prompt is empty")
        ids = prompt_tokens(self.session.target, text)
        seed = seed_or_random(flags.seed)
        with _argument_names():
            return events(self.session, ids, flags, seed)[0], seed

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> Pair:
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
    models: Path | None = None,
    ctx_size: int = 4096,
    n_gpu_layers: int = 0,
    n_gpu_layers_draft: int = 0,
    threads: int = 0,
    draft_p_min: float = 0.0,
) -> Pair:
    """Load a target and its drafter: GGUF paths or registry names, a registry `pair`, or
    with neither the embedded demo pair (built once, offline). `draft` may be ``"ngram"``
    (prompt lookup, no model) or ``"none"`` (ordinary decoding).

    The other arguments are the CLI's -c, -ngl, -ngld, -t and --draft-p-min.

    Raises:
        ConfigError, ModelFileError, ModelLoadError, VocabMismatchError: as `specgen run`
            reports them (the message says what to do).
    """
    with _argument_names():
        return Pair(
            _session.open(
                _model_flags(
                    target,
                    draft,
                    pair,
                    models,
                    ctx_size,
                    n_gpu_layers,
                    n_gpu_layers_draft,
                    threads,
                    draft_p_min,
                )
            )
        )


def _model_flags(
    target: str | Path | None,
    draft: str | Path | None,
    pair: str | None,
    models: Path | None,
    ctx_size: int,
    n_gpu_layers: int,
    n_gpu_layers_draft: int,
    threads: int,
    draft_p_min: float,
) -> ModelFlags:
    return ModelFlags(
        target=None if target is None else str(target),
        draft=None if draft is None else str(draft),
        pair=pair,
        models=models,
        ctx_size=ctx_size,
        n_gpu_layers=n_gpu_layers,
        n_gpu_layers_draft=n_gpu_layers_draft,
        threads=threads,
        draft_p_min=draft_p_min,
    )


def events(
    opened: _session.Session,
    ids: list[int],
    sampling: SamplingFlags,
    seed: int,
    trace: bool = False,
) -> tuple[Iterator[Event], KPolicy]:
    """The loop's events for prompt token `ids` on an open session, and the block-size
    policy driving them (the CLI's --json reports its decisions); `trace` attaches a
    `RoundTrace` to every Step.

    Raises:
        PromptError: the prompt does not fit the context. GrammarError: the grammar or
            schema does not compile.
    """
    check_prompt(ids, opened.target.n_ctx)
    config = GenerateConfig(
        max_tokens=sampling.max_tokens,
        params=sampling.params(),
        stop=sampling.stop,
        ignore_eos=sampling.ignore_eos,
        seed=seed,
        # the baseline for the speedup and the controller's choices
        measure_ordinary=3 if opened.drafter is not None else 0,
        trace=trace,
        verify_rule=sampling.verify_rule,  # type: ignore[arg-type]
        logprobs=sampling.logprobs,
        grammar=grammar_spec(sampling),
    )
    if config.grammar is not None:
        # compiled now (and cached): a bad grammar is an error of this call, not of its
        # first event
        from specgen.grammar import compile_grammar, tokenizer_for

        compile_grammar(config.grammar, tokenizer_for(opened.target))
    policy = opened.policy(sampling.k)
    drafter = _drafter_under(opened.drafter, config.params)
    return generate(opened.target, drafter, ids, config, policy), policy


def grammar_spec(sampling: SamplingFlags) -> GrammarSpec | None:
    """The grammar of `sampling`'s --grammar, --grammar-file, --json-schema or
    --json-schema-file (`specgen.grammar.spec_of`), or None.

    Raises:
        ConfigError: a file that cannot be read; GrammarError: a schema that is not JSON.
    """
    if (
        sampling.grammar is None
        and sampling.grammar_file is None
        and sampling.json_schema is None
        and sampling.json_schema_file is None
    ):
        return None  # llguidance is not even loaded
    from specgen.grammar import spec_of

    return spec_of(
        sampling.grammar, sampling.grammar_file, sampling.json_schema, sampling.json_schema_file
    )


def _drafter_under(drafter: Drafter | None, params: SamplingParams) -> Drafter | None:
    """The session's drafter with q under `params`: one loaded under other settings
    (`load()` knows none) is rebuilt on the same engine and cache, so its q rows carry the
    call's warpers, logit bias and penalties (q is exact either way, as the law x was drawn
    from; one far from p is accepted less often)."""
    own = getattr(drafter, "params", None)
    if drafter is None or own is None or own == params:
        return drafter
    return drafter.with_params(params)
