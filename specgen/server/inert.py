"""When a refused field asks for nothing because of the fields sent beside it (`When`), and
llama-server's spellings of what OpenAI's fields already say (`normalized`).

Clients send whole presets: SillyTavern's text-completion presets carry DRY, XTC and
Mirostat settings with the sampler switched off, and text-generation-webui's, TabbyAPI's,
KoboldCpp's and Ollama's names for ``max_tokens`` or ``repeat_penalty`` beside those
fields; llama.cpp's web UI sends ``samplers`` (its default chain), ``max_tokens: -1`` and
``logit_bias: []``. Each of these asks for nothing this server does not do, so refusing
it would make the client unusable, while a value that does ask for something (DRY on, a
sampler order that is not the chain this server runs) is still refused
(`specgen.server.fields`).

Sources: llama.cpp's ``common_sampler_types_from_names`` / ``_from_chars``
(``common/sampling.cpp``: names, their aliases, unknown names skipped) and the default
chain of ``common_params_sampling``; ``tools/server/server-schema.cpp`` for ``samplers``,
``logit_bias`` and ``n_predict``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Beside:
    """What a rule reads besides the field's value: `inert` (field name, value) -> whether
    that value of that field asks for nothing (not sent: None), and `thinks`, whether the
    chat template served writes reasoning (`specgen.server.tools.TemplateTools.thinks`)."""

    inert: Callable[[str, Any], bool]
    thinks: bool = False


@dataclass(frozen=True)
class When:
    """A rule under which a refused field's value asks for nothing, read with the body's
    other fields: ``test(value, body, beside)``; `says` completes "values accepted: ..."
    in the 400 and the docs' table."""

    test: Callable[[Any, Mapping[str, Any], Beside], bool]
    says: str
    reads: tuple[str, ...] = ()  # the other fields it reads


def off(switch: str) -> When:
    """Any value while `switch`, the field that turns its sampler on, is absent or inert
    (``dry_base`` while ``dry_multiplier`` is 0)."""
    return When(
        lambda _v, body, beside: beside.inert(switch, body.get(switch)),
        f"any while {switch} is off",
        (switch,),
    )


def same(*names: str) -> When:
    """A client's alias that repeats the value of one of `names` sent beside it
    (SillyTavern's ``max_new_tokens`` beside ``max_tokens``)."""

    def test(value: Any, body: Mapping[str, Any], _beside: Beside) -> bool:
        return any(n in body and type(body[n]) is type(value) and body[n] == value for n in names)

    return When(test, f"the value of {' or '.join(names)} sent beside it", names)


CHAIN = ("penalties", "top_k", "top_p", "min_p", "temperature")
"""The samplers this server runs, in its order (`specgen.sampling`; logit bias first)."""

_NAMES = (
    "dry", "top_k", "top_p", "top_n_sigma", "typ_p", "min_p", "temperature", "xtc", "infill",
    "penalties", "adaptive_p",
)  # fmt: skip
_ALIASES = {
    **{n: n for n in _NAMES},
    **{n.replace("_", "-"): n for n in _NAMES if "_" in n},
    **{n.replace("_", ""): n for n in _NAMES if "_" in n},
    "nucleus": "top_p", "temp": "temperature", "typ": "typ_p",
}  # fmt: skip
_CHARS = {
    "d": "dry", "k": "top_k", "y": "typ_p", "p": "top_p", "s": "top_n_sigma", "m": "min_p",
    "t": "temperature", "x": "xtc", "i": "infill", "e": "penalties", "a": "adaptive_p",
}  # fmt: skip
# a sampler outside the chain that its own fields can switch off
_OFF = {
    "dry": ("dry_multiplier",),
    "top_n_sigma": ("top_n_sigma",),
    "typ_p": ("typ_p", "typical_p"),
    "xtc": ("xtc_probability",),
}
# a sampler of the chain that the request's own values make do nothing
_NEUTRAL: dict[str, tuple[tuple[str, tuple[Any, ...]], ...]] = {
    "penalties": (
        ("repeat_penalty", (1, 1.0)),
        ("presence_penalty", (0, 0.0)),
        ("frequency_penalty", (0, 0.0)),
    ),
    "top_k": (("top_k", (0,)),),
    "top_p": (("top_p", (1, 1.0)),),
    "min_p": (("min_p", (0, 0.0)),),
}


def _named(value: Any) -> list[str] | None:
    """llama-server's reading of ``samplers``: names (any case, with their aliases) or a
    string of one character each; unknown ones are skipped, as llama-server skips them."""
    if isinstance(value, str):
        return [_CHARS[c] for c in value if c in _CHARS]
    if isinstance(value, list) and all(isinstance(n, str) for n in value):
        return [_ALIASES[n.lower()] for n in value if n.lower() in _ALIASES]
    return None


def _default_chain(value: Any, body: Mapping[str, Any], beside: Beside) -> bool:
    names = _named(value)
    if names is None or len(set(names)) != len(names):
        return False
    kept = []
    for name in names:
        if name in _OFF and all(beside.inert(f, body.get(f)) for f in _OFF[name]):
            continue  # switched off by its own fields
        if name not in CHAIN:
            return False  # a sampler this server does not run (infill, adaptive_p, DRY on)
        kept.append(name)
    if kept != [n for n in CHAIN if n in kept]:
        return False  # another order: top-p or min-p after temperature keeps other tokens
    # a sampler of the chain left out is off in llama-server: so must it be here
    return all(
        n in kept
        or (n in _NEUTRAL and all(type(body.get(f)) in (int, float) and body.get(f) in v
                                  for f, v in _NEUTRAL[n]))
        for n in CHAIN
    )  # fmt: skip


DEFAULT_CHAIN = When(
    _default_chain,
    "the chain this server runs, in its order (penalties, top_k, top_p, min_p,"
    " temperature; each may be left out where the request's own values turn it off, and"
    " DRY, XTC, typical-p and top-n-sigma may be named while their fields turn them off)",
)


NO_REASONING = When(
    lambda value, _body, beside: value == "auto" and not beside.thinks,
    "\"auto\" (llama.cpp's web UI's default) for a chat template that writes no <think> reasoning",
)
"""``reasoning_format: "auto"`` asks for no parsing where the template writes no reasoning."""


def normalized(body: Any) -> Any:
    """`body` with llama-server's spellings as OpenAI's: ``max_tokens`` (or
    ``max_completion_tokens``) -1, "no limit", dropped, so the server's own limit applies
    as when it is not sent; ``logit_bias`` as llama-server's list of ``[token id, bias]``
    pairs given as OpenAI's object (an empty list: none). Anything else is left as it is,
    for validation to take or refuse."""
    if not isinstance(body, dict):
        return body
    out = {
        k: v
        for k, v in body.items()
        if not (k in ("max_tokens", "max_completion_tokens") and type(v) is int and v == -1)
    }
    bias = out.get("logit_bias")
    if isinstance(bias, list) and all(
        isinstance(p, list) and len(p) == 2 and type(p[0]) is int
        and type(p[1]) in (int, float)
        for p in bias
    ):  # fmt: skip
        out["logit_bias"] = {str(t): float(b) for t, b in bias}
    return out
