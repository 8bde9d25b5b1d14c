"""How the Python API's calls reach the one engine (`specgen.sched.Scheduler`): a single
stream is the engine with one slot (`one_slot`, behind `Pair.generate` and `Pair.stream`);
several prompts are the engine with N slots (`generate_many`, behind
`Pair.generate_many`; `Pair.scheduler`, which `specgen serve` drives, builds it too).
`Models` is what they run on: `specgen.load`'s session, or engines loaded elsewhere (`Engines`).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from specgen import session as _session
from specgen.apiargs import argument_names, token_ids
from specgen.chat import ChatFormatter, TemplateModel, load_template, prompt_tokens
from specgen.engine import Drafter, as_batch
from specgen.errors import ConfigError, EngineError, PromptError
from specgen.flags import SamplingFlags, in_python_words
from specgen.generate import FixedK, GenerateConfig, KPolicy, OneSlot, StartUp
from specgen.generation import Result, result_from
from specgen.sched.jobs import BatchReport, Deliver, DoesNotFit, Failed, Job, JobEvent
from specgen.sched.scheduler import Scheduler

__all__ = ["Engines", "Models", "generate_many", "one_slot"]


class Models(Protocol):
    """What a `Pair` generates with: `load`'s open `specgen.session.Session`, or engines
    loaded elsewhere (`Pair.of`)."""

    @property
    def target(self) -> TemplateModel: ...

    @property
    def drafter(self) -> Drafter | None: ...

    @property
    def draft_name(self) -> str:
        """The drafter as the reports name it (a file name, ``ngram`` or ``none``)."""
        ...

    def policy(self, draft_max: int | None) -> KPolicy:
        """The block-size policy for ``draft_max`` (None = auto)."""
        ...

    @property
    def start_up(self) -> StartUp:
        """The measurements the first generation with a drafter takes, kept for the later
        ones (the ordinary baseline, the controller's calibration)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Engines:
    """A target and a drafter loaded elsewhere (`Pair.of`): `close()` leaves them open
    (they are the caller's).

    Attributes:
        target: the target engine; drafter: its drafter, or None (ordinary decoding).
        k_init: the first block size of ``draft_max="auto"`` (None = the controller's).
        start_up: what the first generation with a drafter measured, for the later ones.
    """

    target: TemplateModel
    drafter: Drafter | None
    k_init: int | None = None
    start_up: StartUp = field(default_factory=StartUp, compare=False, repr=False)

    @property
    def draft_name(self) -> str:
        return "none" if self.drafter is None else self.drafter.name

    def policy(self, draft_max: int | None) -> KPolicy:
        """As `specgen.session.Session.policy`."""
        return _session.make_policy(draft_max, k_init=self.k_init)

    def close(self) -> None:
        pass


def fit_note(n_prompt: int, max_tokens: int, n_ctx: int) -> str | None:
    """What to say when the prompt plus -n cannot fit the context (None when they do):
    generation would stop early with finish reason "context": the prompt and the output
    together fit the context, as llama-server and the server count it."""
    room = n_ctx - n_prompt
    if n_prompt >= n_ctx or max_tokens <= room:
        return None  # a prompt that fills the context is refused with its own error
    return (
        f"the prompt ({n_prompt} token{'s' * (n_prompt != 1)}) plus -n {max_tokens} do not"
        f" fit the context of"
        f" {n_ctx}: generation stops after at most {room} tokens (raise -c to go further)"
    )


def warn_fit(n_prompt: int, max_tokens: int, n_ctx: int) -> None:
    """`fit_note` as a Python warning (`UserWarning`), named in the API's words: what the
    CLI prints as a note and the server refuses (400 context_length_exceeded)."""
    note = fit_note(n_prompt, max_tokens, n_ctx)
    if note is not None:
        warnings.warn(in_python_words(note), stacklevel=5)


def predicted(target: TemplateModel, text: str | None) -> list[int]:
    """A ``prediction``'s token ids (`GenerateConfig.prediction`): the text's own, no BOS
    (`specgen.chat.prompt_tokens`); [] for None or ""."""
    return prompt_tokens(target, text.encode("utf-8"), add_special=False) if text else []


def one_slot(
    opened: Models,
    ids: list[int],
    sampling: SamplingFlags,
    seed: int,
    trace: bool = False,
    ordinary: bool = False,
    reuse_cache: bool = False,
) -> OneSlot:
    """The generation for prompt token `ids` on an open session (`OneSlot.events()`: its
    events; `OneSlot.summary()`: the controller's choices, which the CLI's --json
    reports); `trace` attaches a `RoundTrace` to every Step; `ordinary` decodes with the
    target alone (K = 0); `reuse_cache` keeps what the caches hold of `ids` (a chat's
    earlier turns, `GenerateConfig.reuse_cache`). The passes a generation times at its
    start are timed once per `opened` (`Models.start_up`).

    Raises:
        PromptError: the prompt does not fit the context. GrammarError: the grammar or
            schema does not compile. ConfigError: a setting the engines refuse, or a
            fixed --draft-max with no drafter (not `ordinary`: the pair has none).
    """
    drafter = None if ordinary else opened.drafter
    if not ordinary:
        sampling.check_drafter(drafter is not None)
    # the baseline for the speedup and the controller's choices
    measure = 3 if drafter is not None else 0
    config = GenerateConfig.of(
        sampling, seed, measure_ordinary=measure, trace=trace, reuse_cache=reuse_cache,
        prediction=predicted(opened.target, sampling.prediction),
    )  # fmt: skip
    policy = FixedK(0) if ordinary else opened.policy(sampling.k)
    return OneSlot(opened.target, drafter, ids, config, policy, start_up=opened.start_up)


def chat_formatter(target: TemplateModel, path: str | Path | None, words: bool) -> ChatFormatter:
    """The target's chat template (or the file's at `path`), compiled; `words`: errors
    named as keyword arguments.

    Raises:
        ConfigError: no template (a base model) and no file; ChatTemplateError: a template
            that does not compile.
    """
    with argument_names() if words else contextlib.nullcontext():
        template = load_template(target, None if path is None else Path(path))
    if template is None:
        raise ConfigError(
            f"{target.name} has no chat template (a base model): pass"
            " chat_template=FILE, or use generate(), which continues the text as it is"
        )
    return ChatFormatter(template, target)


def prompt_ids(target: TemplateModel, prompt: object) -> list[int]:
    """A call's prompt as token ids: text (str or bytes, no chat template) tokenized by
    the target, or token ids checked against its vocabulary.

    Raises:
        PromptError: an empty prompt. ConfigError: ids outside the vocabulary, or a
            prompt that is neither text nor token ids.
    """
    if isinstance(prompt, str | bytes):
        text = prompt.encode("utf-8") if isinstance(prompt, str) else prompt
        if not text:
            raise PromptError("the prompt is empty")
        return prompt_tokens(target, text)
    ids = token_ids(prompt)
    if not ids:
        raise PromptError("the prompt is empty")
    if not all(0 <= t < target.n_vocab for t in ids):
        raise ConfigError(f"prompt token ids must be in [0, {target.n_vocab}) (the vocabulary)")
    return ids


def tokens_of(target: TemplateModel, text: str | bytes, add_special: bool) -> list[int]:
    """`Pair.tokenize`: `text`'s token ids as a prompt's (`specgen.chat.prompt_tokens`).
    Raises ConfigError for what is not str or bytes."""
    if not isinstance(text, str | bytes):
        raise ConfigError(f"text must be str or bytes, got {text!r:.60}")
    data = text.encode("utf-8") if isinstance(text, str) else text
    return prompt_tokens(target, data, add_special)


def text_of(target: TemplateModel, tokens: object) -> str:
    """`Pair.detokenize`: the text of token ids, bytes that are not UTF-8 as U+FFFD.

    Raises:
        ConfigError: not a list of ints, or ids outside the vocabulary.
    """
    try:
        ids = token_ids(tokens)
    except ConfigError:  # its message speaks of a prompt
        raise ConfigError(f"tokens must be a list of token ids, got {tokens!r:.60}") from None
    if not all(0 <= t < target.n_vocab for t in ids):
        raise ConfigError(f"token ids must be in [0, {target.n_vocab}) (the vocabulary)")
    return b"".join(map(target.token_bytes, ids)).decode("utf-8", "replace")


def prompts_ids(target: TemplateModel, prompts: Sequence[object]) -> list[list[int]]:
    """`prompt_ids` of each prompt; an error names the prompt's index.

    Raises:
        PromptError: no prompts, or an empty one. ConfigError: as `prompt_ids`.
    """
    if not prompts:
        raise PromptError("no prompts")
    out = []
    for i, prompt in enumerate(prompts):
        try:
            out.append(prompt_ids(target, prompt))
        except (PromptError, ConfigError) as e:
            kind = PromptError if isinstance(e, PromptError) else ConfigError
            raise kind(f"prompt {i}: {e}") from None
    return out


def generate_many(
    opened: Models,
    prompts: Sequence[list[int]],
    flags: SamplingFlags,
    seed: int,
    ordinary: bool = False,
) -> list[Result]:
    """Generate from every prompt (token ids) on the batch engine, as many at once as the
    models hold sequences (`specgen.load`'s ``n_parallel``), in the caller's thread.
    Prompt i is seeded ``seed + i``; each result is distributed as the target's own
    output under `flags`, whatever shares the batch (a batched decode's rows can differ
    from a single stream's in their last bits, so a seeded text may differ from
    `Pair.generate`'s with the same seed). `ordinary`: the target alone, K = 0.

    Raises:
        PromptError: a prompt plus ``max_tokens`` beyond a slot's context (-c).
        GrammarError: the grammar does not compile. EngineError: llama.cpp failed.
    """
    config = GenerateConfig.of(flags, seed, prediction=predicted(opened.target, flags.prediction))
    if config.grammar is not None:  # an error of the call, not of a job
        from specgen.grammar import compile_grammar, tokenizer_for

        compile_grammar(config.grammar, tokenizer_for(opened.target))
    target = as_batch(opened.target)
    drafter, k = (None, 0) if ordinary else (opened.drafter, flags.k)
    sched = Scheduler(target, drafter, n_parallel=target.n_seq, queue_max=len(prompts), draft_max=k)
    for slot in sched.slots.all:
        # from empty caches, as a single stream starts (`OneSlot`): the call's texts then
        # depend on its own settings and seed only
        slot.target.truncate(0)
        if slot.draft is not None:
            slot.draft.truncate(0)
    events: list[list[JobEvent]] = [[] for _ in prompts]
    for i, ids in enumerate(prompts):
        try:
            sched.submit(Job(str(i), ids, replace(config, seed=seed + i)), events[i].append)
        except DoesNotFit as exc:
            raise PromptError(f"prompt {i}: {exc}") from None
    if sched.controller is not None:
        sched.calibrate()  # the controller's cost lines, as `serve` does at start
    sched.run_until_idle()
    for got in events:
        failed = next((e for e in got if isinstance(e, Failed)), None)
        if failed is not None:
            raise EngineError(failed.message)
    asked = flags.logprobs is not None
    return [result_from(got, seed + i, asked) for i, got in enumerate(events)]


def make_scheduler(
    opened: Models,
    *,
    n_parallel: int | None,
    queue_max: int,
    draft_max: int | None,
    slo_ttft_s: float | None,
    slo_tpot_s: float | None,
    prompt_cache_mib: int,
    observer: Callable[[BatchReport], None] | None,
    deliver: Deliver | None,
) -> Scheduler:
    """`Pair.scheduler`'s batch engine over the open models (arguments as there).

    Raises:
        ConfigError: slo_ttft_s not above 0, or slo_tpot_s below 0.
        ValueError: as `Scheduler`.
    """
    from specgen.sched.promptcache import PromptCache

    if slo_ttft_s is not None and not slo_ttft_s > 0:
        raise ConfigError(f"slo_ttft_s must be more than 0 seconds, got {slo_ttft_s!r}")
    if slo_tpot_s is not None and not slo_tpot_s >= 0:
        raise ConfigError(f"slo_tpot_s must be 0 or more seconds, got {slo_tpot_s!r}")
    target = as_batch(opened.target)
    n = target.n_seq if n_parallel is None else n_parallel
    cache = None
    if prompt_cache_mib != 0:
        cache = PromptCache(None if prompt_cache_mib < 0 else prompt_cache_mib << 20)
    return Scheduler(
        target, opened.drafter, n_parallel=n, queue_max=queue_max, draft_max=draft_max,
        observer=observer, deliver=deliver, slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s,
        prompt_cache=cache,
    )  # fmt: skip
