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
            "(python -m specgen.cli.reference) and commit it\n" + diff[:4000]
        )


def test_the_field_table_is_what_the_server_table_gives() -> None:
    page = (DOCS / "reference" / "http.md").read_text(encoding="utf-8")
    assert page == reference.with_fields_table(page), (
        "the table of request fields in docs/reference/http.md differs from "
        "specgen/server/fields.py: run `make docs-ref` (python -m specgen.cli.reference) "
        "and commit it"
    )


def test_every_field_of_the_server_table_has_a_row() -> None:
    from specgen.server.fields import FIELDS

    page = (DOCS / "reference" / "http.md").read_text(encoding="utf-8")
    missing = [name for name in FIELDS if f"| `{name}` |" not in page]
    assert not missing, f"request fields without a row in docs/reference/http.md: {missing}"


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


def _fields_of_the_http_schemas() -> dict[str, set[str]]:
    """Every field name of the request and response models, by model name."""
    import dataclasses
    import inspect

    from pydantic import BaseModel

    from specgen.server import schemas, stats

    out: dict[str, set[str]] = {}
    for name, obj in vars(schemas).items():
        if (
            inspect.isclass(obj)
            and issubclass(obj, BaseModel)
            and obj.__module__ == schemas.__name__
        ):
            out[name] = set(obj.model_fields)
    for cls in (stats.Timings, stats.Speculative):
        out[cls.__name__] = {f.name for f in dataclasses.fields(cls)}
    return out


def test_every_http_field_is_in_the_http_reference() -> None:
    page = (DOCS / "reference" / "http.md").read_text(encoding="utf-8")
    requests = page[page.index("## Request fields") : page.index("### Compatibility")]
    responses = page[page.index("## Responses") :]
    fields = _fields_of_the_http_schemas()
    assert "ChatCompletionRequest" in fields and "Speculative" in fields  # the walk found them
    missing = []
    for model, names in fields.items():
        for field in sorted(names):
            if model.endswith("Request") or model == "_Generation":  # a row in the request table
                found = f"| `{field}` |" in requests
            elif model in (
                "ChatMessage", "ContentPart", "StreamOptions", "ResponseFormat",
                "JsonSchemaFormat", "FunctionCall", "ToolCall", "FunctionDef", "Tool",
                "NamedFunction", "ToolChoiceNamed", "StructuredOutputs",
            ):  # fmt: skip
                found = f"`{field}`" in requests or f"`{field.rstrip('_')}`" in requests
            else:
                found = f"`{field}`" in responses
            if not found:
                missing.append(f"{model}.{field}")
    assert not missing, (
        f"fields of specgen/server/schemas.py not in docs/reference/http.md: {missing}"
    )


def test_every_metric_is_in_the_metrics_reference() -> None:
    from specgen.server.metrics import Metrics

    page = (DOCS / "reference" / "metrics.md").read_text(encoding="utf-8")
    names = []
    for family in Metrics().registry.collect():
        # as a scrape shows them: counters with _total
        names.append(family.name + ("_total" if family.type == "counter" else ""))
    assert len(names) > 10
    missing = [n for n in names if f"`{n}`" not in page]
    assert not missing, (
        f"metrics of specgen/server/metrics.py not in docs/reference/metrics.md: {missing}"
    )


def test_the_field_check_catches_a_missing_field() -> None:
    # the check above reads backquoted names: a field written without them does not count
    fields = _fields_of_the_http_schemas()
    page = "`messages` max_tokens"
    found = {f for f in fields["ChatCompletionRequest"] if f"`{f}`" in page}
    assert found == {"messages"}


def test_every_stats_key_is_in_the_json_reference() -> None:
    from specgen.events import Stats

    page = (DOCS / "reference" / "json.md").read_text(encoding="utf-8")
    keys = list(Stats().to_dict())
    missing = [k for k in keys if f"`{k}`" not in page]
    assert not missing, f"keys of run --json's stats not in docs/reference/json.md: {missing}"


def test_every_measurement_page_states_machine_date_commit_and_command() -> None:
    import re

    pages = sorted((DOCS / "measurements").glob("*.md"))
    assert len(pages) > 3
    bad = []
    for page in pages:
        if page.name == "index.md":
            continue
        text = page.read_text(encoding="utf-8").lower()
        has = {
            "machine": "machine" in text,
            "date": re.search(r"\b20\d\d-\d\d-\d\d\b", text) is not None,
            "commit": re.search(r"\bcommit\b[^\n]*\b[0-9a-f]{7,40}\b", text) is not None,
            "command": "command" in text,
        }
        bad += [f"{page.name}: no {what}" for what, ok in has.items() if not ok]
    assert not bad, "a measurement page states its machine, date, commit and command: " + str(bad)


def test_the_generator_takes_help_for_no_docs_folder(tmp_path, monkeypatch, capsys) -> None:
    # `python -m specgen.cli.reference --help` had written --help/reference/cli.md
    from specgen.cli import reference

    monkeypatch.chdir(tmp_path)
    assert reference.main(["--help"]) == 0 and reference.main(["-x"]) == 2
    assert "usage:" in capsys.readouterr().out and list(tmp_path.iterdir()) == []
