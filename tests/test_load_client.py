"""The load client (`specgen.bench.load`): the real request path stamped with a scripted clock
(exact figures), and real HTTP against the tiny OpenAI-protocol server in
tests/openai_stub.py (counts and kinds exact, times only bounded below, which a slower
machine cannot break)."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import httpcore
import pytest
from openai_stub import Stub, StubConfig

from specgen.bench import load
from specgen.bench.load import report as load_report
from specgen.bench.loadstats import LoadLevel, Slo, SpecStats, e2el_s, itls_s, tpot_s, ttft_s
from specgen.errors import ConfigError


def _sse(*objs: object) -> list[bytes]:
    return [f"data: {json.dumps(o)}\n\n".encode() for o in objs] + [b"data: [DONE]\n\n"]


def _chat_chunk(text: str) -> dict:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


class _ScriptedStream(httpcore.AsyncMockStream):
    """A connection whose every read first sets the clock to that piece's time."""

    def __init__(self, pieces: list[tuple[float, bytes]], now: list[float]) -> None:
        super().__init__([b for _, b in pieces])
        self.times, self.now = [t for t, _ in pieces], now

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if self.times:
            self.now[0] = self.times.pop(0)
        return await super().read(max_bytes, timeout)


class _ScriptedBackend(httpcore.AsyncMockBackend):
    def __init__(self, stream: _ScriptedStream) -> None:
        super().__init__([])
        self.stream = stream

    async def connect_tcp(self, *args, **kwargs) -> httpcore.AsyncNetworkStream:
        return self.stream


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def test_the_request_path_stamps_each_chunk_with_the_clock() -> None:
    """A scripted connection sets the clock to the schedule's time before it hands over each
    piece of the response: the client's figures must then equal the schedule exactly. The
    pieces split an event across reads and end lines with CRLF, as sse-starlette does."""
    events = _sse(
        {"choices": [{"index": 0, "delta": {"role": "assistant"}}]},  # no text: no chunk
        _chat_chunk("Hel"),
        _chat_chunk("lo, "),
        _chat_chunk("world"),
        {
            "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 7},
            "speculative": {"num_draft_tokens": 6, "num_accepted_draft_tokens": 4},
        },
    )
    events = [e.replace(b"\n", b"\r\n") for e in events]
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    half = len(events[2]) // 2
    pieces = [
        (0.040, head),
        (0.050, _chunked(events[0])),
        (0.120, _chunked(events[1])),
        (0.130, _chunked(events[2][:half])),  # the chunk is stamped when its line ends
        (0.150, _chunked(events[2][half:])),
        (0.210, _chunked(events[3])),
        (0.215, _chunked(events[4])),
        (0.220, _chunked(events[5]) + b"0\r\n\r\n"),
    ]
    now = [0.0]

    async def go():
        backend = _ScriptedBackend(_ScriptedStream(pieces, now))
        async with httpcore.AsyncConnectionPool(network_backend=backend) as pool:
            r = await load.send_one(
                pool, "http://x/v1/chat/completions", {}, load.CHAT, 3,
                load.LoadPrompt("p", "k", prompt="hi"), lambda: now[0], 10.0,
            )  # fmt: skip
            now[0] = 0.3
            return r

    r = asyncio.run(go())
    assert r.ok and r.index == 3 and r.finish_reason == "length"
    assert r.chunk_s == (0.120, 0.150, 0.210)
    assert (r.output_tokens, r.tokens_from_usage) == (7, True)
    assert r.spec == SpecStats(6, 4, "speculative")
    assert ttft_s(r) == pytest.approx(0.120)
    assert e2el_s(r) == pytest.approx(0.220)  # at [DONE]
    assert tpot_s(r) == pytest.approx((0.220 - 0.120) / 6)
    assert itls_s(r) == pytest.approx([0.030, 0.060])


