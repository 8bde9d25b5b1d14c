"""Every option's value named in `--help` as llama.cpp names it (`-m GGUF|NAME`, `--temp T`),
and flags with none.

This Typer prints an option's Python type where it has no metavar (`--stop <list[str]>`,
`--json <bool>`, even `--help <bool>`), and an argument's type beside its name. `Command`
fills in the names at help time, from ``METAVARS`` by long option name, else from the
value's type, so that no command or shared option needs to spell them out.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

#: the value names of options, by long name (options that take no value show none)
METAVARS = {
    "--target": "GGUF|NAME",
    "--draft": "GGUF|NAME|auto",
    "--pair": "NAME",
    "--models": "FILE",
    "--max-tokens": "N",
    "--temp": "T",
    "--top-k": "N",
    "--top-p": "P",
    "--min-p": "P",
    "--logit-bias": "TOKEN_ID(+|-)BIAS",
    "--repeat-penalty": "X",
    "--repeat-last-n": "N",
    "--presence-penalty": "X",
    "--frequency-penalty": "X",
    "--logprobs": "N",
    "--grammar": "GBNF",
    "--grammar-file": "FILE",
    "--json-schema": "JSON",
    "--json-schema-file": "FILE",
    "--seed": "N",
    "--draft-max": "K|auto",
    "--draft-p-min": "P",
    "--stop": "STR",
    "--n-gpu-layers": "N",
    "--n-gpu-layers-draft": "N",
    "--rpc": "HOST:PORT[,...]",
    "--threads": "N",
    "--ctx-size": "N",
    "--trace": "FILE.jsonl",
    "--system": "TEXT",
    "--chat-template": "FILE",
    "--revision": "REV",
    "--prompts": "FILE.jsonl",
    "--runs": "N",
    "--json": "FILE.json",
    "--markdown": "FILE.md",
    "--plot": "FILE.png",
    "--compare": "FILE.json",
    "--samples": "N",
    "--positions": "N",
    "--alpha": "A",
    "--check": "all|greedy|sampling",
    "--prompt": "TEXT",
    "--top": "N",
    # bench --url (the load client): vLLM's `bench serve` names where it has them
    "--url": "URL",
    "--label": "NAME",
    "--concurrency": "N[,N...]",
    "--request-rate": "R[,R...]",
    "--burstiness": "B",
    "--num-prompts": "N",
    "--warmup": "N",
    "--endpoint": "chat|completions",
    "--slo": "ttft=MS,tpot=MS",
    "--kind": "KIND[,...]",
    "--timeout": "S",
    "--api-key": "KEY",
    "--verify": "block|token|auto",
    "--lookup": "on|off|auto",
    "--flash-attn": "on|off|auto",
    # serve: llama-server's names
    "--host": "HOST",
    "--port": "PORT",
    "--parallel": "N",
    "--queue": "N",
    "--alias": "NAME",
    "--cors": "ORIGIN",
}
_BY_TYPE = {"integer": "N", "float": "X", "path": "PATH"}


def _value_name(param: Any) -> str:
    long = next((o for o in param.opts if o.startswith("--")), "")
    # this Typer's own click keeps no `type` on a parameter: fall back on the name alone
    kind = getattr(getattr(param, "type", None), "name", "")
    return METAVARS.get(long) or _BY_TYPE.get(kind, "TEXT")


def _name(param: Any) -> None:
    if isinstance(param, TyperOption) and param.metavar is None:
        param.metavar = "" if param.is_flag or param.count else _value_name(param)
    elif isinstance(param, TyperArgument):
        param.metavar = param.metavar or param.name.upper()
        # the argument's name is its value name: no Python type beside it
        param.display_type_rich = lambda ctx: None  # type: ignore[method-assign]


class _Named:
    """Names each option's value at help time (see the module); mixed into click's
    command and group classes."""

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)  # type: ignore[misc]
        for p in params:
            _name(p)
        return params


class Command(_Named, TyperCommand):
    """A Typer command whose help names each option's value."""


class Group(_Named, TyperGroup):
    """The top-level group, whose own options (`--version`, `--help`) are named alike."""


def name_values(app: typer.Typer) -> None:
    """Make every command registered on ``app`` (and its sub-apps) a :class:`Command`."""
    for info in app.registered_commands:
        if info.cls in (None, TyperCommand):
            info.cls = Command
    for group in app.registered_groups:
        if group.typer_instance is not None:
            name_values(group.typer_instance)
