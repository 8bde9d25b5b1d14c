"""What the user asked for, in two frozen shapes: which models and how to run them
(`ModelFlags`), and how to sample (`SamplingFlags`). Each is validated once, when built,
with messages that name the flag; the CLI builds them from Typer's values
(`specgen.cli.options`), the public API (`specgen.load`) from keyword arguments, and
`specgen.session.open` consumes them.

Cheap on purpose (no numpy, no llama.cpp): every command module imports it at start-up.
"""

from __future__ import annotations

import difflib
import math
import numbers
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specgen.errors import ConfigError
from specgen.logitbias import parse_logit_bias

if TYPE_CHECKING:
    from specgen.sampling import SamplingParams

#: the --draft values that name no model: ordinary decoding, and the model-free drafter
DRAFT_NONE = "none"
DRAFT_NGRAM = "ngram"
#: --draft auto: the smallest compatible GGUF already on disk (specgen.models.local)
DRAFT_AUTO = "auto"
DRAFT_WORDS = (DRAFT_NONE, DRAFT_NGRAM, DRAFT_AUTO)


@dataclass(frozen=True)
class ModelFlags:
    """Which models and how llama.cpp runs them (-m, -md, --pair, -ngl, -t, -c, ...).

    Attributes:
        target: -m, a GGUF path or a registry name; None with `draft` None = the demo pair.
        draft: -md, a GGUF path, a registry name, ``none`` (ordinary decoding) or
            ``ngram`` (prompt lookup); None = the demo draft or the pair's.
        pair: --pair, a registry pair name (not with `target`).
        models: --models, an extra models.yaml merged over the packaged and user ones.
        n_gpu_layers, n_gpu_layers_draft: -ngl / -ngld, layers on GPU (-1 = all).
        threads: -t, CPU threads (0 = the CPUs available).
        ctx_size: -c, context size in tokens (0 = the model's own).
        rpc: --rpc, ggml-rpc-server hosts ``HOST:PORT[,HOST:PORT...]`` for the target.
        swa_full: --swa-full, full-size cache for sliding-window layers.
        flash_attn: -fa/--flash-attn on|off|auto, llama.cpp's flash attention for both
            models (`specgen.llamacpp.EngineConfig.flash_attn`).
        draft_p_min: --draft-p-min, end a block when the draft's top probability is below
            it (0 to 1).
        lookup: --lookup on|off|auto beside a draft model (hybrid drafting, see
            `specgen.hybrid`); None = auto.

    Raises:
        ConfigError: naming the flag: a value of the wrong type (see `check_types`); -c or
            -t below 0, -ngl/-ngld below -1 (-1 = all layers), or a draft model (-md FILE)
            without -m (the draft must share the target's vocabulary; ``--draft none`` and
            ``--draft ngram`` alone run on the demo target, as they need no second model);
            --draft-p-min outside [0, 1]; -fa not on/off/auto; --lookup not on/off/auto;
            --lookup or a --draft-p-min above 0 with --draft ngram or none.
    """

    target: str | None = None
    draft: str | None = None
    pair: str | None = None
    models: Path | None = None
    n_gpu_layers: int = 0
    n_gpu_layers_draft: int = 0
    threads: int = 0
    ctx_size: int = 4096
    rpc: str | None = None
    swa_full: bool = False
    flash_attn: str = "auto"
    draft_p_min: float = 0.0
    lookup: str | None = None

    def __post_init__(self) -> None:
        check_types(self, MODEL_FLAG)
        if self.ctx_size < 0:
            raise ConfigError(
                f"-c/--ctx-size must be 0 (the model's own context) or more, got {self.ctx_size}"
            )
        if self.threads < 0:
            raise ConfigError(
                f"-t/--threads must be 0 (the CPUs available) or more, got {self.threads}"
            )
        for flag, n in (("-ngl", self.n_gpu_layers), ("-ngld", self.n_gpu_layers_draft)):
            if n < -1:
                raise ConfigError(f"{flag} must be -1 (all layers), 0 (CPU only) or more, got {n}")
        if self.draft is not None and not Path(self.draft).exists():
            near = difflib.get_close_matches(self.draft, DRAFT_WORDS, n=1, cutoff=0.75)
            if near and near[0] != self.draft:
                raise ConfigError(
                    f"-md {self.draft}: no such file; did you mean -md {near[0]}?"
                    f" (-md takes a GGUF file, a registry name, {', '.join(DRAFT_WORDS)})"
                )
        if (
            self.target is None
            and self.draft is not None
            and self.draft not in (DRAFT_NONE, DRAFT_NGRAM)
        ):
            raise ConfigError(
                f"-md {self.draft} needs -m too: give the target it drafts for"
                " (or neither, for the demo pair)"
            )
        if not 0.0 <= self.draft_p_min <= 1.0:
            raise ConfigError(
                f"--draft-p-min must be in [0, 1] (a probability), got {self.draft_p_min}"
            )
        if self.flash_attn not in ON_OFF_AUTO:
            raise ConfigError(f"--flash-attn must be on, off or auto, got {self.flash_attn!r}")
        if self.lookup is not None and self.lookup not in ON_OFF_AUTO:
            raise ConfigError(f"--lookup must be on, off or auto, got {self.lookup!r}")
        if self.draft_p_min > 0 and self.draft in (DRAFT_NGRAM, DRAFT_NONE):
            raise ConfigError(
                f"--draft-p-min stops a draft model's block at an unlikely token: --draft"
                f" {self.draft} has no draft model"
            )
        if self.lookup is not None and self.draft in (DRAFT_NGRAM, DRAFT_NONE):
            raise ConfigError(
                f"--lookup needs a draft model (-md FILE), not --draft {self.draft}"
                + (": --draft ngram is prompt lookup alone" if self.draft == DRAFT_NGRAM else "")
            )


