"""-l/--logit-bias and OpenAI's ``logit_bias`` read into one shape: (token id, bias) pairs.

Cheap on purpose (no numpy, no llama.cpp), as `specgen.flags`, its one importer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specgen.errors import ConfigError


def parse_logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """-l/--logit-bias as (token id, bias) pairs, in the order given (ranges are checked by
    `specgen.constraints.Constraints`).

    Accepts llama.cpp's strings ``TOKEN_ID(+|-)BIAS`` (common/arg.cpp: ``15043+1``,
    ``15043-1``, ``15043-inf``), a mapping of token id (an int, or its decimal string as
    OpenAI's JSON has it) to bias, or (token id, bias) pairs; None is none.

    Raises:
        ConfigError: naming the flag and the entry that is malformed.
    """
    if value is None:
        return ()
    items = list(value.items()) if isinstance(value, Mapping) else list(value)
    out: list[tuple[int, float]] = []
    for item in items:
        if isinstance(item, str):
            out.append(_logit_bias_entry(item))
            continue
        try:
            token, bias = item
            out.append((_token_id(token), float(bias)))
        except (TypeError, ValueError):
            raise ConfigError(f"--logit-bias needs (token id, bias) pairs, got {item!r}") from None
    return tuple(out)


def _token_id(token: Any) -> int:
    if isinstance(token, bool) or not isinstance(token, int | str):
        raise ValueError(token)
    return int(token)


def _logit_bias_entry(text: str) -> tuple[int, float]:
    """One llama.cpp ``TOKEN_ID(+|-)BIAS`` string."""
    head = text.strip()
    digits = len(head) - len(head.lstrip("0123456789"))
    sign, rest = head[digits : digits + 1], head[digits + 1 :]
    try:
        if digits == 0 or sign not in ("+", "-") or not rest:
            raise ValueError(text)
        bias = float(rest)
    except ValueError:
        raise ConfigError(
            f"--logit-bias must be TOKEN_ID(+|-)BIAS, e.g. 15043+1 or 15043-inf, got {text!r}"
        ) from None
    return int(head[:digits]), -bias if sign == "-" else bias
