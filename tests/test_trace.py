"""--trace files: schema, exact reconstruction of a greedy run's tokens, streaming (a valid
prefix after an interruption), `summarize` on a hand-made trace, and the CLI."""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import FakeEngine
from typer.testing import CliRunner

from specgen.drafters import ModelDrafter
from specgen.errors import ConfigError
from specgen.events import Done, Step
from specgen.generate import Event, FixedK, GenerateConfig, generate
from specgen.sampling import SamplingParams
from specgen.trace import (
    LOSS_MARGIN_DEFAULT,
    LOSS_MARGIN_MIN,
    SCHEMA,
    VERSION,
    TraceWriter,
    loss_margin,
    read_trace,
    reconstruct_tokens,
    summarize,
    tee,
)

GREEDY = SamplingParams(temp=0.0)
SAMPLED = SamplingParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.0)
ROUND_KEYS = {
    "type", "generation", "round", "position", "k", "drafted", "q_x", "p_x", "u", "accepted",
    "n_accepted", "next_token", "next_kind", "top", "emitted_text", "draft_s", "verify_s",
    "sample_s", "round_s", "target_cache", "draft_cache", "drafted_text", "next_text",
    "verify_rule", "h", "sources", "n_drafted_by", "n_accepted_by",
}  # fmt: skip


def traced_run(
    path: Path, params: SamplingParams, k: int, eos: int | None = None, policy=FixedK, **cfg
):
    target = FakeEngine(n_vocab=9, seed=0, eos=eos)
    draft = FakeEngine(n_vocab=9, seed=0, noise=1.5)
    config = GenerateConfig(params=params, trace=True, measure_ordinary=2, **cfg)
    events = generate(target, ModelDrafter(draft, params, 9), [1, 2, 3], config, policy(k))
    with TraceWriter(
        path, target="fake-t", draft="fake-d", params=params, seed=cfg.get("seed"),
        max_tokens=config.max_tokens, token_text=target.token_text,
    ) as w:  # fmt: skip
        out = list(tee(events, w))
    assert isinstance(out[-1], Done)
    return out


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("max_tokens", [1, 17, 40])
def test_greedy_trace_reconstructs_the_output_exactly(tmp_path, k, max_tokens):
    path = tmp_path / "t.jsonl"
    done = traced_run(path, GREEDY, k, max_tokens=max_tokens)[-1]
    assert reconstruct_tokens(read_trace(path)) == list(done.tokens)
    assert len(done.tokens) == max_tokens


def test_reconstruction_stops_at_eos_inside_an_accepted_block(tmp_path):
    # token 4 is EOS: a greedy run of the fake pair emits it mid-block for some prompt/K
    for eos in range(9):
        path = tmp_path / f"eos{eos}.jsonl"
        done = traced_run(path, GREEDY, 6, eos=eos, max_tokens=60)[-1]
        tf = read_trace(path)
        assert reconstruct_tokens(tf) == list(done.tokens)
        assert tf.end is not None and tf.end.finish_reason == done.finish_reason


def test_sampled_trace_reconstructs_and_carries_the_decisions(tmp_path):
    path = tmp_path / "s.jsonl"
    events = traced_run(path, SAMPLED, 4, max_tokens=50, seed=3)
    done = events[-1]
    tf = read_trace(path)
    assert reconstruct_tokens(tf) == list(done.tokens)
    steps = [e for e in events if isinstance(e, Step)]
    assert len(tf.rounds) == len(steps)
    lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
    assert all(set(o) == ROUND_KEYS for o in lines if o["type"] == "round")
    for r, st in zip(tf.rounds, steps, strict=True):
        assert r.k == st.k and len(r.drafted) == len(r.q_x) == len(r.p_x) == st.k
        assert len(r.u) == st.k
        n = r.n_accepted
        # the rule, replayed from the file: accepted iff u < p/q, stopping at the first reject
        for i, ok in enumerate(r.accepted):
            assert ok == (r.u[i] * r.q_x[i] < r.p_x[i])
        assert list(r.accepted) == [True] * n + ([False] if n < st.k else [])
        # the first round is ordinary (the first token's latency), the rest speculate
        assert (st.k == 0) == (r is tf.rounds[0])
        assert r.next_kind == ("ordinary" if st.k == 0 else "bonus" if n == st.k else "residual")
        assert len(r.top) == 3 and r.top[0].p >= r.top[1].p >= r.top[2].p
        assert r.target_cache == r.position + n  # committed minus last
        assert r.round_s >= r.draft_s + r.verify_s