@dataclass(frozen=True)
class SamplingFlags:
    """How to sample and when to stop (--temp, --top-k, --top-p, --min-p, --seed,
    --draft-max, -n, --stop, --ignore-eos); llama.cpp's meanings and defaults.

    Attributes:
        temp: temperature; 0 or below = greedy.
        top_k: 0 or below = off. top_p: 1 = off. min_p: 0 = off.
        seed: None or -1 = a random seed (see `seed_or_random`).
        draft_max: block size K as text (1 to 64), or ``auto`` (the adaptive controller).
        max_tokens: -n, tokens to generate at most (>= 1).
        stop: stop strings, cut exactly.
        ignore_eos: do not stop at end-of-generation tokens.
        min_tokens: no end before this many tokens (vLLM's ``min_tokens``; the Python
            API's and the server's, no flag: `specgen.genconfig.GenerateConfig`).
        prediction: text the output should contain (OpenAI's Predicted Outputs, the
            Python API's, no flag: `GenerateConfig.prediction`); None = none.
        verify: --verify block|token|auto, the acceptance rule (None = auto: see
            `verify_rule`).
        logit_bias: -l/--logit-bias, (token id, bias) pairs; given as llama.cpp's
            ``TOKEN_ID(+|-)BIAS`` strings (``15043+1``, ``15043-inf``), a mapping (the
            Python API's ``{15043: -100}``) or pairs (see `parse_logit_bias`).
        repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty: llama.cpp's
            penalties (`specgen.constraints.Constraints`; 1.0, 64, 0, 0 = off).
        logprobs: --logprobs N: each emitted token's log-probability under the target's
            raw logits, with the N most likely alternatives (0..20); None = none computed.
        grammar, grammar_file: --grammar TEXT / --grammar-file FILE, a GBNF grammar (or a
            Lark one) the output must match (llama-cli's flags).
        json_schema, json_schema_file: -j/--json-schema JSON / --json-schema-file FILE, a
            JSON Schema the output must follow; the Python API also takes a dict or a
            pydantic model class. At most one of the four (`specgen.grammarspec.spec_of`
            builds the grammar from them).

    Raises:
        ConfigError: naming the flag: a value of the wrong type (`check_types`: the Python
            API's ``temperature="hot"``), --temp not finite, --seed below -1, a bad
            --draft-max, -n below 1, an empty --stop string, a malformed --logit-bias
            (--top-p, --min-p and the penalties' ranges: see `params`).
    """

    temp: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int | None = None
    draft_max: str = "auto"
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    prediction: str | None = None
    verify: str | None = None
    logit_bias: Any = ()  # normalised to tuple[tuple[int, float], ...]
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None
    grammar: str | None = None
    grammar_file: Path | None = None
    json_schema: Any = None  # JSON text; the Python API: a dict or a pydantic model class
    json_schema_file: Path | None = None

    def __post_init__(self) -> None:
        check_types(self, SAMPLING_FLAG)
        check_sampling_flags(temp=self.temp)
        if self.seed is not None:
            _check_seed(self.seed)
        parse_draft_max(self.draft_max)
        at_least("-n", self.max_tokens, 1)
        object.__setattr__(self, "stop", check_stop_strings(self.stop))  # Typer: a list or None
        check_verify(self.verify)
        object.__setattr__(self, "logit_bias", parse_logit_bias(self.logit_bias))
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise ConfigError(
                f"--logprobs must be 0 to 20 (alternatives per token), got {self.logprobs}"
            )
        given = [
            flag
            for flag, value in (
                ("--grammar", self.grammar),
                ("--grammar-file", self.grammar_file),
                ("--json-schema", self.json_schema),
                ("--json-schema-file", self.json_schema_file),
            )
            if value is not None
        ]
        if len(given) > 1:
            raise ConfigError(f"{given[0]} and {given[1]} both constrain the output: give one")

    @property
    def verify_rule(self) -> str:
        """The acceptance rule: --verify's, or for auto "token" when greedy (the two rules
        coincide exactly there) and "block" at temperature > 0 (more accepted per target
        pass, measured: scripts/hybrid_bench.py, README)."""
        return verify_rule(self.verify, greedy=self.temp <= 0.0)

    @property
    def k(self) -> int | None:
        """--draft-max as a block size, or None for ``auto``."""
        return parse_draft_max(self.draft_max)

    def check_drafter(self, has_drafter: bool) -> None:
        """Refuse a fixed --draft-max where nothing drafts (--draft none): it would be
        ignored.

        Raises:
            ConfigError: naming --draft-max and its value.
        """
        if self.k and not has_drafter:
            raise ConfigError(
                f"--draft-max {self.draft_max} needs a drafter: with --draft none the target"
                " decodes alone (leave --draft-max out)"
            )

    @property
    def seed_given(self) -> bool:
        """Whether a seed was asked for (not None nor -1)."""
        return self.seed is not None and self.seed != -1

    def params(self) -> SamplingParams:
        """The warpers and the constraints (logit bias, penalties) for both p and q.

        Raises:
            ConfigError: --top-p outside [0, 1], --min-p outside [0, 1], a penalty or a
                bias out of its range (`specgen.constraints.Constraints`).
        """
        # start-up time: specgen.sampling loads numpy, which `specgen --help` must not
        from specgen.constraints import Constraints
        from specgen.sampling import SamplingParams

        constraints = Constraints(
            logit_bias=self.logit_bias,
            repeat_penalty=self.repeat_penalty,
            repeat_last_n=self.repeat_last_n,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
        )
        return SamplingParams(
            temp=self.temp, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
            constraints=constraints,
        )  # fmt: skip


