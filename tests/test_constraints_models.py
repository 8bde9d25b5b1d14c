"""Logit bias and penalties on real models: greedy speculative output equals ordinary
decoding under the same setting (tiny pair, through the Python API and its keyword
arguments), the CLI's llama.cpp flags, and `specgen serve` over real HTTP with the
official `openai` client (SmolLM2 pair): a -100 bias on the token greedy would choose
changes it, penalties change a repetitive greedy answer, bad values are 400s naming the
field and the next request succeeds.

Greedy equality: batched and single-token passes may differ in the last bits, so a
divergence is accepted only at a near-tie of the PROCESSED row (the row each run took its
argmax of): top-two gap below NEAR_TIE_LOGITS (`test_run_models`' rule).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from support.greedy import NEAR_TIE_LOGITS
from support.serve import Server, start

import specgen
from specgen.chat import prompt_tokens
from specgen.constraints import Constraints, processor_for
from specgen.errors import ConfigError
from specgen.llamacpp import EngineConfig, LlamaEngine

SETTINGS = [
    {"logit_bias": {262: -100.0, 270: 3.0}},
    {"repeat_penalty": 1.5, "repeat_last_n": 16},
    {"presence_penalty": 1.5, "frequency_penalty": 1.0, "repeat_last_n": -1},
    {"logit_bias": {262: 2.0}, "repeat_penalty": 1.3, "frequency_penalty": 0.5},
]


def processed_gap(target, context, setting):
    """Top-two gap of the target's processed row after `context` (single-token arithmetic)."""
    c = Constraints(
        logit_bias=setting.get("logit_bias", {}),
        **{k: v for k, v in setting.items() if k != "logit_bias"},
    )
    target.truncate(0)
    row = np.array(target.decode(context)[-1], dtype=np.float32)
    target.truncate(0)
    proc = processor_for(c, target.n_vocab)
    assert proc is not None
    a, b = np.sort(proc.row(row, context, ()).astype(np.float64))[-2:][::-1]
    return a - b


@pytest.fixture(scope="module")
def pairs(tiny_target: Path, tiny_draft: Path):
    with (
        specgen.load(tiny_target, tiny_draft, ctx_size=256) as spec,
        specgen.load(tiny_target, "none", ctx_size=256) as plain,
    ):
        yield spec, plain


@pytest.mark.parametrize("setting", SETTINGS, ids=["bias", "repeat", "presence-freq", "all"])
def test_greedy_speculative_equals_ordinary_with_the_same_setting(pairs, setting, tiny_target):
    spec_pair, plain = pairs
    args = {"max_tokens": 40, "temperature": 0, "ignore_eos": True, **setting}
    spec = spec_pair.generate("the cat sat on", draft_max=4, **args)
    ordinary = plain.generate("the cat sat on", **args)
    unconstrained = plain.generate("the cat sat on", max_tokens=40, temperature=0, ignore_eos=True)
    assert ordinary.tokens != unconstrained.tokens  # the setting changes the text
    assert spec.stats.n_accepted > 0
    if spec.tokens == ordinary.tokens:
        return
    i = next(
        i for i, (a, b) in enumerate(zip(ordinary.tokens, spec.tokens, strict=False)) if a != b
    )
    with LlamaEngine(tiny_target, EngineConfig(n_ctx=256)) as target:
        prompt = prompt_tokens(target, b"the cat sat on")
        gap = processed_gap(target, prompt + list(ordinary.tokens[:i]), setting)
    assert gap < NEAR_TIE_LOGITS, f"diverged at {i} with processed logit gap {gap:.4f}"


def test_api_arguments_are_checked_and_named_as_arguments(pairs):
    spec_pair, _ = pairs
    for kwargs, name in [
        ({"repeat_penalty": 0.0}, "repeat_penalty"),
        ({"presence_penalty": 3.0}, "presence_penalty"),
        ({"logit_bias": {5: 500.0}}, "logit_bias"),
        ({"logit_bias": {100_000: 1.0}}, "logit_bias"),
    ]:
        with pytest.raises(ConfigError, match=name):
            spec_pair.generate("the cat", max_tokens=2, **kwargs)


