"""The goodput formulas the controller (`specgen.control.batch`) prices K with, by hand and
against Leviathan et al. 2023's closed form; the controller itself: test_batchctl.py,
and on whole generations test_loop.py and test_baseline.py."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from specgen.control.goodput import break_even_alpha, expected_tokens

# the synthetic CPU-like costs (seconds): ordinary pass = verify_s(1) = 0.034
DRAFT_S = 0.01


def cpu_verify(n: int) -> float:
    return 0.03 + 0.004 * n


# -- the formulas ----------------------------------------------------------------------


def test_expected_tokens_hand_values() -> None:
    assert expected_tokens([0.5], 0) == 1.0
    assert expected_tokens([0.5], 2) == pytest.approx(1 + 0.5 + 0.25)
    # per position: 1 + .9 + .9*.5 + .9*.5*.1
    assert expected_tokens([0.9, 0.5, 0.1], 3) == pytest.approx(2.395)
    assert expected_tokens([1.0], 7) == 8.0
    assert expected_tokens([0.0, 1.0], 2) == 1.0
    assert expected_tokens([0.5, 0.5], 4) == pytest.approx(1.9375)  # last value repeats


@pytest.mark.parametrize("alpha", [0.1, 0.5, 0.8, 0.95])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_expected_tokens_is_leviathan_eq_1(alpha: float, k: int) -> None:
    closed = (1 - alpha ** (k + 1)) / (1 - alpha)
    assert expected_tokens([alpha] * k, k) == pytest.approx(closed, rel=1e-12)


def test_break_even_alpha_hand_solved() -> None:
    # k = 1: 1 + a = (0.01 + 0.038) / 0.034  ->  a = 0.014 / 0.034
    assert break_even_alpha(1, 0.01, 0.038, 0.034) == pytest.approx(0.014 / 0.034, abs=1e-12)
    # k = 2: 1 + a + a^2 = c, c = (0.02 + 0.042) / 0.034
    c = 0.062 / 0.034
    a = (-1 + np.sqrt(1 - 4 * (1 - c))) / 2
    assert break_even_alpha(2, 0.01, 0.042, 0.034) == pytest.approx(a, abs=1e-12)
    # at the break-even alpha the rate equals ordinary decoding
    a8 = break_even_alpha(8, 0.01, cpu_verify(9), 0.034)
    assert expected_tokens([a8], 8) / (0.08 + cpu_verify(9)) == pytest.approx(1 / 0.034)


def test_break_even_alpha_edges() -> None:
    assert break_even_alpha(1, 0.0, 0.034, 0.034) == 0.0  # costs no more than ordinary
    assert break_even_alpha(1, 0.0, 0.1, 0.034) == 1.0  # 2 tokens never pay 3 passes


def test_pure_modules_import_nothing_heavy() -> None:
    code = (
        "import sys, specgen.control.batch, specgen.control.goodput, specgen.measure\n"
        "import specgen.ngram, specgen.cutoff\n"
        "heavy = {'llama_cpp', 'rich', 'typer', 'huggingface_hub'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