def test_several_generations_in_one_file_as_bench_writes_them(tmp_path):
    path = tmp_path / "bench.jsonl"
    target = FakeEngine(n_vocab=9, seed=0)
    draft = FakeEngine(n_vocab=9, seed=0, noise=1.5)
    dones = []
    with TraceWriter(path, target="t", draft="d", params=SAMPLED, command="bench") as w:
        for i, (params, k) in enumerate([(GREEDY, 0), (GREEDY, 4), (SAMPLED, 3)]):
            w.begin(params=params, seed=i, k=k, prompt="p0")
            cfg = GenerateConfig(max_tokens=12 + i, params=params, seed=i, trace=True)
            drafter = ModelDrafter(draft, params, 9) if k else None
            events = list(tee(generate(target, drafter, [1, 2], cfg, FixedK(k)), w))
            dones.append(events[-1])
    tf = read_trace(path)
    assert [g.index for g in tf.generations] == [0, 1, 2]
    assert tf.generations[2].meta["sampling"]["temp"] == 1.0 and tf.generations[1].meta["k"] == 4
    for i, done in enumerate(dones):
        assert reconstruct_tokens(tf, i) == list(done.tokens)
    # (every generation's first round is ordinary: no uniforms)
    assert tf.generations[0].rounds[1].u == () and tf.generations[2].rounds[1].u != ()
    assert dones[1].tokens[:12] == dones[0].tokens  # greedy: speculation changes nothing
    s = summarize(path)
    assert s.n_generations == 3 and s.complete and s.n_generated == 12 + 13 + 14
    # each generation's own baseline where it has ordinary rounds beyond its first (which
    # rides on the prompt's decode: no ordinary pass); the K = 4 one has none, and no
    # timed passes (measure_ordinary=0), so the file's K = 0 rounds stand in
    assert s.baseline_source == "k0-rounds+run"
    assert all(r.generation in (1, 2) and r.k > 0 for r in s.lost)


