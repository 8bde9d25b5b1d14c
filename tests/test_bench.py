"""`specgen bench`: statistics (exact and statistical), the reproducibility record, the
three output formats, and end-to-end runs on the tiny pair and the demo pair."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest

from specgen import bench
from specgen.errors import ConfigError
from specgen.events import Stats

# -- statistics ---------------------------------------------------------------------------------


def test_percentiles_linear_interpolation() -> None:
    xs = list(range(1, 101))
    assert bench.percentiles(xs) == pytest.approx([50.5, 95.05, 99.01])
    assert all(math.isnan(v) for v in bench.percentiles([]))


def test_bootstrap_ci_covers_true_median_and_reproduces() -> None:
    rng = np.random.default_rng(1)
    true_median = 1.6
    ratios = true_median * rng.lognormal(0.0, 0.1, size=40)  # median of lognormal(0, s) = 1
    lo, hi = bench.bootstrap_median_ci(ratios, seed=3)
    assert lo < true_median < hi
    assert lo <= float(np.median(ratios)) <= hi
    assert (lo, hi) == bench.bootstrap_median_ci(ratios, seed=3)  # seeded: exact repeat
    assert bench.bootstrap_median_ci([1.25]) == (1.25, 1.25)
    with pytest.raises(ValueError):
        bench.bootstrap_median_ci([])


def test_bootstrap_ci_coverage_is_near_nominal() -> None:
    # 95% nominal; the percentile bootstrap of a median runs a little under for n = 25
    rng = np.random.default_rng(11)
    hits = 0
    trials = 200
    for t in range(trials):
        sample = 2.0 + rng.normal(0.0, 0.3, size=25)
        lo, hi = bench.bootstrap_median_ci(sample, n_boot=1000, seed=t)
        hits += lo <= 2.0 <= hi
    assert hits / trials >= 0.88


def test_theoretical_speedup_constant_alpha_hand_computed() -> None:
    # alpha = 0.8, K = 4: E = (1 - 0.8^5) / 0.2 = 3.3616 tokens per round
    # round cost 4 * 0.01 + 0.05 = 0.09 s; ordinary 0.04 s/token -> 3.3616 / 0.09 * 0.04
    got = bench.theoretical_speedup([0.8], [4] * 10, 0.01, lambda m: 0.05, 0.04)
    assert got == pytest.approx(3.3616 / 0.09 * 0.04)
    assert got == pytest.approx(1.494044, abs=1e-6)


def test_theoretical_speedup_field_notes_demo_bound() -> None:
    # greedy demo pair: alpha = 1, K = 8, draft/target 0.30, verify of 9 tokens = 1.9 passes
    got = bench.theoretical_speedup([1.0], [8], 0.30, lambda m: 1.9, 1.0)
    assert got == pytest.approx(9 / 4.3)  # about 2.1x


def test_theoretical_speedup_by_position_and_mixed_blocks() -> None:
    # alpha by position 1, 0.5, 0.5: E(3) = 1 + 1 + 0.5 + 0.25 = 2.75
    assert bench.theoretical_speedup([1.0, 0.5, 0.5], [3], 0.0, lambda m: 1.0, 1.0) == 2.75
    # an ordinary round (m = 0) emits 1 token at cost v(0); rounds are pooled
    costs = {0: 0.04, 4: 0.05}
    got = bench.theoretical_speedup([0.8], [0, 4], 0.01, costs.__getitem__, 0.04)
    assert got == pytest.approx((1 + 3.3616) / (0.04 + 0.04 + 0.05) * 0.04)
    assert math.isnan(bench.theoretical_speedup([0.8], [], 0.01, lambda m: 0.05, 0.04))


def test_position_counts() -> None:
    rounds = [(4, 4), (4, 1), (4, 0), (2, 2), (0, 0)]
    tested, accepted = bench.position_counts(rounds, 4)
    assert tested == [4, 3, 1, 1]
    assert accepted == [3, 2, 1, 1]
    assert bench.rates([2, 0], [1, 0]) == [0.5, None]


def test_list_options() -> None:
    assert bench.parse_draft_max_list("4,8,auto") == (4, 8, None)
    assert bench.parse_temp_list("0, 0.8") == (0.0, 0.8)
    assert bench.parse_temp_list("-1,0.8") == (0.0, 0.8)  # negative = greedy, as in llama.cpp
    for bad in ("", "4,", "4,x", "0", "65", "4,4"):
        with pytest.raises(ConfigError, match="--draft-max"):
            bench.parse_draft_max_list(bad)
    from specgen.flags import parse_draft_max

    with pytest.raises(ConfigError, match="got 0: for ordinary decoding .*, --draft none$"):
        parse_draft_max("0")  # a K of 0 is what --draft none asks for
    with pytest.raises(
        ConfigError, match="^--draft-max must be an integer \\(1 to 64\\) or 'auto'"
    ):
        parse_draft_max("x")
    for bad in ("", "a", "0,-1", "0,0", "nan"):
        with pytest.raises(ConfigError, match="--temp"):
            bench.parse_temp_list(bad)


# -- prompts ------------------------------------------------------------------------------------


def test_builtin_prompt_set_covers_the_kinds() -> None:
    prompts = bench.builtin_prompts()
    kinds = {p.kind for p in prompts}
    assert {"code", "chat", "extractive", "story", "random"} <= kinds
    assert "multilingual-pt" in kinds and "multilingual-ja" in kinds
    texts = " ".join(p.text for p in prompts)
    assert "ã" in texts or "ç" in texts  # Portuguese
    assert any("\u3040" <= ch <= "\u9fff" for ch in texts)  # CJK
    assert len({p.id for p in prompts}) == len(prompts)


def test_load_prompts_formats_and_errors(tmp_path: Path) -> None:
    plain = tmp_path / "p.txt"
    plain.write_text("first prompt\n\nsecond prompt\n", encoding="utf-8")
    got = bench.load_prompts(plain)
    assert [p.text for p in got] == ["first prompt", "second prompt"]
    assert {p.kind for p in got} == {"custom"}

    jl = tmp_path / "p.jsonl"
    jl.write_text('{"prompt": "a", "kind": "code"}\n{"prompt": "b"}\n', encoding="utf-8")
    got = bench.load_prompts(jl)
    assert [(p.kind, p.text) for p in got] == [("code", "a"), ("custom", "b")]
    assert bench.prompt_set_sha256(got) != bench.prompt_set_sha256(bench.load_prompts(plain))

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"text": "b"}\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="line 2"):
        bench.load_prompts(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        bench.load_prompts(tmp_path / "missing.jsonl")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="no prompts"):
        bench.load_prompts(empty)


# -- record -------------------------------------------------------------------------------------


def _record(tiny_target: Path, tiny_draft: Path, seed: int = 1234) -> dict:
    from specgen.llamacpp import EngineConfig

    settings = bench.BenchSettings(draft_max=(2, 4), temps=(0.0, 0.8), seed=seed)
    return bench.build_record(
        tiny_target,
        tiny_draft,
        EngineConfig(n_ctx=512, n_gpu_layers=0, n_threads=1),
        EngineConfig(n_ctx=512, n_gpu_layers=0, n_threads=1),
        settings,
        bench.builtin_prompts(),
    )


def test_record_contents(tiny_target: Path, tiny_draft: Path) -> None:
    rec = _record(tiny_target, tiny_draft)
    for key, path in (("target", tiny_target), ("draft", tiny_draft)):
        m = rec[key]
        assert m["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert m["size_bytes"] == path.stat().st_size
        assert m["quantization"] == "F32"
        assert m["architecture"] == "llama"
        assert m["n_gpu_layers"] == 0
    sw = rec["software"]
    assert sw["llama_cpp_python"] and sw["llama_cpp"] and sw["specgen"]
    assert sw["backend"] in ("CPU", "CUDA", "Metal", "Vulkan", "ROCm", "SYCL")
    assert rec["machine"]["cpu"] and rec["machine"]["cpu_count"] >= 1
    assert rec["threads"] == 1 and rec["n_ctx"] == 512
    assert rec["sampling"]["temps"] == [0.0, 0.8] and rec["seed"] == 1234
    assert rec["prompt_set_sha256"] == bench.prompt_set_sha256(bench.builtin_prompts())
    assert rec["date"]


def test_record_comparability(tiny_target: Path, tiny_draft: Path) -> None:
    a = _record(tiny_target, tiny_draft)
    b = _record(tiny_target, tiny_draft)
    b["date"] = "2000-01-01T00:00:00+00:00"
    b["load_s"] = 99.0
    b["software"]["commit"] = "0123456789ab"  # comparing two commits is --compare's use
    assert bench.record_differences(a, b) == []
    assert bench.record_fingerprint(a) == bench.record_fingerprint(b)
    c = _record(tiny_target, tiny_draft, seed=99)
    diffs = bench.record_differences(a, c)
    assert diffs == ["seed: 1234 -> 99"]
    assert bench.record_fingerprint(a) != bench.record_fingerprint(c)


def test_the_record_states_the_source_commit(monkeypatch) -> None:
    """A published figure states its commit: the checkout's HEAD (``+dirty`` when tracked
    files differ), None outside a git checkout."""
    import subprocess

    from specgen.bench import record

    here = Path(record.__file__).resolve().parent
    head = subprocess.run(
        ["git", "-C", str(here), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True
    )
    commit = record.source_commit()
    if head.returncode != 0:
        assert commit is None
    else:
        assert commit is not None and commit.removesuffix("+dirty") == head.stdout.strip()
        assert record.software_record()["commit"] == commit
    monkeypatch.setattr(record.shutil, "which", lambda name: None)
    assert record.source_commit() is None


def test_file_type_names_match_gguf() -> None:
    import gguf

    from specgen.bench.record import _FILE_TYPES

    for value, name in _FILE_TYPES.items():
        member = gguf.LlamaFileType(value).name
        assert member.endswith(name), (value, member, name)


def test_backend_of() -> None:
    assert bench.backend_of("CPU : SSE3 = 1 | AVX2 = 1") == "CPU"
    assert bench.backend_of("CUDA : ARCHS = 900 | CPU : AVX2 = 1") == "CUDA"
    assert bench.backend_of("Metal : EMBED_LIBRARY = 1 | CPU : NEON = 1") == "Metal"
    assert bench.backend_of("Vulkan : ...") == "Vulkan"


# -- outputs from a synthetic result ------------------------------------------------------------


def _synthetic(record: dict) -> bench.BenchResult:
    """Two configurations x two kinds x three runs; speculation 1.5x faster at K 4 and
    slower at K 8, with known rounds."""
    settings = bench.BenchSettings(draft_max=(4, 8), temps=(0.0,), runs=3, n_tokens=20)
    prompts = [bench.BenchPrompt("c", "code", "x"), bench.BenchPrompt("r", "random", "y")]
    runs = []
    for k, spec_s in ((4, 0.4), (8, 1.2)):
        for run in range(3):
            for p in prompts:
                jitter = 1 + 0.01 * run
                ord_rounds = [bench.Round(0, 0, 0, 1, 0.0, 0.03 * jitter, 0) for _ in range(20)]
                spec_rounds = [
                    bench.Round(k, k, 3, 4, 0.004 * k, spec_s * jitter / 5, 4) for _ in range(5)
                ]
                for mode, rounds, decode in (
                    (bench.ORDINARY, ord_rounds, 0.6 * jitter),
                    (bench.SPECULATIVE, spec_rounds, spec_s * jitter),
                ):
                    draft = sum(r.draft_s for r in rounds)
                    runs.append(
                        bench.RunResult(
                            mode=mode,
                            temp=0.0,
                            draft_max=k,
                            prompt_id=p.id,
                            kind=p.kind,
                            run=run,
                            seed=run,
                            n_generated=20,
                            prefill_s=0.1,
                            decode_s=decode,
                            ttft_s=0.1 + rounds[0].round_s,
                            rounds=rounds,
                            peak_rss_bytes=1 << 30,
                            stats=Stats(
                                draft_s=draft,
                                verify_s=decode - draft - 0.01,
                                sample_s=0.005,
                                # 1 ms of host time per round, a fifth of it drafting
                                host_s=0.001 * len(rounds),
                                draft_host_s=0.0002 * len(rounds) * (mode != bench.ORDINARY),
                                n_rows=sum(r.k + 1 for r in rounds),
                            ),
                        )  # fmt: skip
                    )
    result = bench.BenchResult(settings=settings, prompts=prompts, runs=runs, record=record)
    bench.summarize(result)
    return result


def test_summary_of_synthetic_result(tiny_target: Path, tiny_draft: Path) -> None:
    result = _synthetic(_record(tiny_target, tiny_draft))
    k4, k8 = result.configs
    assert k4.overall.n_pairs == 6
    assert k4.overall.speedup == pytest.approx(1.5)
    lo, hi = k4.overall.speedup_ci95
    assert lo <= 1.5 <= hi
    assert k8.overall.speedup == pytest.approx(0.5)
    assert k4.overall.acceptance_rate == pytest.approx(0.75)
    assert k4.overall.tokens_per_pass == pytest.approx(4.0)
    assert k4.overall.acceptance_by_position == [1.0, 1.0, 1.0, 0.0]
    assert k4.overall.host_s_per_round == pytest.approx(0.001)
    assert k4.overall.host_s_per_row == pytest.approx(0.0008 / 5)
    assert k4.overall.ordinary_host_s_per_token == pytest.approx(0.001)
    assert set(k4.by_kind) == {"code", "random"}
    assert any("K 8" in w and "slower" in w for w in result.warnings)
    assert not any("K 4" in w for w in result.warnings)


def test_three_output_formats(tmp_path: Path, tiny_target: Path, tiny_draft: Path) -> None:
    import importlib.util

    result = _synthetic(_record(tiny_target, tiny_draft))
    out = tmp_path / "out"
    out.mkdir()
    bench.write_json(result, out / "b.json")
    bench.write_markdown(result, out / "b.md")
    data = json.loads((out / "b.json").read_text("utf-8"))
    assert data["format"] == bench.FORMAT
    assert data["fingerprint"] == bench.record_fingerprint(result.record)
    assert data["record"]["target"]["sha256"] == result.record["target"]["sha256"]
    assert len(data["configs"]) == 2 and len(data["runs"]) == len(result.runs)
    assert data["runs"][0]["stats"]["verify_s"] is not None
    md = (out / "b.md").read_text("utf-8")
    assert md.startswith("| temp | K |")
    assert "1.50×" in md and "(slower)" in md and "| code |" in md
    assert result.warnings  # K 8 is slower: the terminal's notes are kept in the file too
    for w in result.warnings:
        assert f"- Note: {w}" in md
    assert "Record fingerprint" in md and result.record["target"]["sha256"][:12] in md
    if importlib.util.find_spec("matplotlib") is None:
        with pytest.raises(ConfigError, match=r"pip install -e '\.\[plot\]'"):
            bench.write_plot(result, out / "b.png")
        assert not (out / "b.png").exists()
    else:
        bench.write_plot(result, out / "b.png")
        assert (out / "b.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["b.json", "b.md"] + (["b.png"] if (out / "b.png").exists() else [])
    )  # no temporary files left


def test_atomic_write_leaves_nothing_on_failure(tmp_path: Path, monkeypatch) -> None:
    import os

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        bench.atomic_write(tmp_path / "x.json", b"{}")
    assert list(tmp_path.iterdir()) == []


def test_output_paths_are_checked_by_creating_a_file_and_never_shared(tmp_path: Path) -> None:
    """A check of the permission bits passes for root on /proc, where the run's results
    were then lost at the end (no file can be created there); two flags naming one file
    overwrote each other; a write that fails at the end names its flag and path."""
    from specgen.cli.bench import BenchFlags
    from specgen.cli.options import check_output_path

    if Path("/proc/self").is_dir():
        with pytest.raises(ConfigError, match=r"^--json: cannot write /proc/x\.json: "):
            check_output_path("--json", Path("/proc/x.json"))
    check_output_path("--json", tmp_path / "x.json")
    assert list(tmp_path.iterdir()) == []  # the probe leaves nothing
    same = tmp_path / "b.json"
    with pytest.raises(ConfigError, match=r"^--json and --markdown name the same file"):
        BenchFlags(json_path=same, markdown_path=tmp_path / "." / "b.json")
    with pytest.raises(ConfigError, match=r"^--compare and --json name the same file"):
        BenchFlags(json_path=same, compare=tmp_path / "." / "b.json")  # the earlier run lost

    class Full:
        def write_json(self, result: object, path: Path) -> None:
            raise OSError(28, "No space left on device")

        write_markdown = write_plot = write_json

    with pytest.raises(ConfigError, match=r"^--json: cannot write .*b\.json: No space left"):
        BenchFlags(json_path=same).write(Full(), object())

    class JsonFails(Full):
        def write_markdown(self, result: object, path: Path) -> None:
            path.write_text("tables")

    md = tmp_path / "ok.md"  # written though --json failed before it (it had been dropped)
    with pytest.raises(
        ConfigError, match=r"^--json: cannot write .*b\.json: No space left on device$"
    ):
        BenchFlags(json_path=same, markdown_path=md).write(JsonFails(), object())
    assert md.read_text() == "tables"


def test_ctrl_c_before_a_measured_generation_says_so(monkeypatch, capsys) -> None:
    """Ctrl-C in the warm-up or the first generation: no table to show, but a line saying
    nothing was measured or written (it had exited 130 in silence)."""
    from types import SimpleNamespace

    from specgen.cli import bench as command

    def interrupted(*args: object) -> None:
        raise bench.BenchInterrupted(SimpleNamespace(configs=[]))  # type: ignore[arg-type]

    monkeypatch.setattr(command, "_measure", interrupted)
    with pytest.raises(KeyboardInterrupt):
        command._measure_traced(bench, None, [], None, None)
    err = capsys.readouterr().err
    assert "interrupted (Ctrl-C) before a measured generation ended; no file written" in err


# -- command line -------------------------------------------------------------------------------


def _main(argv: list[str]) -> int:
    from specgen.cli.app import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    return int(exc.value.code or 0)


def test_cli_url_flags_without_url_are_refused_before_anything_loads(capsys) -> None:
    """--concurrency (any of --url's own flags) without --url was ignored after a whole
    bench of the local pair."""
    assert _main(["bench", "--concurrency", "2"]) == 1
    assert "--concurrency applies to bench --url only" in capsys.readouterr().err
    assert _main(["bench", "--num-prompts", "4", "-n", "8"]) == 1


def test_cli_plot_without_matplotlib(tmp_path: Path, capsys, tiny_target, tiny_draft) -> None:
    import importlib.util

    if importlib.util.find_spec("matplotlib") is not None:
        pytest.skip("matplotlib is installed")
    args = ["bench", "-m", str(tiny_target), "-md", str(tiny_draft)]
    code = _main([*args, "--plot", str(tmp_path / "b.png")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    from specgen.bench.report import PLOT_MISSING

    assert err == [f"specgen: error: {PLOT_MISSING}"]
    assert "pip install -e '.[plot]'" in err[0]  # `specgen[plot]` on PyPI is another project
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--draft-max", "4,x"], "--draft-max"),
        (["--temp", "0,-1"], "--temp"),
        (["--runs", "0"], "--runs"),
        (["--prompts", "/nonexistent/prompts.jsonl"], "cannot read"),
    ],
)
def test_cli_bad_values(capsys, tiny_target, tiny_draft, extra, message) -> None:
    code = _main(["bench", "-m", str(tiny_target), "-md", str(tiny_draft), *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and message in err[0]


def test_cli_refuses_draft_none(capsys, tiny_target) -> None:
    code = _main(["bench", "-m", str(tiny_target), "--draft", "none"])
    assert code == 1
    assert "not 'none'" in capsys.readouterr().err


@pytest.fixture
def two_prompts(tmp_path: Path) -> Path:
    p = tmp_path / "prompts.jsonl"
    p.write_text(
        '{"prompt": "the cat and the dog", "kind": "story"}\n'
        '{"prompt": "def f(x):", "kind": "code"}\n',
        encoding="utf-8",
    )
    return p


def test_cli_bench_under_a_grammar(tmp_path: Path, capsys, tiny_target, tiny_draft, two_prompts):
    # both modes generate under the grammar, which ends each run once complete
    j = tmp_path / "b.json"
    code = _main(
        ["bench", "-m", str(tiny_target), "-md", str(tiny_draft), "--prompts", str(two_prompts),
         "--draft-max", "4", "--temp", "0", "--runs", "1", "-n", "24", "-t", "1", "-c", "256",
         "--grammar", 'root ::= "the cat" (" and the dog")? "."', "--json", str(j)]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "every generation under --grammar (gbnf)" in out
    data = json.loads(j.read_text("utf-8"))
    assert data["settings"]["grammar"] == {"kind": "gbnf", "source": "--grammar"}
    for r in data["runs"]:
        assert r["stats"]["n_generated"] < 24  # ended by the grammar, not by -n
        if r["mode"] != "ordinary":
            assert r["stats"]["n_drafted_by"].get("grammar", 0) > 0


def test_cli_end_to_end_tiny_pair(tmp_path: Path, capsys, tiny_target, tiny_draft, two_prompts):
    j, md = tmp_path / "b.json", tmp_path / "b.md"
    code = _main(
        ["bench", "-m", str(tiny_target), "-md", str(tiny_draft), "--prompts", str(two_prompts),
         "--draft-max", "2,4", "--temp", "0", "--runs", "1", "-n", "8", "-t", "1", "-c", "256",
         "--json", str(j), "--markdown", str(md)]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "speculative vs ordinary decoding" in out and "speedup by prompt kind" in out
    data = json.loads(j.read_text("utf-8"))
    assert [c["draft_max"] for c in data["configs"]] == ["2", "4"]
    assert len(data["runs"]) == 2 * 2 * 2  # K x prompts x modes (warm-up not kept)
    for r in data["runs"]:
        assert r["stats"]["n_generated"] == 8  # EOS ignored: fixed work
        if r["mode"] == "ordinary":
            assert r["block_sizes"] == [0] * 8
        else:
            assert max(r["block_sizes"]) <= int(r["draft_max"])
    # same seed for both modes of a prompt; modes alternate
    assert [r["mode"] for r in data["runs"][:4]] == ["ordinary", "speculative"] * 2
    assert data["runs"][0]["seed"] == data["runs"][1]["seed"]
    assert data["record"]["threads"] == 1 and data["record"]["n_ctx"] == 256
    assert md.read_text("utf-8").startswith("| temp | K |")


def test_cli_ngram_drafter_tiny(tmp_path: Path, tiny_target: Path, two_prompts: Path) -> None:
    j = tmp_path / "b.json"
    code = _main(
        ["bench", "-m", str(tiny_target), "--draft", "ngram", "--prompts", str(two_prompts),
         "--draft-max", "3", "--runs", "1", "-n", "8", "-t", "1", "-c", "256", "--json", str(j)]
    )  # fmt: skip
    assert code == 0
    data = json.loads(j.read_text("utf-8"))
    assert data["record"]["draft"]["file"] == "ngram"
    assert data["configs"][0]["overall"]["n_pairs"] == 2


def test_cli_compare_with_earlier_result(
    tmp_path: Path, capsys, tiny_target, tiny_draft, two_prompts
) -> None:
    base = ["bench", "-m", str(tiny_target), "-md", str(tiny_draft), "--prompts",
            str(two_prompts), "--draft-max", "2", "--runs", "1", "-n", "4", "-t", "1",
            "-c", "256"]  # fmt: skip
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    assert _main([*base, "--json", str(first)]) == 0
    assert _main([*base, "--seed", "7", "--json", str(second), "--compare", str(first)]) == 0
    err = capsys.readouterr().err
    assert "not comparable" in err and "seed: 1234 -> 7" in err
    data = json.loads(second.read_text("utf-8"))
    assert data["compared_to"]["comparable"] is False


# -- demo pair ----------------------------------------------------------------------------------


def test_cli_end_to_end_demo_pair(tmp_path: Path, demo_pair: tuple[Path, Path]) -> None:
    """Gemma 3 270M F32 target, Q4_K_M draft: greedy, one block size, a short run (the
    sweep over several is the tiny pair's test, above)."""
    target, draft = demo_pair
    prompts = tmp_path / "p.jsonl"
    keep = {"code", "random"}  # one easy, one hard case
    chosen = {p.kind: p for p in bench.builtin_prompts() if p.kind in keep}
    prompts.write_text(
        "".join(json.dumps({"prompt": p.text, "kind": p.kind}) + "\n" for p in chosen.values()),
        encoding="utf-8",
    )
    j = tmp_path / "demo.json"
    code = _main(
        ["bench", "-m", str(target), "-md", str(draft), "--prompts", str(prompts),
         "--draft-max", "8", "--temp", "0", "--runs", "1", "-n", "16", "-c", "1024",
         "--json", str(j)]
    )  # fmt: skip
    assert code == 0
    data = json.loads(j.read_text("utf-8"))
    rec = data["record"]
    # the acceptance criterion: SHA-256 values equal sha256sum of the files
    for key, path in (("target", target), ("draft", draft)):
        h = hashlib.sha256()
        with path.open("rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
        assert rec[key]["sha256"] == h.hexdigest()
    assert rec["target"]["quantization"] == "F32"
    assert rec["draft"]["quantization"] == "Q4_K_M"
    assert rec["target"]["architecture"] == "gemma3"
    for c in data["configs"]:
        o = c["overall"]
        assert o["n_pairs"] == 2
        assert o["acceptance_rate"] > 0.5  # the Q4 draft of the same weights agrees often
        assert o["speedup"] > 0 and o["theoretical_speedup"] > 0
        assert len(o["acceptance_by_position"]) == int(c["draft_max"])


def test_other_cpu_load() -> None:
    # 10 s of wall time, the machine was busy 15 CPU-seconds, 10 of them ours: 0.5 CPUs
    assert bench.other_cpu_load((100.0, 1.0, 50.0), (115.0, 11.0, 60.0)) == pytest.approx(0.5)
    assert bench.other_cpu_load(None, (1.0, 1.0, 1.0)) is None
    snap = bench.cpu_snapshot()
    assert snap is None or len(snap) == 3


def test_run_bench_event_seam_for_traces(tiny_target: Path, tiny_draft: Path) -> None:
    from specgen.events import Done, Prefilled, Step
    from specgen.llamacpp import EngineConfig
    from specgen.session import ModelSpec, load

    cfg = EngineConfig(n_ctx=256, n_threads=1)
    settings = bench.BenchSettings(draft_max=(3,), runs=1, n_tokens=6, trace=True)
    loaded = load(ModelSpec(tiny_target, tiny_draft, cfg, cfg), settings.params(0.0))
    seen: list[tuple[dict, object]] = []
    progress: list[bench.Progress] = []
    prompts = [bench.BenchPrompt("a", "story", "the cat")]
    try:
        result = bench.run_bench(
            loaded.target, loaded.drafter, prompts, settings, progress.append,
            lambda info, ev: seen.append((info, ev)),
        )  # fmt: skip
    finally:
        loaded.close()
    assert len(result.runs) == 2
    assert {info["mode"] for info, _ in seen} == {"ordinary", "speculative"}
    assert not any(info["warmup"] for info, _ in seen)
    spec = [ev for info, ev in seen if info["mode"] == "speculative"]
    assert isinstance(spec[0], Prefilled) and isinstance(spec[-1], Done)
    assert all(ev.trace is not None for ev in spec if isinstance(ev, Step))
    assert progress[-1].done == progress[-1].total == settings.total_generations(1)


def test_cli_trace_has_one_generation_per_measured_run(tmp_path: Path, tiny_target, tiny_draft):
    path = tmp_path / "bench.jsonl"
    prompts = tmp_path / "p.txt"
    prompts.write_text("the cat\non the mat\n")
    code = _main([
        "bench", "-m", str(tiny_target), "-md", str(tiny_draft), "--prompts", str(prompts),
        "--draft-max", "2", "--runs", "1", "-n", "6", "--trace", str(path),
    ])  # fmt: skip
    assert code == 0
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0]["type"] == "header" and lines[0]["command"] == "bench"
    gens = [x for x in lines if x["type"] == "generation"]
    # 2 prompts x (ordinary, speculative), the warm-up excluded
    assert sorted((g["prompt"], g["mode"]) for g in gens) == sorted(
        (p, m) for p in {g["prompt"] for g in gens} for m in ("ordinary", "speculative")
    )
    assert len(gens) == 4
    ends = [x for x in lines if x["type"] == "end"]
    assert len(ends) == 4 and all(e["n_generated"] == 6 for e in ends)
    rounds = [x for x in lines if x["type"] == "round"]
    assert rounds and all("next_text" in r for r in rounds)  # the vocabulary reached the writer


def _pair_runs(k: int | None, spec_decode_s: float, drift: float) -> list[bench.RunResult]:
    """One (ordinary, speculative) pair per prompt x run: 20 tokens each; the machine is
    `drift` times slower in run 1, for both modes alike."""
    out = []
    for run in range(2):
        slow = 1.0 + drift * run
        for pid in ("a", "b", "c"):
            for mode, decode in ((bench.ORDINARY, 0.6), (bench.SPECULATIVE, spec_decode_s)):
                out.append(
                    bench.RunResult(
                        mode=mode,
                        temp=0.0,
                        draft_max=k,
                        prompt_id=pid,
                        kind="x",
                        run=run,
                        seed=run,
                        n_generated=20,
                        prefill_s=0.1,
                        decode_s=decode * slow,
                        ttft_s=0.1,
                        rounds=[],
                        peak_rss_bytes=0,
                        stats=Stats(),
                    )  # fmt: skip
                )
    return out


def test_auto_is_compared_with_the_best_fixed_k_pairwise() -> None:
    # speedups: K 4 1.5x, K 8 2x, auto 0.6/0.33 = 1.818x: auto reaches 0.3/0.33 of K 8
    runs = _pair_runs(4, 0.4, 0.3) + _pair_runs(8, 0.3, 0.3) + _pair_runs(None, 0.33, 0.3)
    a = bench.auto_vs_best(runs, 0.0)
    assert a is not None
    assert a.best_k == 8 and a.n_pairs == 6
    assert a.ratio == pytest.approx(0.3 / 0.33, abs=1e-6)
    assert a.ratio_ci95 == pytest.approx([0.3 / 0.33] * 2, abs=1e-6)  # drift cancels
    assert a.auto_speedup == pytest.approx(0.6 / 0.33, abs=1e-6)
    text = bench.auto_vs_best_text(a)
    assert "best fixed K (8) = 0.91×" in text
    # which figure is a median of paired ratios and which are medians of their own pairs
    assert "median of" in text and "paired ratios" in text
    assert "not the ratio of the table's median speedups" in text
    assert bench.auto_vs_best(runs, 0.8) is None  # no runs at that temperature
    assert bench.auto_vs_best(_pair_runs(4, 0.4, 0.0), 0.0) is None  # no auto
    assert bench.auto_vs_best(_pair_runs(None, 0.4, 0.0), 0.0) is None  # no fixed K
