"""The README as a newcomer reads it: short, no commit hashes, links that resolve, and examples
that run as written: every `specgen` command line in the README and the docs' shell blocks
parses against the real command-line app (flags, values, arguments; nothing is loaded), the
Python blocks compile and use names the package exports, and `specgen --version` runs."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from specgen.cli.app import app

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def _blocks(path: Path, *langs: str) -> list[str]:
    return [m.group(2) for m in _FENCE.finditer(path.read_text("utf-8")) if m.group(1) in langs]


def _command_lines(block: str) -> list[list[str]]:
    """The `specgen ...` commands of a shell block, as argument lists (no `specgen`)."""
    text = re.sub(r"\\\n\s*", " ", block)  # continuation lines
    out = []
    for line in text.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:  # a quote opened for a multi-line argument (python -c '...')
            words = shlex.split(line.split("'", 1)[0], comments=True)
        cmd: list[str] | None = None
        for w in [*words, "|"]:
            if w in ("|", "&&", ";", "&", "||") or w.startswith((">", "<", "2>")):
                if cmd is not None:
                    out.append(cmd)
                cmd = None
            elif cmd is not None:
                cmd.append(w)
            elif w == "specgen":
                cmd = []
    return out


def _rest(ctx: typer.Context) -> list[str]:
    # a group's context keeps the subcommand's name apart from its arguments (`protected_args`
    # in older Click, `_protected_args` in the Click this Typer vendors)
    protected = getattr(ctx, "_protected_args", None) or getattr(ctx, "protected_args", [])
    return [*protected, *ctx.args]


def _parse(args: list[str]) -> None:
    """Parse `specgen ARGS` as Click would, invoking nothing (raises on a bad command line)."""
    root = typer.main.get_command(app)
    ctx = root.make_context("specgen", list(args), resilient_parsing=False)
    rest = _rest(ctx)
    cmd, path = root, ["specgen"]
    while rest and hasattr(cmd, "list_commands"):
        name, rest = rest[0], rest[1:]
        sub = cmd.get_command(ctx, name)
        assert sub is not None, f"no command {name!r} in `{' '.join(path)}`"
        cmd, path = sub, [*path, name]
        ctx = cmd.make_context(name, list(rest), parent=ctx)
        rest = _rest(ctx) if hasattr(cmd, "list_commands") else []


def _all_commands() -> list[tuple[str, list[str]]]:
    found = []
    for page in PAGES:
        for block in _blocks(page, "sh", "bash"):
            for args in _command_lines(block):
                found.append((f"{page.relative_to(ROOT)}: specgen {shlex.join(args)}", args))
    return found


COMMANDS = _all_commands()


def test_the_readme_is_short_and_has_no_commit_hashes() -> None:
    text = README.read_text("utf-8")
    assert len(text.splitlines()) <= 250
    hashes = re.findall(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", text)
    assert not hashes, f"commit hashes belong on measurement pages, not the README: {hashes}"


def test_the_readme_has_its_quick_starts() -> None:
    lines = [args[0] for name, args in COMMANDS if name.startswith("README") and args]
    for command in ("run", "chat", "serve"):
        assert command in lines, f"no `specgen {command}` example in the README"
    assert any("specgen.load(" in b for b in _blocks(README, "python"))


def test_the_readme_and_the_docs_have_specgen_command_lines() -> None:
    # the extraction itself: a page's examples found, a pipe and a comment handled
    assert len(COMMANDS) > 40
    assert _command_lines("cat p.txt | specgen run -n 8 > out.txt  # a comment\n") == [
        ["run", "-n", "8"]
    ]


@pytest.mark.parametrize("where,args", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_every_command_line_parses(where: str, args: list[str]) -> None:
    try:
        _parse(args)
    except (typer.Exit, SystemExit):  # --version, --help: eager options that end parsing
        pass
    except Exception as e:  # noqa: BLE001 - name the example that does not parse
        pytest.fail(f"{where}\n  does not parse: {type(e).__name__}: {e}")


def test_a_bad_command_line_is_caught() -> None:
    # the check can fail: a mistyped flag, a value where none goes, an unknown command
    for bad in (["run", "--tmep", "0"], ["run", "-n", "many"], ["serv"]):
        with pytest.raises(Exception) as e:
            _parse(bad)
        assert not isinstance(e.value, typer.Exit)


def test_the_python_examples_compile_and_use_exported_names() -> None:
    import specgen

    blocks = [b for p in PAGES for b in _blocks(p, "python")]
    assert blocks
    for block in blocks:
        compile(block, "<docs example>", "exec")
        for name in re.findall(r"\bspecgen\.([A-Za-z_]+)\b", block):
            if name not in ("errors", "sampling", "trace"):  # modules named in prose
                assert hasattr(specgen, name), f"specgen.{name} in a docs example"


def test_the_readme_links_resolve() -> None:
    text = README.read_text("utf-8")
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if "://" not in target:
            assert (ROOT / target).exists(), f"README links to a missing {target}"


def test_every_command_keeps_its_examples_block() -> None:
    root = typer.main.get_command(app)
    ctx = typer.Context(root, info_name="specgen")

    def leaves(cmd: object, c: typer.Context) -> list[tuple[str, object]]:
        out = []
        for name in cmd.list_commands(c):  # type: ignore[attr-defined]
            sub = cmd.get_command(c, name)  # type: ignore[attr-defined]
            if hasattr(sub, "list_commands"):
                out += leaves(sub, typer.Context(sub, info_name=name, parent=c))
            else:
                out.append((name, sub))
        return out

    missing = [n for n, c in leaves(root, ctx) if "Examples:" not in (c.epilog or "")]  # type: ignore[attr-defined]
    assert not missing, f"commands whose --help lost its examples block: {missing}"


def test_specgen_version_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "specgen", "--version"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and out.stdout.startswith("specgen "), out.stderr
