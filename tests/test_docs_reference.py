"""The reference pages cannot drift from the code: the command-line page is generated from the
Typer app and must equal what the generator writes now; every field of the HTTP schemas and
every metric name the server registers appears in its page."""

from __future__ import annotations

import difflib
from pathlib import Path

from specgen.cli import reference

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def test_the_cli_reference_is_what_the_generator_writes() -> None:
    committed = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    generated = reference.render()
    if committed != generated:
        diff = "".join(
            difflib.unified_diff(
                committed.splitlines(keepends=True),
                generated.splitlines(keepends=True),
                "docs/reference/cli.md (committed)",
                "docs/reference/cli.md (from the code)",
                n=1,
            )
        )
        raise AssertionError(
            "docs/reference/cli.md differs from the commands: run `make docs-ref` "
            "(python -m specgen.cli.reference docs/reference/cli.md) and commit it\n" + diff[:4000]
        )


def test_every_flag_of_every_command_is_in_the_cli_reference() -> None:
    # Independent of the generator: each option name Click knows appears in the page.
    import typer

    from specgen.cli.app import app

    page = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    root = typer.main.get_command(app)
    missing: list[str] = []

    def walk(cmd: object, path: list[str], parent: object | None) -> None:
        ctx = typer.Context(cmd, info_name=path[-1], parent=parent)  # type: ignore[arg-type]
        for p in cmd.get_params(ctx):  # type: ignore[attr-defined]
            for opt in [*p.opts, *p.secondary_opts]:
                if opt.startswith("-") and opt != "--help" and f"`{opt}`" not in page:
                    missing.append(f"{' '.join(path)} {opt}")
        if hasattr(cmd, "list_commands"):
            for name in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, name), [*path, name], ctx)
                if f"## `{' '.join([*path, name])}`" not in page and not hasattr(
                    cmd.get_command(ctx, name), "list_commands"
                ):
                    missing.append(" ".join([*path, name]))

    walk(root, ["specgen"], None)
    assert not missing, f"not in docs/reference/cli.md (run `make docs-ref`): {missing}"
