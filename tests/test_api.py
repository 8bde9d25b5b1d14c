"""The public Python API (`specgen.load`, `Pair.generate`, `Pair.stream`) on the tiny pair:
the same tokens as the loop gives, the speculative statistics, events in order, and a cheap
``import specgen``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import run_json

import specgen
from specgen.errors import ConfigError, PromptError
from specgen.events import Done, Prefilled, Step


@pytest.fixture(scope="module")
def pair(tiny_target: Path, tiny_draft: Path):
    with specgen.load(tiny_target, tiny_draft, ctx_size=256) as p:
        yield p


def test_generate_greedy_equals_ordinary_decoding(pair, tiny_target: Path) -> None:
    spec = pair.generate("the cat", max_tokens=16, temperature=0, draft_max=3, ignore_eos=True)
    with specgen.load(tiny_target, "none", ctx_size=256) as plain:
        ordinary = plain.generate("the cat", max_tokens=16, temperature=0, ignore_eos=True)
    assert spec.tokens == ordinary.tokens and len(spec.tokens) == 16
    assert spec.text == ordinary.text and spec.finish == "length"
    assert spec.stats.n_drafted > 0 and 0.0 <= spec.acceptance_rate <= 1.0
    assert max(spec.stats.k_history) == 3 and ordinary.stats.n_drafted == 0  # K <= what is left


def test_a_seed_reproduces_a_sampled_generation(pair) -> None:
    args = {"max_tokens": 12, "temperature": 1.0, "draft_max": 3, "ignore_eos": True}
    a, b = (pair.generate("the cat", seed=7, **args) for _ in range(2))
    assert a.tokens == b.tokens and a.seed == b.seed == 7


def test_the_api_makes_the_rounds_run_makes(pair, tiny_target: Path, tiny_draft: Path) -> None:
    """The draft samples under the call's own settings whatever the door: the pair was
    loaded under the default settings (temperature 0.8), and a greedy call must not draft
    at 0.8 (it did: acceptance 0.70 against run's 0.95 on the demo pair)."""
    args = dict(max_tokens=24, temperature=0, draft_max=8, ignore_eos=True)
    api = pair.generate("the cat sat", **args)
    cli = run_json(
        "-m", str(tiny_target), "-md", str(tiny_draft), "-c", "256", "--temp", "0",
        "--draft-max", "8", "-n", "24", "--ignore-eos", "the cat sat",
    )  # fmt: skip
    stats = cli["stats"]
    assert list(api.stats.k_history) == stats["k_history"]
    assert (api.stats.n_drafted, api.stats.n_accepted) == (
        stats["n_drafted"],
        stats["n_accepted"],
    )
    assert api.text == cli["text"] and stats["n_drafted"] > 0


def test_stream_yields_prefilled_steps_then_done(pair) -> None:
    events = list(pair.stream("the cat", max_tokens=8, temperature=0, ignore_eos=True))
    assert isinstance(events[0], Prefilled) and isinstance(events[-1], Done)
    steps = [e for e in events[1:-1] if isinstance(e, Step)]
    assert (
        steps
        and "".join(s.text for s in steps) == events[-1].text[: len("".join(s.text for s in steps))]
    )
    # closing a stream early leaves the pair usable
    it = pair.stream("the cat", max_tokens=8, temperature=0)
    next(it)
    it.close()
    assert len(pair.generate("the cat", max_tokens=4, temperature=0, ignore_eos=True).tokens) == 4


def test_bad_settings_are_refused_before_generating(pair) -> None:
    with pytest.raises(ConfigError, match="^draft_max") as e:
        pair.stream("the cat", draft_max=0)
    assert "--" not in str(e.value)  # named as the argument the caller passed
    with pytest.raises(ConfigError, match="^top_p must be"):
        pair.generate("the cat", top_p=2)
    with pytest.raises(PromptError, match="empty"):
        pair.generate("")
    with pytest.raises(ConfigError, match="needs target"):
        specgen.load(draft="small.gguf")


def test_cli_words_become_the_arguments_names() -> None:
    from specgen.api import in_python_words

    assert in_python_words("--top-p must be in (0, 1], got 2") == "top_p must be in (0, 1], got 2"
    assert in_python_words("-md needs -m (the target)") == "draft needs target (the target)"
    assert (
        in_python_words("--rpc HOST:PORT is bad; see top-k") == "--rpc HOST:PORT is bad; see top-k"
    )


def test_import_specgen_is_cheap() -> None:
    code = (
        "import sys, specgen; print(sorted(m for m in ('numpy', 'llama_cpp') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
