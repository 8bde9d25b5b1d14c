"""Warnings about the pair and the seed (issue 15): a draft larger or slower than its
target ("did you swap -m and -md?"), and a seed that `--draft-max auto` cannot honour."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tinymodels

from specgen.events import Prefilled
from specgen.session import SWAP_HINT, slow_draft_warning, swap_warning

SPECGEN = [sys.executable, "-m", "specgen"]


def specgen(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*SPECGEN, *args], capture_output=True, env=dict(os.environ), timeout=300)


@pytest.fixture(scope="module")
def tiny(tiny_target: Path, tiny_draft: Path) -> list[str]:
    return ["-m", str(tiny_target), "-md", str(tiny_draft), "-c", "256"]


@pytest.fixture(scope="module")
def tiny_big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny target's vocabulary and first layers, with 6 layers instead of 2: a larger
    file with more parameters."""
    path = tmp_path_factory.mktemp("big") / "tiny-big.gguf"
    tinymodels.write_tiny_llama(path, seed=0, n_layer=6)
    return path


def test_swapped_models_warn_once_on_stderr(tiny_target: Path, tiny_big: Path) -> None:
    # a fixed K: the draft's pass is then not timed, so the timing-based warning (which
    # carries the same hint) cannot add a second hint or one in the right order; this
    # checks the size rule alone, the same on every machine
    args = ["run", "-n", "4", "--temp", "0", "-c", "256", "--draft-max", "4", "the cat"]
    swapped = specgen(*args, "-m", str(tiny_target), "-md", str(tiny_big))
    assert swapped.returncode == 0, swapped.stderr.decode()
    err = swapped.stderr.decode()
    assert err.count(SWAP_HINT) == 1, err
    assert "specgen: warning: the draft tiny-big.gguf is larger than the target" in err
    assert SWAP_HINT.encode() not in swapped.stdout
    right = specgen(*args, "-m", str(tiny_big), "-md", str(tiny_target))
    assert right.returncode == 0, right.stderr.decode()
    assert SWAP_HINT not in right.stderr.decode()


def test_swap_warning_compares_size_then_parameters() -> None:
    assert swap_warning("t.gguf", 10, 100, "d.gguf", 9, 90) is None
    assert swap_warning("t.gguf", 10, 100, "d.gguf", 10, 100) is None
    by_size = swap_warning("t.gguf", 253_113_024, 268, "d.gguf", 1_078_917_824, 268)
    assert by_size is not None and "1.08 GB against 0.25 GB" in by_size
    # a more heavily quantized but larger model: smaller file, more parameters
    by_params = swap_warning("t.gguf", 6_000_000_000, 3_000_000_000, "d.gguf", 5e9, 7e9)
    assert by_params is not None and "7.00B against 3.00B parameters" in by_params


def test_slow_draft_warning_from_the_timed_passes() -> None:
    assert slow_draft_warning(0.010, 0.004) is None
    assert slow_draft_warning(0.010, 0.012) is None  # same-size models: noise, not a swap
    assert slow_draft_warning(None, 0.02) is None and slow_draft_warning(0.01, None) is None
    assert slow_draft_warning(0.0001, 0.0009) is None  # tiny models: under 1 ms is noise
    w = slow_draft_warning(0.0102, 0.0251)
    assert w is not None and "25.1 ms against 10.2 ms" in w and SWAP_HINT in w


