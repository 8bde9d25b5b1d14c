"""Real clients' default request bodies: what they send that asks for nothing is served,
what asks for something the server does not do is still refused (`specgen.server.inert`,
`specgen.server.fields`). The bodies are the clients' own defaults, read from their
sources (2026-12-07): llama.cpp's web UI (``tools/server/webui``: ``chat.service.ts``,
``settings-config.ts``) and SillyTavern's text-completion preset
(``public/scripts/textgen-settings.js``, TabbyAPI type, which filters no key). Before,
each was a 400 (``return_progress``, ``max_tokens: -1``, ``samplers``, ``reasoning_format``;
SillyTavern's DRY and Mirostat fields with their samplers off, and other servers' names
for ``max_tokens``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import fake_server as fake
import pytest
from support.served import USER, Served, serving

from specgen.server.fields import refusal
from specgen.server.inert import normalized
from specgen.server.tools import TemplateTools

WEB_UI: dict[str, Any] = {
    "messages": USER, "stream": True, "return_progress": True, "reasoning_format": "auto",
    "temperature": 0.8, "max_tokens": -1, "dynatemp_range": 0.0, "dynatemp_exponent": 1.0,
    "top_k": 40, "top_p": 0.95, "min_p": 0.05, "xtc_probability": 0.0, "xtc_threshold": 0.1,
    "typ_p": 1.0, "repeat_last_n": 64, "repeat_penalty": 1.0, "presence_penalty": 0.0,
    "frequency_penalty": 0.0, "dry_multiplier": 0.0, "dry_base": 1.75, "dry_allowed_length": 2,
    "dry_penalty_last_n": -1, "samplers": ["top_k", "typ_p", "top_p", "min_p", "temperature"],
    "timings_per_token": True,
}  # fmt: skip

SILLYTAVERN: dict[str, Any] = {
    "prompt": "User: Say hi.\nAssistant:", "max_new_tokens": 64, "max_tokens": 64,
    "temperature": 0.7, "top_p": 0.5, "typical_p": 1, "typical": 1, "sampler_seed": -1,
    "min_p": 0, "repetition_penalty": 1.2, "frequency_penalty": 0, "presence_penalty": 0,
    "top_k": 40, "skew": 0, "min_tokens": 0, "add_bos_token": True, "smoothing_factor": 0.0,
    "smoothing_curve": 1.0, "dry_allowed_length": 2, "dry_multiplier": 0.0, "dry_base": 1.75,
    "dry_sequence_breakers": ["\n", ":", '"', "*"], "dry_penalty_last_n": 0,
    "max_tokens_second": 0, "stopping_strings": ["\nUser:"], "stop": ["\nUser:"],
    "truncation_length": 4096, "ban_eos_token": False, "skip_special_tokens": True,
    "top_a": 0, "tfs": 1, "mirostat_mode": 0, "mirostat_tau": 5, "mirostat_eta": 0.1,
    "custom_token_bans": "", "banned_strings": [], "api_type": "tabby", "xtc_threshold": 0.1,
    "xtc_probability": 0, "stream": True, "rep_pen": 1.2, "rep_pen_range": 0,
    "repetition_penalty_range": 0, "seed": -1, "guidance_scale": 1, "negative_prompt": "",
    "grammar_string": "", "repeat_penalty": 1.2, "tfs_z": 1, "repeat_last_n": 0,
    "n_predict": 64, "num_predict": 64, "num_ctx": 4096, "mirostat": 0, "ignore_eos": False,
    "rep_pen_slope": 1,
}  # fmt: skip


def _refused(body: dict[str, Any], route: str = "chat", thinks: bool = False) -> str | None:
    found = refusal(normalized(body), route, thinks=thinks)  # type: ignore[arg-type]
    return None if found is None else found[0]


def test_the_web_uis_default_body_asks_for_nothing_refused() -> None:
    assert _refused(WEB_UI) is None
    # its fields that do ask for something are still refused
    for name, value in [("dry_multiplier", 0.8), ("xtc_probability", 0.5), ("typ_p", 0.9)]:
        assert _refused({**WEB_UI, name: value}) == name


def test_sillytaverns_preset_is_refused_only_for_its_repetition_penalty() -> None:
    """vLLM's repetition_penalty (1.2 by default in SillyTavern) over the whole context is
    not llama.cpp's repeat_penalty over repeat_last_n: still refused; set to 1, the whole
    preset is served."""
    assert _refused(SILLYTAVERN, "completions") == "repetition_penalty"
    assert _refused({**SILLYTAVERN, "repetition_penalty": 1}, "completions") is None


@pytest.mark.parametrize(
    ("change", "refused"),
    [
        ({"dry_multiplier": 0.8}, "dry_multiplier"),  # DRY on: its settings ask too
        ({"mirostat": 2}, "mirostat"),
        ({"max_new_tokens": 32}, "max_new_tokens"),  # an alias that says something else
        ({"num_predict": 32}, "num_predict"),
        ({"rep_pen": 1.3}, "rep_pen"),
        ({"stopping_strings": ["\n"]}, "stopping_strings"),
        ({"sampler_seed": 5}, "sampler_seed"),
        ({"banned_strings": ["hi"]}, "banned_strings"),
        ({"add_bos_token": False}, "add_bos_token"),
        ({"guidance_scale": 1.5}, "guidance_scale"),
    ],
)
def test_a_preset_value_that_asks_for_something_is_refused(change, refused) -> None:
    body = {**SILLYTAVERN, "repetition_penalty": 1, **change}
    assert _refused(body, "completions") == refused


def test_a_samplers_switch_off_its_settings_and_only_then() -> None:
    dry = {"dry_base": 2.0, "dry_allowed_length": 3, "dry_sequence_breakers": ["x"]}
    assert _refused(dry) is None  # DRY is off without dry_multiplier
    assert _refused({**dry, "dry_multiplier": 0.5}) == "dry_base"
    assert _refused({"xtc_threshold": 0.2, "xtc_probability": 0}) is None
    assert _refused({"xtc_threshold": 0.2, "xtc_probability": 0.5}) == "xtc_threshold"
    assert _refused({"mirostat_tau": 6, "mirostat": 0}) is None
    assert _refused({"mirostat_tau": 6, "mirostat": 2}) == "mirostat_tau"


NEUTRAL = {"repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}


@pytest.mark.parametrize(
    ("samplers", "extra", "served"),
    [
        (["top_k", "typ_p", "top_p", "min_p", "temperature"], NEUTRAL, True),
        (["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc",
          "temperature"], {}, True),  # llama-server's own default, everything else off
        (["Top-K", "nucleus", "minp", "temp", "tfs_z"], NEUTRAL, True),  # aliases; unknown skipped
        ("ekpmt", {}, True),  # llama-server's one-character form
        (["top_k", "top_p", "min_p", "temperature"], {}, False),  # penalties left out, not off
        (["penalties", "top_k", "top_p", "temperature"], {}, False),  # min-p left out, not off
        (["penalties", "top_k", "top_p", "temperature"], {"min_p": 0.0}, True),  # ... it is off
        (["penalties", "top_k", "temperature", "top_p", "min_p"], {}, False),  # another order
        (["penalties", "dry", "top_k", "top_p", "min_p", "temperature"],
         {"dry_multiplier": 0.8}, False),  # DRY on
        (["penalties", "top_k", "top_p", "min_p", "temperature", "infill"], {}, False),
        (["penalties", "top_k", "top_k", "top_p", "min_p", "temperature"], {}, False),
        (7, {}, False),
    ],
)  # fmt: skip
def test_samplers_are_served_when_they_name_the_chain_this_server_runs(
    samplers, extra, served
) -> None:
    body = {"samplers": samplers, **extra}
    assert (_refused(body) is None) is served, body


def test_llama_server_spellings_become_openais() -> None:
    assert "max_tokens" not in normalized({"max_tokens": -1})
    assert normalized({"max_completion_tokens": -1}) == {}
    assert normalized({"max_tokens": 5})["max_tokens"] == 5
    assert normalized({"logit_bias": []})["logit_bias"] == {}
    assert normalized({"logit_bias": [[15, -100], [7, 2.5]]})["logit_bias"] == {
        "15": -100.0,
        "7": 2.5,
    }
    kept = [["hello", 1]]  # a token's text: left for validation to refuse
    assert normalized({"logit_bias": kept})["logit_bias"] == kept
    assert normalized([1, 2]) == [1, 2]


def test_reasoning_format_auto_is_served_where_the_template_writes_no_reasoning() -> None:
    assert _refused({"reasoning_format": "auto"}, thinks=False) is None
    assert _refused({"reasoning_format": "auto"}, thinks=True) == "reasoning_format"
    assert _refused({"reasoning_format": "auto"}, "completions", thinks=True) is None
    assert _refused({"reasoning_format": "deepseek"}) == "reasoning_format"
    assert _refused({"reasoning_format": "none"}, thinks=True) is None
    qwen3 = "{% if enable_thinking %}<think>\n\n</think>{% endif %}{{ messages }}"
    assert TemplateTools.of(qwen3).thinks and not TemplateTools.of("{{ messages }}").thinks


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with serving() as s:
        yield s


def test_the_web_uis_body_is_served_over_http(served: Served) -> None:
    r = served.post("/v1/chat/completions", {**WEB_UI, "stream": False})
    assert r.status_code == 200, r.text
    job = served.sched.submitted[-1]
    assert job.config.max_tokens == served.sched.n_ctx_slot - len(job.prompt)  # no limit


def test_a_logit_bias_list_is_the_object_over_http(served: Served) -> None:
    for bias in ([[72, -100.0]], {"72": -100.0}):
        r = served.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "logit_bias": bias})
        assert r.status_code == 200, r.text
        assert served.sched.submitted[-1].config.params.constraints.logit_bias == ((72, -100.0),)


def test_reasoning_auto_is_refused_over_http_where_the_template_thinks() -> None:
    backend = fake.fake_backend()
    backend.tool_template = TemplateTools(thinks=True)
    with serving(backend=backend) as s:
        r = s.post("/v1/chat/completions", {"messages": USER, "reasoning_format": "auto"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_format"
        assert s.post("/v1/chat/completions", {"messages": USER}).status_code == 200