#: each field's flag, for messages (the Python API renames them: `specgen.api`)
MODEL_FLAG = {
    "target": "-m",
    "draft": "-md",
    "pair": "--pair",
    "models": "--models",
    "n_gpu_layers": "-ngl",
    "n_gpu_layers_draft": "-ngld",
    "threads": "-t",
    "ctx_size": "-c",
    "rpc": "--rpc",
    "swa_full": "--swa-full",
    "flash_attn": "--flash-attn",
    "draft_p_min": "--draft-p-min",
    "lookup": "--lookup",
}
SAMPLING_FLAG = {
    "temp": "--temp",
    "top_k": "--top-k",
    "top_p": "--top-p",
    "min_p": "--min-p",
    "seed": "--seed",
    "draft_max": "--draft-max",
    "max_tokens": "-n",
    "stop": "--stop",
    "ignore_eos": "--ignore-eos",
    "min_tokens": "min_tokens",  # no flag: the Python API's and the server's
    "prediction": "prediction",  # no flag: the Python API's (the server's is a request field)
    "verify": "--verify",
    "logit_bias": "--logit-bias",
    "repeat_penalty": "--repeat-penalty",
    "repeat_last_n": "--repeat-last-n",
    "presence_penalty": "--presence-penalty",
    "frequency_penalty": "--frequency-penalty",
    "logprobs": "--logprobs",
    "grammar": "--grammar",
    "grammar_file": "--grammar-file",
    "json_schema": "--json-schema",
    "json_schema_file": "--json-schema-file",
}

