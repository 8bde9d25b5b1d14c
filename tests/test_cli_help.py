"""`--help` of every command names each option's value (`-m GGUF|NAME`, `--temp T`) and never
shows a Python type (`<list[str]>`, `<bool>`, `<int>`)."""

from __future__ import annotations

import inspect
import re
from typing import Annotated

import pytest
from typer.testing import CliRunner

from specgen.cli.app import app
from specgen.cli.options import MODEL, SAMPLING, ModelFlags, SamplingFlags, grouped
from specgen.errors import ConfigError

COMMANDS = [
    ["run"],
    ["chat"],
    ["serve"],
    ["models"],
    ["download"],
    ["bench"],
    ["verify"],
    ["trace", "summarize"],
    ["trace"],
]
PYTHON_TYPE = re.compile(r"<[a-z][a-z_\[\], |]*>")


def _help(args: list[str], env: dict[str, str] | None = None) -> str:
    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "200", **(env or {})})
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_help_shows_value_names_not_python_types(args: list[str]) -> None:
    out = _help(args)
    assert not PYTHON_TYPE.search(out), PYTHON_TYPE.findall(out)
    rows = {line.split()[1]: line for line in out.splitlines() if line.startswith("│ --")}
    assert rows["--help"].split()[2] == "Show"  # a flag shows no value at all
    if "--target" in rows:
        assert "GGUF|NAME" in rows["--target"]
    if "--ctx-size" in rows:
        assert re.search(r"-c\s+N\s", rows["--ctx-size"])


def test_named_values_read_like_llama_cpp() -> None:
    rows = {line.split()[1]: line.split() for line in _help(["run"]).splitlines()
            if line.startswith("│ --")}  # fmt: skip
    assert rows["--temp"][2] == "T" and rows["--stop"][2] == "STR"
    assert rows["--draft-max"][2] == "K|auto" and rows["--ignore-eos"][2] == "Do"
    for command, flag, name in [(["verify"], "--draft-max", "K"), (["verify"], "--check",
                                "all|greedy|sampling"), (["bench"], "--draft-max", "K[,K...]")]:  # fmt: skip
        row = next(line for line in _help(command).splitlines() if line.startswith(f"│ {flag} "))
        assert row.split()[2] == name  # what the command takes: verify's K is no "auto"
    usage = next(line for line in _help(["run"]).splitlines() if "Usage:" in line)
    assert usage.rstrip().endswith("[PROMPT]")


def test_a_grouped_command_sees_each_group_as_its_options_and_gets_one_object() -> None:
    seen: dict[str, object] = {}

    @grouped
    def command(
        n: int = 1,
        *,
        model: Annotated[ModelFlags, MODEL.only("target", "ctx_size")],
        sampling: Annotated[SamplingFlags, SAMPLING.only("temp", "seed").but(temp=0.0)],
    ) -> None:
        seen.update(n=n, model=model, sampling=sampling)

    params = inspect.signature(command).parameters  # what Typer reads
    assert list(params) == ["n", "target", "ctx_size", "temp", "seed"]
    assert params["temp"].default == 0.0 and params["ctx_size"].default == 4096
    command(n=2, target="t.gguf", ctx_size=512, temp=0.5, seed=None)
    assert seen == {
        "n": 2,
        "model": ModelFlags(target="t.gguf", ctx_size=512),
        "sampling": SamplingFlags(temp=0.5),
    }
    with pytest.raises(ConfigError, match="-c/--ctx-size must be 0"):
        command(n=1, target=None, ctx_size=-1, temp=0.0, seed=None)


def test_an_options_type_and_default_are_its_fields_and_a_cli_shape_declares_its_own() -> None:
    from dataclasses import dataclass, fields

    from specgen.cli.options import Group, flag, opt

    @dataclass(frozen=True)
    class Shape:
        count: int = 7
        names: tuple[str, ...] = flag("--name", default=(), kind=list[str] | None,
                                      cli_default=None, help="Repeatable.")  # fmt: skip
        label: str | None = flag("--label", "-L", default="x", help="A label.")

    group = Group(Shape, count=opt("--count", help="How many."))
    params = {p.name: p for p in group.parameters()}
    assert params["count"].default == 7 and params["count"].annotation.__origin__ is int
    assert group.but(count=3).parameters()[0].default == 3
    declared = {p.name: p for p in Group.of(Shape).parameters()}
    assert list(declared) == ["names", "label"]  # the fields that declare an option
    assert declared["names"].default is None  # Typer's default for a repeated option
    assert Group.of(Shape).options["label"].names == ("--label", "-L")
    assert [f.default for f in fields(Shape)] == [7, (), "x"]  # the shape's own defaults
    built = Group.of(Shape).build({"names": ["a"], "label": None})
    assert built == Shape(names=["a"], label=None)  # type: ignore[arg-type]