def test_the_stream_reader_takes_completions_timings_and_counts_without_usage() -> None:
    st = load.StreamState(load.COMPLETIONS)
    for line, t in [
        (": keep-alive comment\n", 0.0),
        ('data: {"choices": [{"index": 0, "text": "a"}]}\n', 1.0),
        ("\n", 1.0),
        ('data: {"choices": [{"index": 0, "text": ""}]}\n', 1.5),
        ('data: {"choices": [{"index": 0, "text": "b", "finish_reason": "stop"}],'
         ' "timings": {"draft_n": 8, "draft_n_accepted": 3}}\n', 2.0),
        ("data: [DONE]\n\n", 2.5),
    ]:  # fmt: skip
        st.feed(line.encode(), t)
    assert st.done and st.chunk_s == [1.0, 2.0] and st.usage_tokens is None
    assert st.spec is not None and (st.spec.num_draft_tokens, st.spec.source) == (8, "timings")
    bad = load.StreamState(load.CHAT)
    bad.feed(b'data: {"error": {"message": "boom"}}\n', 0.0)
    assert bad.error == "stream error"


def _settings(**kw) -> load.LoadSettings:
    base = dict(
        levels=(LoadLevel(0.0, concurrency=2),), num_prompts=6, max_tokens=8, seed=11, warmup=1
    )
    return load.LoadSettings(**(base | kw))


PROMPTS = [load.LoadPrompt(f"p{i}", "k", prompt=f"prompt {i}") for i in range(3)]


def test_a_level_against_the_stub_server() -> None:
    cfg = StubConfig(
        n_chunks=4, tokens_per_chunk=2, first_delay_s=0.02, delay_s=0.01, spec="speculative"
    )
    with Stub(cfg) as stub:
        servers = load.parse_servers([stub.url + "/v1/"], ["stub"])
        seen: list[load.LoadProgress] = []
        res = load.run_load(servers, PROMPTS, _settings(), progress=seen.append)
    assert stub.served == 1 + 6  # the warm-up, then the level
    (run,) = res.runs
    s = run.summary
    assert (s.n_completed, s.failures, s.total_output_tokens) == (6, (), 48)
    assert s.tokens_per_chunk == 2 and s.tokens_from_usage and s.max_in_flight == 2
    assert s.acceptance_rate == pytest.approx(8 / 12)
    for r in run.records:
        assert len(r.chunk_s) == 4 and r.output_tokens == 8
        assert ttft_s(r) >= 0.02 and e2el_s(r) >= 0.02 + 3 * 0.01  # a slower machine only adds
        assert tpot_s(r) == pytest.approx((e2el_s(r) - ttft_s(r)) / 7)
    assert seen[-1].done == seen[-1].total == 6 and seen[-1].in_flight == 0
    assert max(p.in_flight for p in seen) == 2
    assert res.servers[0].model_id == "stub-model"
    assert res.servers[0].models["data"][0]["sha256"] == "00" * 32
    body = stub.bodies[-1]
    assert body["model"] == "stub-model" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True} and body["ignore_eos"] is True
    assert body["max_tokens"] == 8 and "prompt" in body  # raw prompts: completions
    assert sorted(b["seed"] for b in stub.bodies[1:]) == [11 + i for i in range(6)]