#: the flags, as the Python API's arguments (and the server's request fields) call them
_ARGUMENT_OF_FLAG = {
    **{flag: name for name, flag in MODEL_FLAG.items()},
    "--target": "target",
    "--draft": "draft",
    **{flag: name for name, flag in SAMPLING_FLAG.items()},
    "--temp": "temperature",
    "--chat-template": "chat_template",
    # `specgen verify`'s own (`Pair.verify`'s arguments)
    "--samples": "samples",
    "--positions": "positions",
    "--alpha": "alpha",
    "--check": "check",
    "--prompt": "prompts",
}
_FLAG = re.compile(r"(?<![\w-])--?[a-z][a-z-]*")
_DRAFT_WORD = re.compile(rf"(?<![\w-])(?:-md|--draft) ({'|'.join(DRAFT_WORDS)})\b")
#: a flag's short and long names together (``-t/--threads``): one argument
_FLAG_PAIR = re.compile(r"(?<![\w-])(-[a-z]+)/--[a-z][a-z-]*")


def in_python_words(message: str) -> str:
    """A CLI error message with each flag named as the Python API's argument (``--top-p``
    -> ``top_p``, ``--temp`` -> ``temperature``); flags without one are left as they are."""
    message = _DRAFT_WORD.sub(lambda m: f'draft="{m[1]}"', message)
    message = _FLAG_PAIR.sub(lambda m: m[1] if m[1] in _ARGUMENT_OF_FLAG else m[0], message)
    return _FLAG.sub(lambda m: _ARGUMENT_OF_FLAG.get(m[0], m[0]), message)


#: what a value of each annotated type must be, in words
_KIND_WORDS = {
    "float": "a number",
    "int": "an integer",
    "bool": "True or False",
    "str": "text",
    "Path": "a path",
    "tuple[str, ...]": "a string or a list of strings",
}


class _Mismatch(Exception):
    pass


def check_types(flags: Any, flag_of: Mapping[str, str]) -> None:
    """Refuse a value of the wrong type in a frozen flags dataclass, naming the flag, and
    conform the ones that are close enough: an int where a float goes, a str where a
    ``Path`` goes, one string where strings go (``stop="\\n"``), None for an empty list.
    Typer hands over the right types already; this is for the Python API, whose keyword
    arguments are anything (``temperature="hot"`` would otherwise be a bare TypeError deep
    in the sampler, or worse, work by accident). Fields typed ``Any`` are checked by their
    own parser.

    Raises:
        ConfigError: ``--temp must be a number, got 'hot'`` (`flag_of` names the flag).
    """
    for f in fields(flags):
        kind = str(f.type)
        value = getattr(flags, f.name)
        optional = kind.endswith(" | None")
        kind = kind.removesuffix(" | None")
        if kind == "Any" or (optional and value is None):
            continue
        try:
            conformed = _conform(kind, value)
        except _Mismatch:
            words = _KIND_WORDS.get(kind, kind) + (" or None" if optional else "")
            got = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
            raise ConfigError(f"{flag_of[f.name]} must be {words}, got {got}") from None
        if conformed is not value:
            object.__setattr__(flags, f.name, conformed)


