"""A request body pydantic refused (`specgen.server.schemas`' models), said as one line
and the ``param`` of OpenAI's error body."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ValidationError, model_validator

NEAR = 0.8
"""How close (difflib's ratio) an unknown field's name must be to a known field that changes
the output to be taken for a misspelling of it and refused."""


def near(name: str, known: Iterable[str]) -> str | None:
    """The one of `known` that `name` (a field not among them) is a likely misspelling of
    (`NEAR`), or None."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=NEAR)
    return close[0] if close else None


def misspelt(name: str, known: str) -> str:
    """The 400's message for an unknown top-level field `name` near the field `known`."""
    return (
        f"unknown field {name}: did you mean {known}? A misspelt setting would be served as"
        " if it had not been sent, so the request is refused (a field whose name is near"
        " none this server knows is ignored)"
    )


class NoNearMisses(BaseModel):
    """A request object inside the body (a message, a tool, a format): keys it does not
    read are ignored, except one whose name is near one it reads (`NEAR`: ``paramters``,
    ``contnt``, ``shema``), which would be served as if it had not been sent, so it is
    refused, naming both (the path is the object's)."""

    @model_validator(mode="before")
    @classmethod
    def _no_near_misses(cls, data: Any) -> Any:
        if isinstance(data, dict):
            known = {f.alias or name for name, f in cls.model_fields.items()}
            for key in data:
                if isinstance(key, str) and key not in known:
                    close = near(key, known)
                    if close is not None:
                        raise ValueError(f"unknown field {key!r}: did you mean {close!r}?")
        return data


def validation_error(e: ValidationError) -> tuple[str, str | None]:
    """One line and the `param` for the first problem pydantic found.

    Returns:
        (message, param): param is the field's path (``messages[0].role``), None for a
        body that is no JSON object.
    """
    errors = e.errors(include_url=False)
    first, whole = errors[0], errors[0].get("input")
    if isinstance(whole, dict):  # an object member of a union says what is wrong inside it
        wrong_kind = ("literal_error", "model_type", "string_type", "list_type", "int_type")
        inside = (x for x in errors if x.get("input") is not whole or x["type"] not in wrong_kind)
        first = next(inside, first)
    if first["type"] == "refused_field":
        return str(first["msg"]), str(first["ctx"]["param"])
    if first["type"] == "json_invalid":
        return f"the request body is not valid JSON: {first['ctx']['error']}", None
    loc = [p for p in first["loc"] if not _is_type_tag(p)]
    if not loc:
        return f"the request body must be a JSON object: {first['msg']}", None
    param = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    msg = str(first["msg"]).removeprefix("Value error, ")
    if first["type"] == "missing":
        return f"{param} is required", param
    return f"{param}: {msg}", param


def _is_type_tag(part: object) -> bool:
    # pydantic names the union member it tried (`str`, `list[int]`, `ToolChoiceNamed`): not
    # part of the path (every field's name is lower case)
    return isinstance(part, str) and (
        part in ("str", "int", "float", "bool")
        or part[:1].isupper()
        or part.startswith(("list[", "dict[", "literal[", "function-"))
    )