def test_failures_are_counted_by_kind_and_never_stop_the_run(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    lines = [{"prompt": "fine one"}, {"prompt": "FAIL500"}, {"prompt": "DROP"},
             {"prompt": "HANG"}, {"messages": [{"role": "user", "content": "fine two"}]}]  # fmt: skip
    f.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    prompts = load.load_prompts(f)
    with Stub(StubConfig(n_chunks=3)) as stub:
        res = load.run_load(
            load.parse_servers([stub.url], []),
            prompts,
            _settings(
                num_prompts=5, warmup=0, timeout_s=0.5, levels=(LoadLevel(0.0, concurrency=5),)
            ),
        )
        assert all("messages" in b for b in stub.bodies)  # messages: the chat endpoint
    s = res.runs[0].summary
    assert s.n_completed == 2
    assert dict(s.failures) == {"http 500": 1, "disconnect": 1, "timeout": 1}
    kinds = {r.prompt_id: r.failure for r in res.runs[0].records}
    assert kinds == {"line-1": None, "line-2": "http 500", "line-3": "disconnect",
                     "line-4": "timeout", "line-5": None}  # fmt: skip


def test_servers_get_the_same_schedule_alternating_level_by_level() -> None:
    levels = (
        LoadLevel(0.0, concurrency=1),
        LoadLevel(0.8, request_rate=math.inf, max_concurrency=2),
    )
    with Stub(StubConfig(usage=False, spec="timings")) as a, Stub(StubConfig(usage=False)) as b:
        res = load.run_load(
            load.parse_servers([a.url, b.url], ["A", "B"]),
            PROMPTS,
            _settings(levels=levels, warmup=0),
        )
        assert [x["prompt"] for x in a.bodies[:6]] == [x["prompt"] for x in b.bodies[:6]]
        assert [x["temperature"] for x in a.bodies] == [0.0] * 6 + [0.8] * 6
    assert [(r.label, r.level) for r in res.runs] == [
        ("A", levels[0]),
        ("B", levels[0]),
        ("A", levels[1]),
        ("B", levels[1]),
    ]
    s = res.runs[2].summary
    assert s.max_in_flight <= 2 and s.n_completed == 6
    assert s.total_output_tokens == 6 * 4 and not s.tokens_from_usage  # counted chunks
    assert s.acceptance_rate == pytest.approx(1 / 4) and res.runs[3].summary.acceptance_rate is None


def test_slo_goodput_and_chat_bodies() -> None:
    with Stub(StubConfig(n_chunks=2)) as stub:
        res = load.run_load(
            load.parse_servers([stub.url], []),
            PROMPTS,
            _settings(endpoint="chat", slo=Slo(ttft_ms=60_000), top_k=40, top_p=0.95, min_p=0.05),
        )
        body = stub.bodies[-1]
    assert body["messages"] == [{"role": "user", "content": body["messages"][0]["content"]}]
    assert (body["top_k"], body["top_p"], body["min_p"]) == (40, 0.95, 0.05)
    s = res.runs[0].summary
    assert s.slo_met == 6 and s.slo_goodput == pytest.approx(s.request_throughput)


def test_a_prompt_lines_schema_goes_with_its_requests_and_the_output_is_kept(
    tmp_path: Path,
) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    f = tmp_path / "p.jsonl"
    f.write_text(
        json.dumps({"prompt": "record", "json_schema": schema, "id": "r"}) + "\n"
        + json.dumps({"prompt": "free", "id": "f"}) + "\n"
    )  # fmt: skip
    prompts = load.load_prompts(f)
    assert prompts[0].fields == {"json_schema": schema} and prompts[1].fields is None
    with Stub(StubConfig(n_chunks=2, spec="speculative")) as stub:
        res = load.run_load(
            load.parse_servers([stub.url], []), prompts, _settings(num_prompts=2, warmup=0)
        )
        bodies = {b["prompt"]: b for b in stub.bodies}
    # a structure ends where its grammar does: EOS is not ignored for it
    assert bodies["record"]["json_schema"] == schema and "ignore_eos" not in bodies["record"]
    assert "json_schema" not in bodies["free"] and bodies["free"]["ignore_eos"] is True
    for r in res.runs[0].records:
        assert r.text == "abab" * 2 and r.speculative is not None  # 2 chunks of "abab"
        assert r.speculative["num_draft_tokens"] == 6  # the server's object, verbatim


def test_bad_servers_and_inputs_are_one_clear_error(tmp_path: Path) -> None:
    with Stub() as stub:
        port = stub.url.rsplit(":", 1)[1]
    with pytest.raises(ConfigError, match="cannot reach"):
        load.run_load(load.parse_servers([f"http://127.0.0.1:{port}"], []), PROMPTS, _settings())
    for urls, labels, match in [(["ftp://x"], [], "http://"), (["http://a", "http://b"], ["x"], "--label"),
                                (["http://a", "http://a"], [], "own label")]:  # fmt: skip
        with pytest.raises(ConfigError, match=match):
            load.parse_servers(urls, labels)
    msgs = [load.LoadPrompt("m", "k", messages=(("user", "hi"),))]
    with pytest.raises(ConfigError, match="completions"):
        load.endpoint_of(_settings(endpoint="completions"), msgs)
    bad = tmp_path / "bad.jsonl"
    for text, match in [
        ("{nope\n", "not JSON"),
        ('{"messages": [{"role": 1}]}\n', "messages"),
        ("", "no prompts"),
    ]:
        bad.write_text(text)
        with pytest.raises(ConfigError, match=match):
            load.load_prompts(bad)
    assert [p.kind for p in load.load_prompts(None, ["code"])] == ["code"]
    with pytest.raises(ConfigError, match="--kind"):
        load.load_prompts(None, ["nonsense"])


def test_open_loop_levels_share_one_seeded_schedule() -> None:
    s = _settings(levels=(LoadLevel(0.0, request_rate=200.0), LoadLevel(0.0, request_rate=200.0)))
    order0, off0 = load.level_schedule(s, 0, s.levels[0], 3)
    again = load.level_schedule(s, 0, s.levels[0], 3)
    order1, off1 = load.level_schedule(s, 1, s.levels[1], 3)
    assert off0 is not None and off1 is not None and again[1] is not None
    assert order0 == again[0] and (off0 == again[1]).all() and not (off0 == off1).all()
    with Stub() as stub:
        res = load.run_load(load.parse_servers([stub.url], []), PROMPTS, s)
    for run in res.runs:
        assert run.summary.n_completed == 6 and [r.index for r in run.records] == list(range(6))
        starts = [r.start_s for r in run.records]
        assert starts == sorted(starts)  # sent in schedule order


def test_a_server_that_closes_idle_connections_costs_no_request() -> None:
    """llama-server closes a keep-alive connection idle 5 s; open-loop arrivals leave gaps
    longer than the stub's 20 ms, so the pool's idle connections are closed by the server
    (a sweep against llama-server once lost 4 of 8 per level so): the client must drop
    them, or resend a request one refused (tests/test_load_keepalive.py)."""
    s = _settings(levels=(LoadLevel(0.0, request_rate=10.0),), num_prompts=6, warmup=1)
    with Stub(StubConfig(n_chunks=2, close_idle_s=0.02)) as stub:
        res = load.run_load(load.parse_servers([stub.url], []), PROMPTS, s)
    (run,) = res.runs
    assert run.summary.failures == () and run.summary.n_completed == 6


def test_each_level_reports_the_clients_own_cpu_share() -> None:
    """client_cpu = this process's CPU seconds over the level's wall seconds, exactly, with
    scripted clocks (each wall reading +1 s, each CPU reading +0.25 s); the JSON and the
    Markdown carry it."""
    wall, seen = [0.0], []

    def clock() -> float:
        wall[0] += 1.0
        return wall[0]

    def cpu_clock() -> float:
        seen.append(wall[0])  # the wall clock when the CPU clock was read
        return 0.25 * len(seen)

    with Stub(StubConfig(n_chunks=2)) as stub:
        res = load.run_load(
            load.parse_servers([stub.url], []), PROMPTS, _settings(num_prompts=2, warmup=0),
            clock=clock, cpu_clock=cpu_clock,
        )  # fmt: skip
    (run,) = res.runs
    before, after = seen  # read once before the level's first wall reading, once after its last
    assert run.client_cpu == pytest.approx(0.25 / (after - (before + 1)))
    data = load_report.to_dict(res)
    assert data["runs"][0]["client_cpu_percent"] == pytest.approx(100 * run.client_cpu)
    assert f"{100 * run.client_cpu:.1f}% of one core" in load_report.render_markdown(res)


def test_bench_serve_summary_has_the_tails_and_slo_goodput() -> None:
    """scripts/bench_serve.sh's summary (`serve_summary_markdown`) from a real `--json`
    document: its second table carries TTFT p50/p99, TPOT p99 and SLO goodput per server
    under the run's --slo, with specgen's goodput over the best llama-server's; a server
    with no run at a level shows "–"."""
    labels = ["llama-nodraft", "specgen", "specgen-nodraft", "llama-absent"]
    slo = Slo(ttft_ms=60_000, tpot_ms=60_000)  # every request meets it: goodput = req/s
    with Stub(StubConfig(n_chunks=3)) as a, Stub(StubConfig(n_chunks=3)) as b:
        res = load.run_load(
            load.parse_servers([a.url, b.url, b.url], labels[:3]),
            PROMPTS,
            _settings(slo=slo, warmup=0),
        )
    doc = json.loads(json.dumps(load_report.to_dict(res)))  # as the script reads the file
    text = load_report.serve_summary_markdown(doc, labels)
    first, second = text.split("TTFT p50 / p99 ms · TPOT p99 ms · SLO goodput")
    assert "TTFT ≤ 60000 ms, TPOT ≤ 60000 ms" in second
    by = {r["label"]: r["summary"] for r in doc["runs"]}
    row = next(line for line in second.splitlines() if line.startswith("| 0 | 2 streams |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == 2 + len(labels) + 1 and cells[2 + 3] == "–"  # llama-absent
    for i, label in enumerate(labels[:3]):
        s = by[label]
        assert s["slo_goodput"] == pytest.approx(s["request_throughput"])
        t, p = s["ttft"], s["tpot"]
        want = f"{t['p50']:.0f} / {t['p99']:.0f} · {p['p99']:.0f} · {s['slo_goodput']:.2f}"
        assert cells[2 + i] == want
    assert cells[-1] == f"{by['specgen']['slo_goodput'] / by['llama-nodraft']['slo_goodput']:.2f}×"
    # the first table as before: tokens/s (TTFT p50 / TPOT p99) and the two ratios
    row1 = next(line for line in first.splitlines() if line.startswith("| 0 | 2 streams |"))
    spec = by["specgen"]
    assert f"{spec['output_throughput']:.1f} (" in row1
    ratio = spec["output_throughput"] / by["llama-nodraft"]["output_throughput"]
    assert row1.rstrip(" |").split("|")[-2].strip() == f"{ratio:.2f}×"
    # without --slo the goodput cells say so instead of a number
    doc["record"]["settings"]["slo"] = None
    for r in doc["runs"]:
        r["summary"]["slo_goodput"] = None
    assert "no --slo" in load_report.serve_summary_markdown(doc, labels)


def test_the_median_of_alternations_takes_each_figure_s_median_and_sums_the_counts() -> None:
    """`median_of_runs` (scripts/bench_serve.sh with REPEAT > 1): per (level, server) the
    median of three documents' figures, the counts summed; a server in only one document
    keeps its own figures."""

    def doc(tput: float, ttft99: float, extra: bool = False) -> dict:
        def run(label: str, k: float) -> dict:
            return {
                "label": label,
                "level": {"temp": 0.0, "name": "2 streams"},
                "client_cpu_percent": k,
                "summary": {
                    "output_throughput": tput * k, "request_throughput": 1.0,
                    "slo_goodput": None, "n_requests": 8, "n_completed": 8,
                    "ttft": {"p50": 100.0, "p99": ttft99}, "tpot": {"p50": 40.0, "p99": 50.0},
                },
            }  # fmt: skip

        runs = [run("specgen", 1.0), run("llama-nodraft", 2.0)]
        return {
            "format": 1,
            "record": {"settings": {}},
            "runs": runs + ([run("x", 3.0)] if extra else []),
        }

    merged = load_report.median_of_runs([doc(10, 300), doc(30, 100, extra=True), doc(20, 900)])
    by = {r["label"]: r for r in merged["runs"]}
    s = by["specgen"]["summary"]
    assert s["output_throughput"] == 20 and s["ttft"]["p99"] == 300 and s["ttft"]["p50"] == 100
    assert s["n_requests"] == 24 and s["slo_goodput"] is None
    assert by["llama-nodraft"]["summary"]["output_throughput"] == 40
    assert by["x"]["summary"]["output_throughput"] == 90 and by["x"]["summary"]["n_requests"] == 8
    assert by["llama-nodraft"]["client_cpu_percent"] == 2.0
    with pytest.raises(ValueError, match="no documents"):
        load_report.median_of_runs([])
