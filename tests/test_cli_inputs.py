"""Bad inputs refused in one place (`specgen.cli.options`), and the values llama.cpp users
type that mean something (-1 seeds, negative temperatures): in-process through `main`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from specgen.flags import ModelFlags


def _main(argv: list[str]) -> int:
    from specgen.cli.app import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    return int(exc.value.code or 0)


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("specgen: error: "), err
    return lines[0]


@pytest.mark.parametrize("command", ["run", "bench", "verify", "serve"])
@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["-c", "-5"], "-c/--ctx-size"),
        (["-t", "-1"], "-t/--threads"),
        (["-ngl", "-2"], "-ngl"),
        (["-ngld", "-3"], "-ngld"),
        (["--seed", "-2"], "--seed"),
    ],
)
def test_bad_shared_flags_are_refused_naming_the_flag(
    capsys, tiny_target, command, flags, needle
) -> None:
    # refused before any model is loaded or stdin read (pytest's stdin raises on read)
    code = _main([command, "-m", str(tiny_target), "-md", "ngram", *flags])
    line = _one_error_line(capsys)
    assert code == 1 and needle in line, line


@pytest.mark.parametrize("command", ["run", "bench"])
@pytest.mark.parametrize("value", ["1.5", "-0.1"])
def test_draft_p_min_must_be_a_probability(capsys, tiny_target, command, value) -> None:
    code = _main([command, "-m", str(tiny_target), "-md", "ngram", "--draft-p-min", value])
    line = _one_error_line(capsys)
    assert code == 1 and "--draft-p-min" in line and value in line


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_temperature_must_be_a_number(capsys, tiny_target, value) -> None:
    code = _main(["run", "-m", str(tiny_target), "-md", "none", "--temp", value, "x"])
    line = _one_error_line(capsys)
    assert code == 1 and "--temp" in line


@pytest.mark.parametrize("value", ["21", "-1"])
def test_logprobs_out_of_range_is_an_error_not_a_usage_box(capsys, tiny_target, value) -> None:
    # exit 1 and one line, as every other range (it was Typer's exit 2 and usage box)
    code = _main(["run", "-m", str(tiny_target), "-md", "none", "--json", "--logprobs", value])
    line = _one_error_line(capsys)
    assert code == 1 and "--logprobs must be 0 to 20" in line


def test_an_empty_stop_string_is_refused(capsys, tiny_target) -> None:
    # it would match before the first token: nothing could ever be generated
    code = _main(["run", "-m", str(tiny_target), "-md", "none", "--stop", "ok", "--stop", ""])
    line = _one_error_line(capsys)
    assert code == 1 and "--stop" in line and "non-empty" in line


@pytest.mark.parametrize("command", ["run", "bench", "verify", "serve"])
def test_a_draft_model_needs_a_target(capsys, tiny_draft, command) -> None:
    code = _main([command, "-md", str(tiny_draft)])
    line = _one_error_line(capsys)
    assert code == 1 and "needs -m" in line and str(tiny_draft) in line


@pytest.mark.parametrize(
    ("typo", "meant"), [("ngramx", "ngram"), ("nonw", "none"), ("atuo", "auto")]
)
def test_a_misspelt_draft_word_is_pointed_out(capsys, tmp_path, typo, meant) -> None:
    # without -m the typo would be taken for a model that needs a target; with one, for a
    # model name; either way the message would not say what was wrong
    for argv in (["run", "-md", typo, "x"], ["run", "-m", "t.gguf", "-md", typo, "x"]):
        code = _main(argv)
        line = _one_error_line(capsys)
        assert code == 1 and f"did you mean -md {meant}?" in line, line
    (tmp_path / typo).write_bytes(b"")  # a file of that name is a model path, not a typo
    assert ModelFlags(target="t.gguf", draft=str(tmp_path / typo)).draft == str(tmp_path / typo)


def test_a_missing_target_is_said_before_the_missing_draft(capsys, tmp_path) -> None:
    code = _main(["run", "-m", str(tmp_path / "missing.gguf"), "x"])
    line = _one_error_line(capsys)
    assert code == 1 and "missing.gguf: no such file" in line and "--draft" not in line


def test_model_free_drafts_run_on_the_demo_target_without_m() -> None:
    # `--draft none` / `ngram` need no second model, so they keep working without -m
    for draft in ("none", "ngram", None):
        flags = ModelFlags(target=None, draft=draft, ctx_size=0, threads=0, n_gpu_layers=-1)
        assert flags.target is None and flags.draft == draft


def _run_json(capsys, argv: list[str]) -> dict:
    code = _main(["run", "--json", *argv])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def test_seed_minus_one_is_a_random_seed(capsys, tiny_target: Path) -> None:
    args = ["-m", str(tiny_target), "-md", "none", "-c", "256", "-n", "2", "--seed", "-1"]
    seeds = {_run_json(capsys, [*args, "the cat"])["seed"] for _ in range(2)}
    assert all(isinstance(s, int) and s >= 0 for s in seeds)
    assert len(seeds) == 2  # two random 31-bit seeds: equal with probability 2**-31


def test_negative_temperature_is_greedy(capsys, tiny_target: Path, tiny_draft: Path) -> None:
    args = ["-m", str(tiny_target), "-md", str(tiny_draft), "-c", "256", "-n", "16"]
    args += ["--ignore-eos", "--draft-max", "3"]
    greedy = _run_json(capsys, [*args, "--temp", "0", "--seed", "1", "the cat"])
    negative = _run_json(capsys, [*args, "--temp", "-1", "--seed", "2", "the cat"])
    assert negative["tokens"] == greedy["tokens"]
    sampled = _run_json(capsys, [*args, "--temp", "1.5", "--top-k", "0", "--seed", "2", "the cat"])
    assert sampled["tokens"] != greedy["tokens"]  # the comparison can fail: sampling differs


def test_help_says_what_negative_values_mean() -> None:
    from typer.testing import CliRunner

    from specgen.cli.app import app

    out = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200"}).output
    assert "0 or below = greedy" in out and "-1 or omitted = random" in out


def test_a_truncated_gguf_says_so_with_its_size(
    capsys, truncated_gguf: Path, tiny_target: Path
) -> None:
    code = _main(["run", "-m", str(truncated_gguf), "-md", "none", "x"])
    line = _one_error_line(capsys)
    full = tiny_target.stat().st_size
    assert code == 1 and "is truncated" in line
    assert f"{truncated_gguf.stat().st_size:,} bytes, its header implies {full:,}" in line
    assert "failed to load model" not in line  # llama.cpp's last line says nothing


def test_a_directory_is_not_a_model(capsys, tmp_path: Path, tiny_target: Path) -> None:
    (tmp_path / "a.gguf").write_bytes(b"")
    code = _main(["run", "-m", str(tmp_path), "-md", "none", "x"])
    line = _one_error_line(capsys)
    assert code == 1 and "is a directory, not a GGUF file" in line and "a.gguf" in line
    assert "more" not in line and "…" not in line
    for name in "bcdefg":
        (tmp_path / f"{name}.gguf").write_bytes(b"")
    _main(["run", "-m", str(tmp_path), "-md", "none", "x"])
    line = _one_error_line(capsys)  # 3 of 7 named, and the cut said with its count
    assert "a.gguf, b.gguf, c.gguf, … and 4 more: give one of them" in line
    code = _main(["run", "-m", str(tiny_target), "-md", str(tmp_path / "sub"), "x"])
    assert code == 1 and "no such file" in _one_error_line(capsys)


# -- what llama.cpp does differently from what was asked: said once on stderr -------------------


def _tiny_run(capsys, tiny_target: Path, *args: str) -> tuple[dict, list[str]]:
    code = _main(["run", "--json", "-m", str(tiny_target), "-md", "none", *args])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out), out.err.splitlines()


def test_a_rounded_context_is_said_once(capsys, tiny_target: Path) -> None:
    out, err = _tiny_run(capsys, tiny_target, "-c", "64", "-n", "2", "the cat")
    notes = [ln for ln in err if "-c 64" in ln]
    assert notes == ["specgen: note: -c 64 became 256: llama.cpp rounds the context up to a"
                     " multiple of 256"]  # fmt: skip
    _, err = _tiny_run(capsys, tiny_target, "-c", "256", "-n", "2", "the cat")
    assert err == []


def test_a_tiny_context_still_takes_a_whole_block(capsys, tiny_target: Path, tiny_draft) -> None:
    """-c 16 is padded to 256 cells; the batch follows the padded context, not the 16
    asked (a block of K = 16 was "17 tokens exceed one batch of 16" mid-generation)."""
    code = _main(["run", "--json", "-m", str(tiny_target), "-md", str(tiny_draft), "-c", "16",
                  "--draft-max", "16", "-n", "40", "--temp", "0", "--ignore-eos", "the cat"])  # fmt: skip
    out = capsys.readouterr()
    assert code == 0, out.err
    stats = json.loads(out.out)["stats"]
    assert stats["n_generated"] == 40 and max(stats["k_history"]) == 16, stats


def test_a_full_context_is_its_own_finish_reason_and_warned_at_the_start(
    capsys, tiny_target: Path
) -> None:
    prompt = "the cat " * 50
    out, err = _tiny_run(capsys, tiny_target, "-c", "256", "-n", "400", "--ignore-eos", prompt)
    n_prompt = out["stats"]["n_prompt"]
    assert out["finish_reason"] == "context"
    assert len(out["tokens"]) == 256 - n_prompt
    assert len(err) == 1 and "do not fit the context of 256" in err[0]
    assert f"at most {256 - n_prompt} tokens" in err[0]
    # -n that fits: no warning, and the limit is -n's
    out, err = _tiny_run(capsys, tiny_target, "-c", "256", "-n", "3", "--ignore-eos", prompt)
    assert out["finish_reason"] == "length" and err == []


def test_gpu_layers_on_a_cpu_build_are_said_to_be_ignored(capsys, tiny_target: Path) -> None:
    from specgen import llamacpp

    out, err = _tiny_run(capsys, tiny_target, "-c", "256", "-n", "2", "-ngl", "99", "the cat")
    assert out["backend"] == llamacpp.backend()
    if llamacpp.supports_gpu_offload():
        assert err == []
    else:
        assert len(err) == 1 and err[0].startswith("specgen: note: -ngl ignored")
        assert 'CMAKE_ARGS="-DGGML_CUDA=on"' in err[0]
        guide = Path(__file__).parents[1] / "docs" / "guides" / "gpu.md"
        assert err[0].split("with: ")[1] in guide.read_text("utf-8")  # the guide's command


def test_the_live_summary_names_the_backend_and_a_full_context() -> None:
    from rich.console import Console

    from specgen.ui.state import ViewState
    from specgen.ui.text import render_summary

    state = ViewState("t.gguf", "d.gguf", backend="CPU", finish_reason="context")
    console = Console(width=120, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(render_summary(state))
    text = console.export_text()
    assert "target t.gguf · draft d.gguf · on CPU" in text
    assert "context full (raise -c" in text


# -- where the prompt comes from ----------------------------------------------------------------


def test_a_prompt_that_is_a_file_name_hints_at_redirection(
    capsys, tmp_path: Path, tiny_target: Path
) -> None:
    path = tmp_path / "prompt.txt"
    path.write_text("the cat", encoding="utf-8")
    out, err = _tiny_run(capsys, tiny_target, "-c", "256", "-n", "2", str(path))
    assert len(err) == 1 and f"< {path}" in err[0]
    assert out["stats"]["n_prompt"] > 3  # the path's own text was the prompt, as documented
    _, err = _tiny_run(capsys, tiny_target, "-c", "256", "-n", "2", "the cat")
    assert err == []


def test_a_terminal_on_stdin_is_told_where_the_prompt_comes_from(tiny_target: Path) -> None:
    import select
    import subprocess
    import sys
    import time

    master, slave = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "specgen", "run", "--json", "-m", str(tiny_target), "-md", "none",
         "-c", "256", "-n", "2"],
        stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    os.close(slave)
    try:
        # the note comes before stdin is read: wait for it, then type a prompt and Ctrl-D
        deadline = time.monotonic() + 300  # never reached when well: a wait, not a bound
        err = b""
        fd = proc.stderr.fileno()  # type: ignore[union-attr]
        while b"Ctrl-D" not in err and time.monotonic() < deadline:
            if select.select([fd], [], [], 1.0)[0]:
                err += os.read(fd, 4096)
        os.write(master, b"the cat\n\x04")
        out, rest = proc.communicate(timeout=120)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    assert b"reading the prompt from stdin" in err, err + rest
    assert proc.returncode == 0, rest
    assert json.loads(out)["stats"]["n_prompt"] >= 3


# -- bench checks every path before measuring ---------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "where", "needle"),
    [
        ("--compare", "missing.json", "--compare: cannot read"),
        ("--compare", "not_bench.json", "not a specgen bench JSON file"),
        ("--json", "nodir/b.json", "--json: no such directory"),
        ("--markdown", "nodir/b.md", "--markdown: no such directory"),
        ("--trace", "nodir/t.jsonl", "--trace: no such directory"),
        ("--json", ".", "is a directory"),
        ("--json", "ro/b.json", "--json: cannot write"),
    ],
)
def test_bench_checks_every_path_before_measuring(
    capsys, monkeypatch, tmp_path: Path, tiny_target, tiny_draft, flag, where, needle
) -> None:
    from specgen import bench

    (tmp_path / "not_bench.json").write_text('{"format": "something else"}', encoding="utf-8")
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    if where.startswith("ro/") and os.access(ro, os.W_OK):
        pytest.skip("running as a user who can write anywhere (root)")

    def measured(*a, **k):
        raise AssertionError("measured before checking the paths")

    monkeypatch.setattr(bench, "bench", measured)
    code = _main(["bench", "-m", str(tiny_target), "-md", str(tiny_draft),
                  flag, str(tmp_path / where)])  # fmt: skip
    line = _one_error_line(capsys)
    assert code == 1 and needle in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not_bench.json", "ro"]


def test_run_checks_the_trace_path_before_reading_the_prompt(capsys, tmp_path, tiny_target):
    code = _main(["run", "-m", str(tiny_target), "-md", "none",
                  "--trace", str(tmp_path / "nodir" / "t.jsonl")])  # fmt: skip
    assert code == 1 and "--trace: no such directory" in _one_error_line(capsys)


@pytest.mark.parametrize(
    ("command", "flags", "needle"),
    [
        ("run", ["--raw", "--system", "Be brief."], "--raw sends the prompt as it is"),
        ("run", ["--raw", "--chat-template", "ok.jinja"], "--raw sends the prompt as it is"),
        ("run", ["--chat-template", "missing.jinja"], "--chat-template: cannot read"),
        ("chat", ["--chat-template", "missing.jinja"], "--chat-template: cannot read"),
        ("serve", ["--chat-template", "missing.jinja"], "--chat-template: cannot read"),
        ("run", ["--chat-template", "empty.jinja"], "the file is empty"),
        ("run", ["-md", "none", "--draft-max", "8"], "--draft-max 8 needs a drafter"),
        ("chat", ["-md", "none", "--draft-max", "8"], "--draft-max 8 needs a drafter"),
        ("verify", ["--prompt", "A", "--prompt", ""], "--prompt: a prompt is empty"),
    ],
)
def test_conflicting_prompt_and_draft_flags_are_refused_before_loading(
    capsys, monkeypatch, tmp_path, command, flags, needle
) -> None:
    # no model fixture: the model files are never opened (the fast suite runs this)
    from specgen import session

    (tmp_path / "ok.jinja").write_text("{{ messages[0]['content'] }}", encoding="utf-8")
    (tmp_path / "empty.jinja").write_text("\n", encoding="utf-8")

    def loaded(*a, **k):
        raise AssertionError("the models were loaded before the flags were checked")

    monkeypatch.setattr(session, "open", loaded)
    flags = [str(tmp_path / f) if f.endswith(".jinja") else f for f in flags]
    draft = [] if "-md" in flags else ["-md", str(tmp_path / "draft.gguf")]
    code = _main([command, "-m", str(tmp_path / "target.gguf"), *draft, *flags, *(
        ["hello"] if command == "run" else [])])  # fmt: skip
    line = _one_error_line(capsys)
    assert code == 1 and needle in line, line


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
def test_a_trace_that_cannot_be_written_names_its_file(capsys, tiny_target) -> None:
    # /dev/full passes the path's check (a file can be created in /dev as root, and a
    # device is a fine --trace: /dev/stdout); its writes fail, and "No space left on
    # device" alone named no file
    code = _main(["run", "-m", str(tiny_target), "-md", "none", "-n", "2",
                  "--trace", "/dev/full", "hello"])  # fmt: skip
    line = _one_error_line(capsys)
    assert code == 1 and "cannot write the trace" in line and "/dev/full" in line, line


@pytest.mark.parametrize("command", ["run", "bench"])
def test_a_trace_onto_a_model_or_another_output_is_refused(capsys, tmp_path, command) -> None:
    # `--trace` onto the -m file truncated the model under llama.cpp's mapping (SIGBUS),
    # and bench's --json silently replaced a --trace of the same name
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 60)
    link = tmp_path / "link.jsonl"
    link.symlink_to(model)
    for trace in (model, link):
        draft = "none" if command == "run" else "ngram"
        code = _main([command, "-m", str(model), "-md", draft, "--trace", str(trace),
                      *(["hello"] if command == "run" else [])])  # fmt: skip
        line = _one_error_line(capsys)
        assert code == 1 and "--trace and -m name the same file" in line, line
    assert model.read_bytes() == b"GGUF" + b"\0" * 60
    if command == "bench":
        same = str(tmp_path / "same.json")
        code = _main(["bench", "-m", str(model), "-md", "ngram", "--trace", same, "--json", same])
        line = _one_error_line(capsys)
        assert code == 1 and "--trace and --json name the same file" in line, line


# -- what stays on a terminal -------------------------------------------------------------------


def test_show_rejected_leaves_the_clean_text_and_the_legend(monkeypatch) -> None:
    import io

    from rich.console import Console
    from rich.text import Text

    from specgen.events import Done, Span, Step
    from specgen.ui.live import LiveView
    from specgen.ui.state import ViewState

    c = Console(record=True, width=40, height=20, force_terminal=True, file=io.StringIO())
    kept: list[str] = []  # what is printed for good (the live region is redrawn apart)
    real = c.print

    def spy(*objects, **kw):
        if objects and all(isinstance(o, Text) for o in objects):
            kept.append("".join(o.plain for o in objects))
        real(*objects, **kw)

    monkeypatch.setattr(c, "print", spy)
    st = ViewState("t.gguf", "d.gguf", show_rejected=True)
    words = [f"w{i} " + ("\n" if i % 5 == 4 else "") for i in range(40)]
    with LiveView(c, st, clock=lambda: 0.0, min_interval_s=0.0) as view:
        for i, w in enumerate(words):
            # an accepted draft token, then the target's own after rejecting "XQ"
            spans = (Span(w[:2], 2 * i, True), Span(w[2:], 2 * i + 1, False))
            view.update(
                Step(k=2, n_proposed=2, n_drafted=2, n_accepted=1, spans=spans,
                     rejected_text="XQ", draft_s=0.0, verify_s=0.0, sample_s=0.0, round_s=0.01)
            )  # fmt: skip
        live_phase = c.export_text(clear=False)
        view.update(Done("length", "".join(words), (), st.stats))
    assert "XQ" in live_phase  # shown while generating
    text_end = next(i for i, k in enumerate(kept) if "accepted draft" in k)
    on_screen = "\n".join(kept[:text_end])
    assert "XQ" not in on_screen  # never in the text left on screen
    assert on_screen.split() == "".join(words).split()
    assert "rejected" not in kept[text_end]  # the legend stays, for what stays
    assert kept[text_end].startswith("accepted draft (d.gguf)")


def test_plain_text_on_a_terminal_ends_with_a_newline_a_pipe_stays_exact(
    capsys, tiny_target: Path
) -> None:
    import select
    import subprocess
    import sys

    args = ["-m", str(tiny_target), "-md", "none", "-c", "256", "-n", "6", "--temp", "0"]
    args += ["--ignore-eos", "the cat"]
    ref, _ = _tiny_run(capsys, tiny_target, *args[4:])
    assert not ref["text"].endswith("\n")  # else this test could not see the difference
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "specgen", "run", "--no-live", *args],
        stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.PIPE,
    )  # fmt: skip
    os.close(slave)
    out = b""
    try:
        while True:
            if select.select([master], [], [], 60)[0]:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
    finally:
        os.close(master)
        proc.wait(timeout=60)
    assert proc.returncode == 0
    assert out.decode("utf-8") == (ref["text"] + "\n").replace("\n", "\r\n")  # the tty's CRLF
    piped = subprocess.run(
        [sys.executable, "-m", "specgen", "run", *args], capture_output=True, timeout=120
    )
    assert piped.stdout.decode("utf-8") == ref["text"]


def test_version() -> None:
    from typer.testing import CliRunner

    import specgen
    from specgen import __version__
    from specgen.cli.app import app

    r = CliRunner().invoke(app, ["--version"])
    here = Path(specgen.__file__).resolve().parent
    assert r.exit_code == 0 and r.output.startswith(f"specgen {__version__} from {here} (")


def test_implied_size_is_the_size_of_a_whole_file(tmp_path: Path, tiny_target: Path) -> None:
    from specgen.models.header import implied_size

    data = tiny_target.read_bytes()
    assert implied_size(tiny_target) == len(data)
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) - 1])
    assert implied_size(tmp_path / "cut.gguf") == len(data)
    (tmp_path / "header.gguf").write_bytes(data[:200])  # the header itself cut short
    assert implied_size(tmp_path / "header.gguf") is None


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["-md", "ngram", "--lookup", "on"], "--lookup needs a draft model"),
        (["-md", "none", "--lookup", "auto"], "--lookup needs a draft model"),
        (["--lookup", "maybe"], "--lookup must be on, off or auto"),
        (["-fa", "yes"], "--flash-attn must be on, off or auto"),
        (["--verify", "both"], "--verify must be block, token or auto"),
        (["-np", "0"], "-np/--parallel"),
        (["-n", "0"], "-n must be -1"),
        (["--slo-ttft", "0"], "--slo-ttft must be more than 0 milliseconds"),
        (["--slo-tpot", "-80"], "--slo-tpot must be 0 (ordinary decoding's) or more milliseconds"),
        (["--draft-max", "4", "--slo-tpot", "80"], "--draft-max auto, not a fixed K"),
        (
            ["-md", "none", "--slo-ttft", "100"],
            "need a draft and --draft-max auto, not --draft none",
        ),
        (["--cache-ram", "-2"], "--cache-ram must be at least -1"),
        # browsers send no path: a trailing slash had refused every request of the page
        (["--cors", "https://app.example/"], "--cors 'https://app.example/' is not an origin"),
        (["--cors", "app.example"], "give scheme://host[:port] with no path"),
        (["-md", "none", "--draft-max", "4"], "--draft-max 4 needs a drafter"),  # was ignored
    ],
)
def test_serve_refuses_run_s_bad_model_and_sampling_flags_in_one_line(
    capsys, tiny_target, tiny_draft, flags, needle
) -> None:
    # the same shapes as run's, checked before the socket is bound or a model loaded
    code = _main(["serve", "-m", str(tiny_target), "-md", str(tiny_draft), *flags])
    line = _one_error_line(capsys)
    assert code == 1 and needle in line, line


def test_flash_attention_reaches_both_models_configs() -> None:
    from specgen.session import ModelSpec

    spec = ModelSpec.from_flags("t.gguf", "d.gguf", 512, 0, 0, 0, flash_attn="off")
    assert spec.target_cfg.flash_attn == spec.draft_cfg.flash_attn == "off"
    assert ModelSpec.from_flags("t.gguf", "d.gguf", 512, 0, 0, 0).target_cfg.flash_attn == "auto"