def test_header_first_and_every_line_complete_json(tmp_path):
    path = tmp_path / "h.jsonl"
    traced_run(path, SAMPLED, 2, max_tokens=10, seed=1)
    lines = path.read_text(encoding="utf-8").splitlines()
    objs = [json.loads(x) for x in lines]
    h = objs[0]
    assert h["type"] == "header" and h["schema"] == SCHEMA and h["version"] == VERSION
    assert h["sampling"] == {"temp": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    assert h["seed"] == 1 and h["max_tokens"] == 10 and h["target"] == "fake-t"
    # a single stream times its ordinary passes after the first token, not at prefill:
    # the run's baseline is in the end record
    assert [o["type"] for o in objs[1:2]] == ["prefill"] and objs[1]["ordinary_token_s"] is None
    assert objs[-1]["type"] == "end" and objs[-1]["n_generated"] == 10
    assert objs[-1]["stats"]["ordinary_token_s"] > 0
    assert path.read_text(encoding="utf-8").endswith("\n")


def fixed_k_run() -> tuple[FakeEngine, Iterator[Event]]:
    """A traced greedy generation of 50 tokens on a fake pair at K 3, from [1, 2]: the
    target (its cache) and the events, not started."""
    target = FakeEngine(n_vocab=9, seed=0)
    draft = FakeEngine(n_vocab=9, seed=0, noise=1.5)
    events = generate(
        target, ModelDrafter(draft, GREEDY, 9), [1, 2], GenerateConfig(max_tokens=50,
        params=GREEDY, trace=True), FixedK(3),
    )  # fmt: skip
    return target, events


def test_interrupted_run_leaves_a_valid_prefix(tmp_path):
    path = tmp_path / "cut.jsonl"
    target, events = fixed_k_run()
    w = TraceWriter(path, target="t", draft="d", params=GREEDY)
    stream = tee(events, w)
    for _ in range(4):  # Prefilled + 3 rounds, then the consumer goes away (Ctrl-C)
        next(stream)
    stream.close()
    # written before close(): the file is readable as it stands
    tf = read_trace(path)
    assert len(tf.rounds) == 3 and tf.end is None
    # closing the tee closed the loop, which left the cache at committed minus last
    assert target.tokens == [1, 2, *reconstruct_tokens(tf)][:-1]
    w.close()
    s = summarize(path)
    assert not s.complete and s.finish_reason is None
    assert any("no end record" in n for n in s.notes)
    # a line cut mid-write (no final newline) is ignored, not an error
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"type": "round", "rou')
    tf2 = read_trace(path)
    assert tf2.truncated_line and len(tf2.rounds) == 3


@pytest.mark.parametrize("where", ["writer", "consumer"])
def test_ctrl_c_in_the_trace_writer_or_its_consumer_still_ends_with_the_done(tmp_path, where):
    """Ctrl-C while a round's line is written (`tee`), or in the consumer between events,
    is handed to the loop, whose Done (finish reason "interrupted") comes through: `run
    --json --trace` once printed nothing when Ctrl-C landed in the writer (2026-12-05, a
    fresh clone's `make test`)."""
    from specgen.generation import consume

    target, events = fixed_k_run()
    w = TraceWriter(tmp_path / "t.jsonl", target="t", draft="d", params=GREEDY)
    seen = [0]
    real = w.write

    def write(ev) -> None:
        seen[0] += 1
        if where == "writer" and seen[0] == 4:
            raise KeyboardInterrupt
        real(ev)

    def fold(ev) -> None:
        if where == "consumer" and seen[0] == 4:
            raise KeyboardInterrupt

    w.write = write  # type: ignore[method-assign]
    done = consume(tee(events, w), fold)
    w.close()
    assert done is not None and done.finish_reason == "interrupted"
    assert 0 < done.stats.n_generated < 50
    assert target.tokens == [1, 2, *done.tokens][:-1]  # the caches rolled back


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("hello\n", "not JSON"),
        ('{"type": "header"}\n', "not a specgen trace"),
        ('{"schema": "specgen.trace", "version": 99}\n', "newer"),
        ('{"schema": "specgen.trace", "version": 1}\n[1, 2]\n', "not a JSON object"),
        ('{"schema": "specgen.trace", "version": 1}\nnope\n{"type": "end"}\n', "line 2"),
        ('{"schema": "specgen.trace", "version": 1}\n{"type": "round", "k": 2}\n', "line 2.*round"),
        (
            '{"schema": "specgen.trace", "version": 1}\n{"type": "end", "finish_reason": "eos",'
            ' "n_generated": "x"}\n',
            "line 2: malformed end",
        ),
    ],
)
def test_bad_files_raise_config_error(tmp_path, content, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError, match=match):
        read_trace(path)


def test_bytes_that_are_not_utf8_name_the_line_and_blank_lines_pass(tmp_path):
    """Bytes that are not UTF-8 (a binary file, a damaged line) name the file and line (was
    "unexpected UnicodeDecodeError" at a byte offset); a blank line is passed over (was
    "not JSON"); a character cut by the last, partial write is a cut-off line."""
    head = b'{"schema": "specgen.trace", "version": 1}\n'
    path = tmp_path / "t.jsonl"
    path.write_bytes(head + b'{"type": "x", "text": "\xff\xfe"}\n{"type": "y"}\n')
    with pytest.raises(ConfigError, match=r"t\.jsonl: line 2 is not UTF-8 text"):
        read_trace(path)
    path.write_bytes(head + b"\n  \n" + b'{"type": "end", "finish_reason": "eos",'
                     b' "n_generated": 1, "stats": {}}\n')  # fmt: skip
    assert read_trace(path).end is not None
    path.write_bytes(head + '{"type": "x", "text": "\u00e9'.encode()[:-1])
    assert read_trace(path).truncated_line


def _round(i, pos, k, drafted, n, nxt, round_s, draft_s=0.01, verify_s=0.02):
    acc = [True] * n + ([False] if n < k else [])
    return {
        "type": "round", "round": i, "position": pos, "k": k, "drafted": drafted,
        "q_x": [0.5] * k, "p_x": [0.5] * k, "u": [0.1] * k, "accepted": acc,
        "n_accepted": n, "next_token": nxt, "next_kind": "bonus" if n == k else "residual",
        "top": [], "emitted_text": "", "draft_s": draft_s, "verify_s": verify_s,
        "sample_s": 0.001, "round_s": round_s, "target_cache": pos + n, "draft_cache": pos,
        "drafted_text": [f"t{t}" for t in drafted], "next_text": f"t{nxt}",
    }  # fmt: skip