def test_cli_flags_as_llama_cpp_names_them(tiny_target: Path, tiny_draft: Path):
    base = [sys.executable, "-m", "specgen", "run", "-m", str(tiny_target), "-md"]
    base += [str(tiny_draft), "-n", "12", "--temp", "0", "--ignore-eos", "--json", "-c", "256"]
    out = subprocess.run(base + ["the cat"], capture_output=True, text=True, check=True)
    plain = json.loads(out.stdout)["tokens"]
    ban = ["-l", f"{plain[0]}-inf", "--repeat-penalty", "1.3", "--repeat-last-n", "-1"]
    ban += ["--presence-penalty", "0.5", "--frequency-penalty", "0.5", "-l", "270+1"]
    out = subprocess.run(base + ban + ["the cat"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["tokens"][0] != plain[0]
    bad = subprocess.run(base + ["-l", "15x", "the cat"], capture_output=True, text=True)
    assert bad.returncode != 0 and "--logit-bias must be TOKEN_ID(+|-)BIAS" in bad.stderr


# -- serve over real HTTP ----------------------------------------------------------------


@pytest.fixture(scope="module")
def server(smol_pair) -> Iterator[Server]:
    s = start(smol_pair, "-np", "2", "--draft-max", "4", "--temp", "0")
    yield s
    assert s.stop() == 0


def tokens_of(s: Server, prompt: str, **fields) -> list[int]:
    body = {"prompt": prompt, "max_tokens": 16, "return_tokens": True, **fields}
    r = httpx.post(s.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def test_logit_bias_minus_100_changes_the_greedy_token(server: Server):
    client = server.client()
    msgs = [{"role": "user", "content": "What is the capital of France? One word."}]
    plain = client.chat.completions.create(
        model=server.model_id, messages=msgs, max_tokens=8, extra_body={"return_tokens": True}
    )
    first = (plain.model_extra or {})["tokens"][0]
    banned = client.chat.completions.create(
        model=server.model_id, messages=msgs, max_tokens=8,
        logit_bias={str(first): -100}, extra_body={"return_tokens": True},
    )  # fmt: skip
    assert (banned.model_extra or {})["tokens"][0] != first
    assert banned.choices[0].message.content != plain.choices[0].message.content


def test_penalties_change_a_repetitive_greedy_answer(server: Server):
    prompt = "one one one one one one one one"
    plain = tokens_of(server, prompt)
    assert len(set(plain)) < len(plain) / 2  # repetitive without penalties
    client = server.client()
    penalised = client.completions.create(
        model=server.model_id, prompt=prompt, max_tokens=16, frequency_penalty=2.0,
        presence_penalty=2.0, extra_body={"return_tokens": True},
    )  # fmt: skip
    tokens = (penalised.model_extra or {})["tokens"]
    assert tokens != plain and len(set(tokens)) > len(set(plain))
    repeat = tokens_of(server, prompt, repeat_penalty=1.8, repeat_last_n=64)
    assert repeat != plain


def test_bad_constraint_fields_are_400s_naming_the_field(server: Server):
    client = server.client()
    for fields, param in [
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": {"99999999": -100}}, "logit_bias"),
        ({"logit_bias": [5, 1]}, "logit_bias"),  # not llama-server's [[id, bias]] pairs
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"repeat_penalty": 0}, "repeat_penalty"),
        ({"repeat_last_n": -2}, "repeat_last_n"),
    ]:
        body = {"prompt": "hi", "max_tokens": 2, **fields}
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 400, (fields, r.text)
        assert r.json()["error"]["param"] == param, r.text
    with pytest.raises(openai.BadRequestError):
        client.completions.create(
            model=server.model_id, prompt="hi", max_tokens=2, logit_bias={"x": 1}
        )
    assert tokens_of(server, "hi", max_tokens=2)  # the next request succeeds


def test_verify_holds_the_pair_to_the_constrained_law(tiny_target, tiny_draft, monkeypatch):
    """`specgen verify` with the penalty flags passes, and its sampling check rejects
    penalties counted from the committed tokens only (its reference stays right). The
    setting favours repeating the previous token (+4 logits), so the planted bug's wrong
    "previous token" inside a block moves the law far."""
    from support.planted import CommittedOnly
    from typer.testing import CliRunner

    from specgen import drafters, round
    from specgen.cli.app import app

    args = ["verify", "-m", str(tiny_target), "-md", str(tiny_draft), "-t", "1",
            "--samples", "1000", "--presence-penalty", "-2", "--frequency-penalty", "-2",
            "--repeat-last-n", "1", "-l", "262-inf", "--json"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["passed"]
    for module in (round, drafters):
        monkeypatch.setattr(module, "processor_for", lambda c, v: CommittedOnly(c, v))
    res = CliRunner().invoke(app, [*args[:-1], "--check", "sampling"])
    assert res.exit_code == 1, res.output


def test_smollm2_greedy_speculative_equals_ordinary_under_a_bias_and_penalties(smol_pair):
    """A real BPE vocabulary and a quantized draft: the first greedy token banned, and
    penalties, give the same text speculatively as ordinarily (the near-tie rule)."""
    target_path, draft_path = smol_pair
    text = "The three primary colors are red, blue and"
    args = {"max_tokens": 32, "temperature": 0, "ignore_eos": True}
    with specgen.load(target_path, "none", ctx_size=512) as plain:
        first = plain.generate(text, **args).tokens[0]
        setting = {"logit_bias": {first: -100.0}, "repeat_penalty": 1.3, "presence_penalty": 0.5}
        ordinary = plain.generate(text, **args, **setting)
    with specgen.load(target_path, draft_path, ctx_size=512) as pair:
        spec = pair.generate(text, draft_max=4, **args, **setting)
    assert ordinary.tokens[0] != first and spec.stats.n_accepted > 0
    if spec.tokens == ordinary.tokens:
        return
    i = next(
        i for i, (a, b) in enumerate(zip(ordinary.tokens, spec.tokens, strict=False)) if a != b
    )
    with LlamaEngine(target_path, EngineConfig(n_ctx=512)) as target:
        prompt = prompt_tokens(target, text.encode())
        gap = processed_gap(target, prompt + list(ordinary.tokens[:i]), setting)
    assert gap < NEAR_TIE_LOGITS, f"diverged at {i} with processed logit gap {gap:.4f}"


def test_requests_with_different_settings_share_a_batch(server: Server):
    """Two concurrent greedy requests, one banning the token the other starts with: each
    keeps its own setting in the shared decodes."""
    from concurrent.futures import ThreadPoolExecutor

    prompt = "The capital of France is"
    first = tokens_of(server, prompt, max_tokens=1)[0]
    bodies = [{"max_tokens": 24}, {"max_tokens": 24, "logit_bias": {str(first): -100}}] * 2
    with ThreadPoolExecutor(len(bodies)) as pool:
        outs = list(pool.map(lambda b: tokens_of(server, prompt, **b), bodies))
    for body, out in zip(bodies, outs, strict=True):
        assert (out[0] == first) == ("logit_bias" not in body)
        if "logit_bias" in body:
            assert first not in out


def test_the_servers_flags_are_the_defaults_of_requests_that_omit_the_fields(
    server: Server, smol_pair
):
    prompt = "The capital of France is"
    first = tokens_of(server, prompt, max_tokens=1)[0]
    s = start(smol_pair, "-np", "1", "--draft-max", "4", "--temp", "0", "-l", f"{first}-inf")
    try:
        assert first not in tokens_of(s, prompt)  # the server's -l applies
        assert tokens_of(s, prompt, logit_bias={})[0] == first  # a request's map replaces it
    finally:
        assert s.stop() == 0