def test_run_warns_when_the_draft_measures_slower(capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI's pass-through of the loop's events warns at the timed passes, once."""
    from specgen.cli.run import _warn_slow_draft

    def events():
        yield Prefilled(5, 0.1, ordinary_token_s=0.01, draft_token_s=0.03)
        yield Prefilled(5, 0.1, ordinary_token_s=0.01, draft_token_s=0.003)

    assert len(list(_warn_slow_draft(events()))) == 2
    err = capsys.readouterr().err
    assert err.count(SWAP_HINT) == 1 and "30.0 ms against 10.0 ms" in err


def test_a_seed_under_auto_at_temperature_is_said_to_depend_on_timing(tiny) -> None:
    from specgen.cli.loading import SEED_NOTE

    sampled = ["run", *tiny, "-n", "6", "--temp", "0.8", "the cat"]
    r = specgen(*sampled, "--seed", "42")  # --draft-max auto is the default
    assert r.returncode == 0, r.stderr.decode()
    assert r.stderr.decode().count(SEED_NOTE) == 1
    for quiet in (
        [*sampled, "--seed", "42", "--draft-max", "4"],  # reproducible: nothing to say
        sampled,  # no seed asked for
        ["run", *tiny, "-n", "6", "--temp", "0", "--seed", "42", "the cat"],  # greedy
        ["run", *tiny, "--draft", "none", "-n", "6", "--temp", "0.8", "--seed", "42", "x"],
    ):
        r = specgen(*quiet)
        assert r.returncode == 0, r.stderr.decode()
        assert SEED_NOTE not in r.stderr.decode(), quiet


def test_chat_says_the_seed_note_where_run_does(capsys) -> None:
    """`chat` shares `run`'s rule for the note (a chat session with --seed under auto
    gave other replies each session, and said nothing)."""
    from types import SimpleNamespace

    from specgen.cli import chat
    from specgen.cli.loading import SEED_NOTE, show_messages
    from specgen.flags import SamplingFlags

    assert "show_messages(opened, sampling)" in inspect.getsource(chat.chat_command)
    quiet = {"warnings": (), "notes": ()}
    drafted, alone = (
        SimpleNamespace(drafter=object(), **quiet),
        SimpleNamespace(drafter=None, **quiet),
    )
    for flags, opened, said in (
        (SamplingFlags(temp=0.8, seed=42), drafted, True),
        (SamplingFlags(temp=0.8, seed=42, draft_max="4"), drafted, False),
        (SamplingFlags(temp=0.0, seed=42), drafted, False),
        (SamplingFlags(temp=0.8), drafted, False),
        (SamplingFlags(temp=0.8, seed=42), alone, False),
    ):
        show_messages(opened, flags)  # type: ignore[arg-type]
        assert (SEED_NOTE in capsys.readouterr().err) == said, flags
        show_messages(opened)  # type: ignore[arg-type]
        assert SEED_NOTE not in capsys.readouterr().err  # bench and verify: no seed note


def test_a_seed_with_a_fixed_block_size_reproduces_the_text(tiny) -> None:
    args = ["run", *tiny, "-n", "24", "--temp", "0.8", "--draft-max", "3", "--ignore-eos"]
    first, second, other = (specgen(*args, "--seed", s, "the cat") for s in ("42", "42", "7"))
    assert first.returncode == second.returncode == other.returncode == 0
    assert first.stdout == second.stdout
    assert first.stdout != other.stdout  # the seed is used, not ignored


# -- every command says the same about the pair (issue 20: one loader, one way to show it) ---


def _said(stderr: bytes) -> list[str]:
    """The warning and note lines about the pair: what `session.open` returns, shown."""
    lines = stderr.decode().splitlines()
    return [ln for ln in lines if ln.startswith(("specgen: warning:", "specgen: note:"))]


def test_chat_and_verify_say_what_run_says_about_a_swapped_pair(
    tiny_target: Path, tiny_big: Path, tmp_path: Path
) -> None:
    from specgen import llamacpp

    template = tmp_path / "plain.jinja"  # the tiny models carry no chat template
    template.write_text("{% for m in messages %}{{ m['content'] }}\n{% endfor %}", "utf-8")
    # swapped (the larger file as draft), and GPU layers asked of what may be a CPU build
    pair = ["-m", str(tiny_target), "-md", str(tiny_big), "-c", "256", "-ngl", "99"]
    run = specgen("run", *pair, "-n", "2", "--temp", "0", "--raw", "the cat")
    chat = subprocess.run(
        [*SPECGEN, "chat", *pair, "-n", "2", "--temp", "0", "--chat-template", str(template)],
        input=b"the cat\n", capture_output=True, env=dict(os.environ), timeout=300,
    )  # fmt: skip
    verify = specgen("verify", *pair, "--check", "greedy", "--prompt", "the cat")
    for r in (run, chat, verify):
        assert r.returncode in (0, 1), r.stderr.decode()  # verify's 1 = a failed check
    said = _said(run.stderr)
    assert sum(SWAP_HINT in ln for ln in said) == 1, said
    if not llamacpp.supports_gpu_offload():
        assert any("-ngl ignored" in ln for ln in said), said
    assert _said(chat.stderr) == said
    assert _said(verify.stderr) == said