def test_summarize_counts_positions_rejections_time_and_lost_rounds(tmp_path):
    path = tmp_path / "hand.jsonl"
    header = {"type": "header", "schema": SCHEMA, "version": 1, "command": "run",
              "target": "T", "draft": "D", "sampling": {"temp": 0.8}, "seed": 5}  # fmt: skip
    rows = [
        header,
        {"type": "prefill", "n_prompt": 4, "prefill_s": 0.1, "ordinary_token_s": 0.02},
        _round(0, 4, 3, [7, 8, 9], 3, 10, round_s=0.04),  # 4 tokens in 40 ms: a win
        _round(1, 8, 3, [5, 6, 6], 0, 11, round_s=0.05),  # 1 token in 50 ms: lost 30 ms
        _round(2, 9, 3, [5, 1, 1], 1, 12, round_s=0.05),  # 2 tokens in 50 ms: lost 10 ms
        _round(3, 11, 3, [5, 2, 2], 0, 13, round_s=0.035),  # cut by n_generated: emits 0
        {"type": "end", "finish_reason": "length", "n_generated": 7, "stats": {}},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    s = summarize(path, top=5)
    assert s.complete and s.finish_reason == "length" and s.n_rounds == 4
    assert s.n_generated == 7 and s.n_drafted == 12 and s.n_accepted == 4
    assert [(p.position, p.tested, p.accepted) for p in s.by_position] == [
        (1, 4, 2), (2, 2, 1), (3, 1, 1),
    ]  # fmt: skip
    top = s.rejected[0]
    assert (top.token, top.text, top.count) == (5, "t5", 2)
    assert {t for t, _txt, _n in top.preferred} == {11, 13}
    assert any(r.token == 1 and r.preferred == ((12, "t12", 1),) for r in s.rejected)
    assert s.time_s["draft"] == pytest.approx(0.04) and s.time_s["verify"] == pytest.approx(0.08)
    assert s.time_s["total"] == pytest.approx(0.175)
    assert s.baseline_source == "measured" and s.ordinary_token_s == 0.02
    # 7 = 4 + 1 + 2 + 0: the last round emitted nothing and is not judged
    assert s.n_lost == 2 and s.lost_s == pytest.approx(0.04)
    assert [r.round for r in s.lost] == [1, 2]
    assert s.lost[0].n_emitted == 1 and s.lost[0].lost_s == pytest.approx(0.03)
    assert s.lost[1].n_emitted == 2 and s.lost[1].ordinary_s == pytest.approx(0.04)
    d = s.to_dict()
    json.dumps(d)
    assert d["acceptance_rate"] == pytest.approx(4 / 12)


def test_summarize_counts_each_proposer_grammar_apart(tmp_path):
    from specgen.ui.reports import render_trace_summary

    path = tmp_path / "g.jsonl"
    header = {"type": "header", "schema": SCHEMA, "version": 1, "command": "run",
              "target": "T", "draft": "D", "sampling": {"temp": 0.0}, "seed": 5}  # fmt: skip
    forced = {**_round(1, 8, 3, [5, 6, 6], 1, 11, 0.05), "sources": ["grammar", "draft", "draft"]}
    rows = [header, _round(0, 4, 3, [7, 8, 9], 3, 10, 0.04), forced]  # the first: no sources
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    s = summarize(path)
    assert s.by_source == {"draft": (5, 3), "grammar": (1, 1)}
    assert s.to_dict()["by_source"]["grammar"] == {"proposed": 1, "accepted": 1}
    lines = [r.plain for r in render_trace_summary(s) if hasattr(r, "plain")]
    assert "by proposer: draft 5 proposed, 3 accepted · grammar 1 proposed, 1 accepted" in lines
    assert lines[0] == "run: target T  draft D  temp 0.0  seed 5"
    # bench's sweep names every temperature (its `sampling` is the first one's)
    bench = {**header, "command": "bench", "temps": [0.0, 0.8]}
    path.write_text("".join(json.dumps(r) + "\n" for r in [bench, *rows[1:]]), encoding="utf-8")
    head = render_trace_summary(summarize(path))[0]
    assert head.plain == "bench: target T  draft D  temps 0.0, 0.8  seed 5"  # type: ignore[union-attr]


def test_summarize_without_baseline_uses_k0_rounds_or_says_so(tmp_path):
    path = tmp_path / "nob.jsonl"
    header = {"type": "header", "schema": SCHEMA, "version": 1}
    rows = [header, _round(0, 3, 2, [1, 2], 0, 4, round_s=0.05)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    s = summarize(path)
    assert s.ordinary_token_s is None and s.n_lost == 0
    assert any("no ordinary-pass timing" in n for n in s.notes)
    k0 = _round(1, 4, 0, [], 0, 5, round_s=0.01)
    path.write_text("".join(json.dumps(r) + "\n" for r in [*rows, k0]), encoding="utf-8")
    s = summarize(path)
    assert s.baseline_source == "k0-rounds" and s.n_lost == 1


def test_a_round_within_timing_noise_of_ordinary_decoding_is_not_a_loss(tmp_path):
    # issue 22: a round 0.019 ms slower than ordinary decoding of its tokens was called a loss
    path = tmp_path / "noise.jsonl"
    header = {"type": "header", "schema": SCHEMA, "version": 1}
    prefill = {"type": "prefill", "n_prompt": 4, "prefill_s": 0.1, "ordinary_token_s": 0.025}
    tie = _round(0, 4, 3, [5, 6, 7], 0, 11, round_s=0.025019)  # 1 token, 0.019 ms slower
    slow = _round(1, 5, 3, [5, 6, 7], 0, 12, round_s=0.0285)  # 1 token, 14% slower
    rows = [header, prefill, tie, slow]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    s = summarize(path)
    assert s.loss_margin == LOSS_MARGIN_DEFAULT  # too few K = 0 rounds to measure the noise
    assert [r.round for r in s.lost] == [1] and s.lost_s == pytest.approx(0.0035)
    assert s.to_dict()["loss_margin"] == LOSS_MARGIN_DEFAULT


def test_the_loss_margin_is_the_spread_of_the_traces_own_ordinary_rounds():
    steady = [0.025] * 10
    assert loss_margin(steady) == LOSS_MARGIN_MIN  # never below the floor
    noisy = [0.020, 0.022, 0.024, 0.025, 0.025, 0.026, 0.028, 0.030, 0.032, 0.040]
    p90 = statistics.quantiles(noisy, n=10)[-1]
    assert loss_margin(noisy) == pytest.approx(p90 / 0.0255 - 1)  # median 25.5 ms
    assert loss_margin(noisy[:4]) == LOSS_MARGIN_DEFAULT


# -- CLI (real tiny models) ---------------------------------------------------------------


@pytest.fixture()
def cli():
    from specgen.cli.app import app

    return app


def test_run_trace_greedy_reconstructs_cli_output(cli, tiny_target, tiny_draft, tmp_path):
    path = tmp_path / "run.jsonl"
    args = ["run", "-m", str(tiny_target), "-md", str(tiny_draft), "-n", "37", "--temp", "0",
            "--draft-max", "4", "-t", "1", "--ignore-eos", "--json", "--trace", str(path),
            "the cat"]  # fmt: skip
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    tf = read_trace(path)
    assert reconstruct_tokens(tf) == out["tokens"] and len(out["tokens"]) == 37
    assert tf.header["target"] == tiny_target.name and tf.header["sampling"]["temp"] == 0.0
    assert all(r.u == () for r in tf.rounds)  # greedy draws no uniforms
    assert all(r.draft_cache >= 0 for r in tf.rounds)

    res = CliRunner().invoke(cli, ["trace", "summarize", str(path), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["n_generated"] == 37 and d["complete"] and d["by_position"][0]["position"] == 1

    res = CliRunner().invoke(cli, ["trace", "summarize", str(path)])
    assert res.exit_code == 0, res.output
    for heading in ("acceptance by position", "time split", "rounds"):
        assert heading in res.stdout


def test_summarize_cli_bad_file_is_one_line_error(tmp_path, capsys):
    from specgen.cli.app import main

    bad = tmp_path / "x.jsonl"
    bad.write_text("nope\n", encoding="utf-8")
    with pytest.raises(SystemExit) as e:
        main(["trace", "summarize", str(bad)])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("specgen: error:") and "not a specgen trace" in err
    with pytest.raises(SystemExit) as e:  # a negative N had cut the tables' last rows
        main(["trace", "summarize", str(bad), "--top", "-1"])
    assert e.value.code == 1 and "--top must be 0 or more, got -1" in capsys.readouterr().err
