"""The arguments of the Python API's calls (`specgen.Pair`), checked once and named as the
caller passed them: keyword settings as a `SamplingFlags`, a prompt, chat messages."""

from __future__ import annotations

import difflib
import numbers
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import fields, replace

from specgen.chat import Message
from specgen.errors import ConfigError, PromptError
from specgen.flags import SamplingFlags, in_python_words


@contextmanager
def argument_names() -> Iterator[None]:
    """A `ConfigError` or `PromptError` raised inside, its flags named as the Python API's
    arguments ("raise -c": "raise ctx_size")."""
    try:
        yield
    except ConfigError as exc:  # GrammarError stays one
        raise type(exc)(in_python_words(str(exc))) from exc
    except PromptError as exc:
        if type(exc) is not PromptError:  # ContextFullError speaks for chat_session already
            raise
        raise PromptError(in_python_words(str(exc))) from exc


def sampling_flags(
    settings: Mapping[str, object],
    base: SamplingFlags | None = None,
    switches: Mapping[str, object] | None = None,
    others: Sequence[str] = (),
) -> SamplingFlags:
    """A call's keyword settings as the CLI's `SamplingFlags` (``temperature`` is --temp's
    ``temp``; ``draft_max`` an int or "auto"), over `base` when given (its fields where
    `settings` has none; the defaults otherwise), validated once; `switches`: the call's
    other arguments that must be True or False (``ordinary``, ``trace``); `others`: the
    call's own keyword arguments, offered beside the settings for a misspelt name.

    Raises:
        ConfigError: an unknown setting (with the nearest known name), or a bad value,
            named as the argument (``temperature must be a number, got 'hot'``); a `base`
            that is not a `SamplingFlags` (``generate("hi", "x")``); a switch that is
            not a bool.
    """
    if base is not None and not isinstance(base, SamplingFlags):
        raise ConfigError(
            f"settings (the argument after the prompt) must be a SamplingFlags or None, got"
            f" {base!r}: give the settings as keyword arguments (temperature=0, ...)"
        )
    for name, value in (switches or {}).items():
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be True or False, got {value!r}")
    given = dict(settings)
    if "temperature" in given:
        if "temp" in given:
            raise ConfigError("temperature and temp are the same setting: give one")
        given["temp"] = given.pop("temperature")
    known = [f.name for f in fields(SamplingFlags)]
    for name in given:
        if name not in known:
            names = [*known, "temperature", *others]
            near = difflib.get_close_matches(name, names, n=1)
            hint = (
                f" (did you mean {near[0]}?)" if near else f": the settings are {', '.join(names)}"
            )
            raise ConfigError(f"unknown setting {name!r}{hint}")
    draft_max = given.get("draft_max")
    what = "draft_max must be an integer (1 to 64) or 'auto', got"
    if _is_int(draft_max) and int(draft_max) == 0:  # type: ignore[call-overload]
        raise ConfigError(f"{what} 0: for ordinary decoding (the target alone), ordinary=True")
    if _is_int(draft_max):  # numpy's too, as the other integer settings take them
        given["draft_max"] = str(int(draft_max))  # type: ignore[call-overload]
    elif "draft_max" in given and not isinstance(draft_max, str):
        raise ConfigError(f"{what} {draft_max!r}")
    with argument_names():
        if base is not None:
            return replace(base, **given) if given else base  # type: ignore[arg-type]
        return SamplingFlags(**given)  # type: ignore[arg-type]


#: a prompt: text (bytes are UTF-8), or token ids as the target's tokenizer gives them
Prompt = str | bytes | Sequence[int]


def _is_int(value: object) -> bool:
    """An integer, numpy's included; True is an int to Python, never a count here."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def token_ids(prompt: object) -> list[int]:
    """A prompt of token ids as a list of ints: a sequence of integers (numpy's too), or a
    1-D numpy array.

    Raises:
        ConfigError: anything else (a 2-D array, floats, bools...).
    """
    if not isinstance(prompt, Sequence) and callable(getattr(prompt, "tolist", None)):
        prompt = prompt.tolist()  # type: ignore[attr-defined]  # a numpy array
    ids = list(prompt) if isinstance(prompt, Sequence) else None
    if ids is None or not all(_is_int(t) for t in ids):
        raise ConfigError(f"prompt must be text (str or bytes) or token ids, got {prompt!r:.60}")
    return [int(t) for t in ids]


#: the roles a message may have (OpenAI's, as the server's schema takes them)
ROLES = ("system", "developer", "user", "assistant", "tool")


def check_messages(messages: object) -> list[Message]:
    """`messages` as the chat template takes them: a non-empty list of mappings, each with
    a ``role`` (one of `ROLES`) and a ``content`` string (other keys, such as
    ``tool_calls``, pass through).

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
        if m["role"] not in ROLES:
            raise ConfigError(
                f"messages[{i}]: role must be {', '.join(ROLES[:-1])} or {ROLES[-1]},"
                f" got {m['role']!r}"
            )
        out.append(dict(m))
    return out


def prompt_list(prompts: object) -> list[object]:
    """`Pair.generate_many`'s prompts as a list: one text or one list of token ids is not
    a list of prompts (iterating it would give one prompt per character or per token).

    Raises:
        ConfigError: `prompts` is a str, bytes, or a sequence of ints, or not iterable.
    """
    if isinstance(prompts, (str, bytes)) or (
        isinstance(prompts, Sequence) and prompts and all(_is_int(p) for p in prompts)
    ):
        raise ConfigError(
            "prompts must be a list of prompts, got one prompt: for one, use generate() (or"
            " pass [prompt])"
        )
    try:
        return list(prompts)  # type: ignore[call-overload]
    except TypeError:
        raise ConfigError(f"prompts must be a list of prompts, got {prompts!r}") from None