def _conform(kind: str, value: Any) -> Any:
    if kind == "bool":
        if isinstance(value, bool):
            return value
    elif isinstance(value, bool):
        pass  # True is an int to Python, never a temperature or a token count here
    elif kind == "float" and isinstance(value, numbers.Real):
        return value if isinstance(value, float) else float(value)
    elif kind == "int" and isinstance(value, numbers.Integral):
        return value if isinstance(value, int) else int(value)
    elif kind == "str" and isinstance(value, str):
        return value
    elif kind == "Path" and isinstance(value, str | os.PathLike):
        return value if isinstance(value, Path) else Path(value)
    elif kind == "tuple[str, ...]":
        if value is None:
            return ()
        items = (value,) if isinstance(value, str) else value
        if isinstance(items, list | tuple) and all(isinstance(x, str) for x in items):
            return tuple(items) if type(items) is not tuple else items
    raise _Mismatch


def check_sampling_flags(*, temp: float) -> None:
    """Refuse a temperature that means nothing (top-p and min-p are checked by
    ``specgen.sampling.SamplingParams``). Negative temperatures are greedy, as in llama.cpp.

    Raises:
        ConfigError: --temp not a finite number.
    """
    if not math.isfinite(temp):
        raise ConfigError(f"--temp must be a number (0 or below = greedy), got {temp}")


def check_stop_strings(stop: list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """The --stop strings as a tuple, refusing an empty one (it would match before the
    first token, so nothing could ever be generated).

    Raises:
        ConfigError: naming the flag.
    """
    stops = tuple(stop or ())
    if any(s == "" for s in stops):
        raise ConfigError('--stop needs a non-empty string (--stop "" would end at once)')
    return stops


def at_least(flag: str, value: int, least: int) -> None:
    """Refuse a count below its least value, naming the flag.

    Raises:
        ConfigError: "FLAG must be at least LEAST, got VALUE" ("must be 0 or more" when
            `least` is 0).
    """
    if value < least:
        bound = "0 or more" if least == 0 else f"at least {least}"
        raise ConfigError(f"{flag} must be {bound}, got {value}")


def seed_or_random(seed: int | None) -> int:
    """The seed to use: ``seed`` itself, or a random one for None or -1 (llama.cpp's
    "random seed", ``LLAMA_DEFAULT_SEED``).

    Raises:
        ConfigError: a seed below -1.
    """
    if seed is None or seed == -1:
        return secrets.randbits(31)
    _check_seed(seed)
    return seed


def _check_seed(seed: int) -> None:
    if seed < -1:
        raise ConfigError(f"--seed must be -1 (random) or 0 or more, got {seed}")


def parse_draft_max(value: str) -> int | None:
    """`--draft-max`: a block size K >= 1, or `auto` (None: the adaptive controller).
    Raises ConfigError for anything else."""
    if value == "auto":
        return None
    what = "--draft-max must be an integer (1 to 64) or 'auto', got"
    try:
        k = int(value)
    except ValueError:
        raise ConfigError(f"{what} {value!r}") from None
    if not 1 <= k <= 64:
        hint = ": for ordinary decoding (the target alone), --draft none" if k == 0 else ""
        raise ConfigError(f"{what} {k}{hint}")
    return k


#: the values of --lookup and -fa/--flash-attn
ON_OFF_AUTO = ("on", "off", "auto")
VERIFY_VALUES = ("block", "token", "auto")


def check_verify(verify: str | None) -> None:
    """Raises ConfigError for a --verify value that is not block, token or auto."""
    if verify is not None and verify not in VERIFY_VALUES:
        raise ConfigError(f"--verify must be block, token or auto, got {verify!r}")


def verify_rule(verify: str | None, greedy: bool) -> str:
    """--verify resolved: "block" or "token" as given; auto (None) is "token" when greedy
    and "block" otherwise (see `SamplingFlags.verify_rule`)."""
    check_verify(verify)
    if verify in ("block", "token"):
        return verify
    return "token" if greedy else "block"
