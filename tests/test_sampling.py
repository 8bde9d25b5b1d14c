"""Warpers: exact comparison with a direct implementation of llama.cpp's chain order
(top-k, top-p, min-p, temperature; `common_sampler` defaults)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from reference import probs

from specgen.errors import ConfigError
from specgen.sampling import SamplingParams, draw, warp


def reference(logits, temp, top_k, top_p, min_p):
    """Straightforward full-vocabulary version: sort everything, cut, renormalize."""
    z = np.asarray(logits, dtype=np.float64)
    order = np.argsort(-z, kind="stable")
    keep = order if top_k <= 0 else order[:top_k]
    if top_p < 1.0:
        w = np.exp(z[keep] - z[keep].max())
        cum = np.cumsum(w / w.sum())
        m = int(np.argmax(cum >= top_p)) + 1
        keep = keep[:m]
    if min_p > 0.0:
        keep = keep[z[keep] >= z[keep].max() + np.log(min_p)]
    out = np.zeros_like(z)
    w = np.exp((z[keep] - z[keep].max()) / temp)
    out[keep] = w / w.sum()
    return out


SETTINGS = [
    (1.0, 0, 1.0, 0.0),
    (0.8, 40, 0.95, 0.05),
    (0.5, 3, 1.0, 0.0),
    (1.5, 0, 0.5, 0.0),
    (1.0, 0, 1.0, 0.2),
    (0.7, 10, 0.9, 0.1),
    (1.0, 1, 1.0, 0.0),
    (1.0, 0, 0.0, 0.0),
]


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("n_vocab,scale", [(7, 1.0), (50, 3.0), (262144, 4.0)])
def test_warp_matches_reference(setting, n_vocab, scale):
    rng = np.random.default_rng(n_vocab)
    logits = (rng.standard_normal(n_vocab) * scale).astype(np.float32)
    got = probs(logits, SamplingParams(*setting))
    np.testing.assert_allclose(got, reference(logits, *setting), atol=1e-12)
    assert abs(got.sum() - 1.0) < 1e-12


def test_top_k_fast_path_with_a_far_tail():
    # the k-th largest logit is far below the max: the widening threshold must find it
    logits = np.full(1000, -500.0, dtype=np.float32)
    logits[:5] = [10, 9, 8, -100, -200]
    ids, p = warp(logits, SamplingParams(temp=1.0, top_k=5, top_p=1.0, min_p=0.0))
    assert sorted(ids.tolist()) == [0, 1, 2, 3, 4]
    np.testing.assert_allclose(p.sum(), 1.0)


def test_greedy_is_one_hot_argmax():
    logits = np.array([0.1, 3.0, 2.9, -1.0], dtype=np.float32)
    ids, p = warp(logits, SamplingParams(temp=0.0))
    assert ids.tolist() == [1] and p.tolist() == [1.0]
    assert probs(logits, SamplingParams(temp=-1.0)).tolist() == [0, 1, 0, 0]


def test_draw_follows_the_distribution_and_never_draws_zero_mass():
    ids = np.array([3, 7, 9, 11])
    p = np.array([0.5, 0.0, 0.25, 0.25])
    rng = np.random.default_rng(0)
    counts = {i: 0 for i in ids.tolist()}
    for _ in range(20000):
        counts[draw(ids, p, rng)] += 1
    assert counts[7] == 0
    # binomial std for 20000 draws at 0.5 is ~71: 5 sigma bound
    assert abs(counts[3] - 10000) < 355


@pytest.mark.parametrize("kw", [{"top_p": -0.1}, {"top_p": 1.5}, {"min_p": -0.1}, {"min_p": 2.0}])
def test_invalid_settings_are_refused(kw):
    with pytest.raises(ConfigError):
        SamplingParams(**kw)


def test_pure_modules_import_nothing_heavy():
    code = (
        "import sys, specgen.sampling, specgen.rejection, specgen.engine, specgen.events,"
        " specgen.emit, specgen.generate\n"
        "heavy = {'llama_cpp', 'rich', 'typer', 'huggingface_hub'} & set(sys.modules)\n"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
