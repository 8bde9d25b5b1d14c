"""The view: pure render functions against recording consoles of fixed width, the live
view's throttle and what it leaves on screen, the loading spinner, break-even acceptance."""

from __future__ import annotations

import io
import math
import re
import subprocess
import sys

import pytest
from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

from specgen.control.goodput import break_even_alpha, expected_tokens
from specgen.events import Done, Prefilled, Span, Stats, Step
from specgen.ui.live import LiveView, console_has_color, loading_status
from specgen.ui.state import ViewState, apply
from specgen.ui.text import body_text, legend, render, render_summary

WIDTH = 40
SGR = re.compile(r"\x1b\[([0-9;]*)m")
MULTIBYTE = ["Ol", "á, ", "ação ", "日本語", "の", "テキスト ", "🎉", " fim"]


class FakeClock:
    """A monotonic clock the test moves by hand (seconds)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def console(color: bool = True, **kw: object) -> Console:
    return Console(
        record=True,
        width=WIDTH,
        height=20,
        force_terminal=True,
        color_system="truecolor" if color else None,
        file=io.StringIO(),
        **kw,  # type: ignore[arg-type]
    )


def step(
    spans: list[tuple[str, bool]],
    k: int = 4,
    rejected: str | None = None,
    n_accepted: int | None = None,
    draft_s: float = 0.004,
    verify_s: float = 0.012,
    sample_s: float = 0.001,
    round_s: float = 0.017,
) -> Step:
    n = sum(d for _, d in spans) if n_accepted is None else n_accepted
    return Step(
        k=k,
        n_proposed=k,
        n_drafted=min(k, len(spans)),  # as the loop counts: up to the first rejection
        n_accepted=n,
        spans=tuple(Span(t, i, d) for i, (t, d) in enumerate(spans)),
        rejected_text=rejected,
        draft_s=draft_s,
        verify_s=verify_s,
        sample_s=sample_s,
        round_s=round_s,
    )


def state(**kw: object) -> ViewState:
    base: dict[str, object] = dict(
        target_name="tgt-1b",
        draft_name="drf-270m",
        ordinary_token_s=0.010,
        ordinary_how="3 single-token target passes after the prompt",
    )
    base.update(kw)
    st = ViewState(**base)  # type: ignore[arg-type]
    apply(st, Prefilled(n_prompt=7, prefill_s=0.05))
    return st


def rendered(st: ViewState, color: bool = True, styles: bool = False) -> str:
    c = console(color)
    c.print(render(st))
    return c.export_text(styles=styles)


# -- body: spans, styles, multi-byte -----------------------------------------------------


def test_spans_in_order_with_origin_styles() -> None:
    st = state()
    apply(st, step([("The", True), (" cat", True), (" sat", False)], k=2))
    apply(st, step([(" on", False)], k=3, rejected=" under", n_accepted=0))
    text = body_text(st)
    assert text.plain == "The cat sat on"
    runs = [(text.plain[s.start : s.end], str(s.style)) for s in text.spans]
    assert runs == [("The cat", "green"), (" sat on", "magenta")]
    out = rendered(st, styles=True)
    assert "\x1b[32mThe cat\x1b[0m\x1b[35m sat on\x1b[0m" in out
    assert "under" not in out  # rejected proposals hidden by default


def test_lookup_tokens_have_their_own_style_and_legend_entry() -> None:
    st = state()
    apply(st, step([("The", True), (" cat", True), (" sat", False)], k=2))
    assert "lookup" not in legend(st).plain  # named only once a lookup token is shown
    spans = (Span(" on", 3, True, "lookup"), Span(" the", 4, True, "draft"), Span(".", 5, False))
    apply(st, Step(3, 3, 3, 2, spans, None, 0.004, 0.012, 0.001, 0.017))
    text = body_text(st)
    runs = [(text.plain[s.start : s.end], str(s.style)) for s in text.spans]
    assert runs == [
        ("The cat", "green"), (" sat", "magenta"), (" on", "cyan"), (" the", "green"),
        (".", "magenta"),
    ]  # fmt: skip
    assert "lookup" in legend(st).plain
    mono = state(color=False)
    apply(mono, Step(3, 3, 3, 2, spans, None, 0.004, 0.012, 0.001, 0.017))
    assert "underlined: lookup" in legend(mono).plain


def test_grammar_forced_tokens_have_their_own_style_not_the_drafts() -> None:
    st = state()
    spans = (
        Span('{"', 3, True, "grammar"), Span("name", 4, True, "draft"),
        Span('": "', 5, True, "grammar"), Span("Ana", 6, False),
    )  # fmt: skip
    assert "grammar" not in legend(st).plain  # named only once the grammar forced a token
    apply(st, Step(4, 3, 3, 3, spans, None, 0.004, 0.012, 0.001, 0.017))
    text = body_text(st)
    assert text.plain == st.text == '{"name": "Ana'
    runs = [(text.plain[s.start : s.end], str(s.style)) for s in text.spans]
    assert runs == [('{"', "yellow"), ("name", "green"), ('": "', "yellow"), ("Ana", "magenta")]
    assert "grammar" in legend(st).plain
    mono = state(color=False)
    apply(mono, Step(4, 3, 3, 3, spans, None, 0.004, 0.012, 0.001, 0.017))
    assert "italic: grammar" in legend(mono).plain


def test_rejected_proposal_inline_struck_through_only_when_asked() -> None:
    st = state(show_rejected=True)
    apply(st, step([(" A", True), (" B", False)], k=3, rejected=" X\n", n_accepted=1))
    assert body_text(st).plain == " A X↵ B"  # where it was rejected; newline made visible
    out = rendered(st, styles=True)
    assert "\x1b[2;9;31m X↵\x1b[0m" in out  # dim + strike
    assert "rejected" in out.splitlines()[2] + out.splitlines()[3]  # legend mentions it
    st.show_rejected = False
    assert body_text(st).plain == " A B"
    assert "X" not in rendered(st)


def test_multibyte_text_wraps_at_width_without_breaking_characters() -> None:
    st = state()
    for i in range(12):
        apply(st, step([(p, (i + j) % 2 == 0) for j, p in enumerate(MULTIBYTE)]))
    full = "".join(MULTIBYTE) * 12
    assert st.text == full
    c = console()
    c.print(body_text(st))
    lines = c.export_text().splitlines()
    assert len(lines) > 3
    assert all(cell_len(line) <= WIDTH for line in lines)
    assert "\ufffd" not in "".join(lines)
    assert "".join(lines).replace(" ", "") == full.replace(" ", "")


def test_control_characters_from_the_model_are_made_visible() -> None:
    st = state()
    apply(st, step([("a\x1b[2Jb\tc\n", False)], k=0))
    assert body_text(st).plain == "a␛[2Jb\tc\n"


# -- footer ------------------------------------------------------------------------------


def test_footer_has_every_number_and_how_the_baseline_was_measured() -> None:
    st = state()
    for _ in range(10):  # 4 drafted, 3 accepted, 4 tokens per round of 0.017 s
        apply(st, step([("a", True), ("b", True), ("c", True), ("d", False)], k=4))
    out = " ".join(rendered(st, color=False).split())
    assert "K=4" in out
    assert "40 tokens" in out
    assert f"{40 / 0.17:.1f} tok/s" in out
    assert "acceptance 75.0%" in out
    assert "4.00 tok/pass" in out
    assert "time: draft 24% · verify 71% · other 6%" in out
    # speedup = (40 / 0.17 tok/s) / (1 / 0.010 s per token)
    assert f"speedup {40 / 0.17 * 0.010:.2f}× vs ordinary 100.0 tok/s" in out
    assert "(3 single-token target passes after the prompt)" in out
    assert "break-even" in out
    assert "accepted draft (drf-270m)" in out and "target (tgt-1b)" in out


def test_footer_says_fallback_when_k_is_zero() -> None:
    st = state()
    apply(st, step([("a", True), ("b", False)], k=4))
    apply(st, step([("c", False)], k=0))
    out = " ".join(rendered(st).split())
    assert "fallback: ordinary decoding" in out
    assert not out.split("fallback")[0].endswith("K=4 · ")
    assert "break-even acceptance 41.9% at K=4" in out  # the last speculative round's costs


def test_zero_acceptance_run() -> None:
    st = state()
    for _ in range(5):
        apply(st, step([("x", False)], k=4, rejected="y", n_accepted=0))
    out = " ".join(rendered(st).split())
    assert "acceptance 0.0%" in out
    assert "1.00 tok/pass" in out
    speedup = float(re.search(r"speedup ([0-9.]+)×", out).group(1))  # type: ignore[union-attr]
    assert speedup < 1.0
    assert st.speedup == pytest.approx(0.010 / 0.017)
    alpha = float(re.search(r"break-even acceptance ([0-9.]+)%", out).group(1))  # type: ignore[union-attr]
    # round = 4 * 0.001 s drafting + 0.013 s rest; needs E(alpha, 4) = 1.7 tokens per round
    assert expected_tokens([alpha / 100], 4) == pytest.approx(1.7, abs=0.01)


def test_without_a_baseline_the_footer_says_so() -> None:
    st = state(ordinary_token_s=None, ordinary_how="")
    apply(st, step([("a", True), ("b", False)]))
    out = " ".join(rendered(st).split())
    assert "speedup n/a (ordinary decoding not timed)" in out
    assert "break-even" not in out


def test_narrow_terminal_wraps_footer_between_items() -> None:
    st = state()
    apply(st, step([("a", True), ("b", False)]))
    lines = rendered(st).splitlines()
    assert all(cell_len(line) <= WIDTH for line in lines)
    assert any(line.startswith("acceptance ") for line in lines)  # wrapped before an item


def test_footer_acceptance_at_the_end_equals_the_summary() -> None:
    """The footer folds Steps, the summary shows the loop's totals: one definition of
    drafted, so the last footer and the summary agree. A confidence cut-off makes blocks
    shorter than K, where counting K as drafted would disagree."""
    from fakes import FakeEngine

    from specgen.drafters import ModelDrafter
    from specgen.generate import FixedK, GenerateConfig, generate
    from specgen.sampling import SamplingParams

    params = SamplingParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.0)
    target = FakeEngine(n_vocab=9, seed=4)
    drafter = ModelDrafter(FakeEngine(n_vocab=9, seed=4, noise=1.0), params, 9, p_min=0.5)
    config = GenerateConfig(max_tokens=60, params=params, seed=3)
    st = state()
    events = list(generate(target, drafter, [1, 2], config, FixedK(6)))
    steps = [e for e in events if isinstance(e, Step)]
    assert sum(e.k for e in steps) > sum(e.n_drafted for e in steps)  # short blocks happened
    for ev in events[:-1]:
        apply(st, ev)
    footer_pct = re.search(r"acceptance ([0-9.]+%) of drafted", " ".join(rendered(st).split()))
    done = events[-1]
    assert isinstance(done, Done) and 0 < done.stats.acceptance_rate < 1
    apply(st, done)
    c = console()
    c.print(render_summary(st))
    summary_pct = re.search(r"acceptance ([0-9.]+%) \(", " ".join(c.export_text().split()))
    assert footer_pct is not None and summary_pct is not None
    assert footer_pct.group(1) == summary_pct.group(1) == f"{done.stats.acceptance_rate:.1%}"


def test_prompt_is_shown_dimmed_before_the_reply_and_is_not_output() -> None:
    st = state(prompt="The old lighthouse keeper")
    apply(st, step([("'s", True), (" son", False)], k=2))
    text = body_text(st)
    assert text.plain == "The old lighthouse keeper's son"
    runs = [(text.plain[s.start : s.end], str(s.style)) for s in text.spans]
    assert runs[0] == ("The old lighthouse keeper", "dim")
    assert st.text == "'s son"  # the reply alone: what Done's text is compared with
    apply(st, Done("eos", "'s son.", (0, 1, 2), Stats(n_generated=3)))
    assert st.text == "'s son."
    mono = state(prompt="Hi\n", color=False)
    assert [(str(s.style)) for s in body_text(mono).spans] == ["dim"]


def test_live_view_prints_the_chat_message_above_the_reply() -> None:
    c = console()
    st = state(prompt="Write a haiku about the sea.\n")
    with LiveView(c, st, clock=FakeClock(), summary=False) as view:
        view.update(step([("Waves", True), (" fold", False)]))
    out = c.export_text()
    # printed above the live region once, for good; the reply follows on its own line
    assert out.count("Write a haiku about the sea.\n") == 1
    assert out.index("Write a haiku") < out.rindex("Waves fold")


# -- summary -----------------------------------------------------------------------------


def test_summary_has_totals_finish_reason_and_models() -> None:
    st = state()
    apply(st, step([("a", True), ("b", False)], k=2))
    apply(st, step([("c", False)], k=0))
    stats = Stats(
        n_prompt=7,
        n_generated=3,
        n_drafted=2,
        n_accepted=1,
        target_passes=2,
        prefill_s=0.05,
        decode_s=0.034,
        draft_s=0.004,
        verify_s=0.024,
        sample_s=0.002,
        ttft_s=0.067,
    )
    apply(st, Done(finish_reason="eos", text="abc", tokens=(0, 1, 2), stats=stats))
    c = console()
    c.print(render_summary(st))
    out = " ".join(c.export_text().split())
    for part in (
        "end-of-generation token",
        "target tgt-1b · draft drf-270m",
        "3 generated · 7 prompt",
        "acceptance 50.0% (1 of 2 drafted)",
        "1.50 tokens over 2 target passes",
        "decode 0.03 s: draft 12% · verify 71% · other 18%",
        "(3 single-token target passes",
        "1 fallback round of 2",
    ):
        assert part in out, part


# -- NO_COLOR ----------------------------------------------------------------------------


def color_codes(ansi: str) -> list[str]:
    """SGR parameters that set a color (30-49, 90-107, 38;..., 48;...)."""
    found = []
    for params in SGR.findall(ansi):
        for p in params.split(";"):
            if p and (30 <= int(p) <= 49 or 90 <= int(p) <= 107):
                found.append(params)
    return found


def test_no_color_env_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    out = io.StringIO()
    c = Console(file=out, width=WIDTH, force_terminal=True)
    assert not console_has_color(c)
    st = state(show_rejected=True)
    apply(st, step([("a", True), ("b", False)], rejected="z", n_accepted=1))
    with LiveView(c, st, clock=FakeClock()):
        pass
    assert st.color is False  # attribute-only styles chosen
    text = out.getvalue()
    assert color_codes(text) == []
    assert "azb\n" in SGR.sub("", text)  # rejected z struck, target b bold
    assert "\x1b[2;9mz" in text and "\x1b[1mb" in text
    plain = " ".join(SGR.sub("", text).split())
    assert "plain: accepted draft" in plain and "bold: target" in plain


def test_color_system_none_emits_no_escapes() -> None:
    st = state(color=False)
    apply(st, step([("a", True), ("b", False)]))
    c = Console(file=io.StringIO(), width=WIDTH, color_system=None, force_terminal=False)
    c.print(render(st))
    c.print(render_summary(st))
    assert "\x1b" not in c.file.getvalue()  # type: ignore[attr-defined]


# -- LiveView ----------------------------------------------------------------------------


def spy_prints(c: Console, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the plain text of everything printed through ``c.print``."""
    printed: list[str] = []
    real = c.print

    def spy(*objects: object, **kw: object) -> None:
        if objects and all(isinstance(o, Text) for o in objects):
            printed.append("".join(o.plain for o in objects))  # type: ignore[attr-defined]
        real(*objects, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(c, "print", spy)
    return printed


def feed(view: LiveView, clock: FakeClock, n: int, dt: float) -> None:
    for i in range(n):
        clock.t += dt
        text = f" w{i}" + ("\n" if i % 37 == 36 else "")
        view.update(step([(text, i % 3 != 0)], k=3, n_accepted=int(i % 3 != 0)))


def test_live_refresh_is_throttled() -> None:
    clock = FakeClock()
    st = state()
    with LiveView(console(), st, clock=clock, min_interval_s=0.1, summary=False) as view:
        feed(view, clock, 1000, dt=0.0005)  # 1,000 rounds in 0.5 s
        assert view.n_refreshes <= 1 + 0.5 / 0.1 + 1
        feed(view, clock, 1000, dt=0.0)  # a stalled clock never refreshes
        assert view.n_refreshes <= 1 + 0.5 / 0.1 + 1
    assert st.stats.n_generated == 2000


def test_slow_redraws_are_spaced_out() -> None:
    class TickingClock(FakeClock):
        """Every reading costs 5 ms: a redraw (two readings apart) looks 5 ms long."""

        def __call__(self) -> float:
            self.t += 0.005
            return self.t

    clock = TickingClock()
    with LiveView(console(), state(), clock=clock, max_share=0.01, summary=False) as view:
        feed(view, clock, 1000, dt=0.0)
    # 1,000 updates * 5 ms = 5 s of wall time; a 5 ms redraw earns a 0.5 s gap (the cap).
    assert view.n_refreshes <= 2 + 5.0 / 0.5 + 1
    assert view.redraw_s <= 0.02 * clock.t


def test_live_footer_is_current_after_each_redraw() -> None:
    clock = FakeClock()
    c = console()
    with LiveView(c, state(), clock=clock, summary=False) as view:
        for n in range(1, 60):
            feed(view, clock, 1, dt=1.0)  # every update redraws; some print lines above
            assert f"· {n} tokens ·" in c.export_text()[-2000:]


def test_live_leaves_whole_text_then_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    c = console()
    printed = spy_prints(c, monkeypatch)
    st = state()
    with LiveView(c, st, clock=clock) as view:
        feed(view, clock, 300, dt=0.05)
        view.update(Done("length", st.text, (), st.stats))
    # What went above the live region, joined, wraps exactly like the whole text; the
    # legend follows it (the colours stay on screen, so does what they mean).
    assert printed[-1].startswith("accepted draft")
    body = "\n".join(printed[:-1])
    ref, got = console(), console()
    ref.print(st.text, end="")
    got.print(body, end="")
    assert got.export_text() == ref.export_text()
    out = c.export_text()
    assert "finished   length" in out
    assert st.finish_reason == "length"


def test_ctrl_c_keeps_text_prints_summary_and_propagates() -> None:
    clock = FakeClock()
    c = console()
    st = state()
    with pytest.raises(KeyboardInterrupt):
        with LiveView(c, st, clock=clock) as view:
            feed(view, clock, 50, dt=0.01)
            raise KeyboardInterrupt
    out = c.export_text()
    assert "w49" in out
    assert "interrupted (Ctrl-C)" in out
    assert st.finish_reason == "interrupted"


def test_live_region_is_bounded_by_terminal_height() -> None:
    st = state()
    apply(st, step([("word " * 2000, False)], k=0))
    c = console()
    lines = c.render_lines(render(st, tail=True), c.options, pad=False)
    assert len(lines) < c.height


# -- loading status ----------------------------------------------------------------------


def test_loading_status_reports_elapsed() -> None:
    clock = FakeClock()
    c = console()
    with loading_status(c, "loading target model tgt-1b", "loaded target [x]", clock=clock):
        clock.t += 1.23
    assert "✓ loaded target [x] in 1.2 s" in c.export_text()


def test_loading_status_failure_is_reported_and_raised() -> None:
    clock = FakeClock()
    c = console()
    with pytest.raises(RuntimeError):
        with loading_status(c, "downloading drf-270m", clock=clock):
            clock.t += 0.5
            raise RuntimeError("boom")
    assert "✗ downloading drf-270m failed after 0.5 s" in " ".join(c.export_text().split())


# -- break-even acceptance ---------------------------------------------------------------


def test_break_even_any_acceptance_pays() -> None:
    # A round of K=4 costs less than one ordinary token: even alpha = 0 pays.
    assert break_even_alpha(4, draft_token_s=0.001, verify_s=0.010, ordinary_token_s=0.020) == 0.0


def test_break_even_only_perfect_acceptance_pays() -> None:
    # K=2: a round costs 3 ordinary tokens and yields at most 3 tokens.
    alpha = break_even_alpha(2, draft_token_s=0.1, verify_s=0.4, ordinary_token_s=0.2)
    assert alpha == pytest.approx(1.0)


def test_break_even_never_pays_is_said_plainly() -> None:
    st = state(ordinary_token_s=0.001)  # ordinary decoding far faster than any round
    apply(st, step([("a", True), ("b", False)], k=2))
    assert st.break_even is not None and math.isinf(st.break_even[1])
    assert "break-even: none at K=2 (slower even at 100% acceptance)" in " ".join(
        rendered(st).split()
    )


def test_break_even_hand_solved() -> None:
    # K=2: 1 + a + a^2 = (2 * 0.05 + 0.25) / 0.2 = 1.75  =>  a = 0.5
    assert break_even_alpha(2, 0.05, 0.25, 0.2) == pytest.approx(0.5, abs=1e-9)
    # K=1: 1 + a = 1.25  =>  a = 0.25
    assert break_even_alpha(1, 0.1, 0.4, 0.4) == pytest.approx(0.25, abs=1e-9)


def test_prefilled_baseline_and_held_back_text() -> None:
    st = ViewState(target_name="t", draft_name=None)
    apply(st, Prefilled(n_prompt=3, prefill_s=0.1, ordinary_token_s=0.02))
    assert st.ordinary_token_s == 0.02 and "single-token target passes" in st.ordinary_how
    apply(st, step([("ab", False), ("", False)], k=0))
    apply(st, Done("stop", "abç", (1, 2, 3), Stats(n_generated=3)))
    assert st.text == "abç"
    out = " ".join(rendered(st).split())
    assert "target t" in out and "K=0" not in out
    assert "ordinary decoding" in out and "fallback" not in out


# -- purity ------------------------------------------------------------------------------


def test_view_imports_no_model_or_cli_library() -> None:
    code = (
        "import sys, specgen.ui.live\n"
        "bad = {'llama_cpp', 'typer', 'huggingface_hub'} & set(sys.modules)\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_break_even_uses_the_block_size_of_most_rounds() -> None:
    """auto changes K, and the last round is often cut short by -n: the summary's
    break-even must describe the K the run mostly used, with that K's own costs."""
    st = state(ordinary_token_s=0.03)
    for _ in range(3):  # K = 8: 8 x 10 ms drafting + 70 ms for the rest
        apply(st, step([("a", True)] * 8 + [("b", False)], k=8, draft_s=0.08, round_s=0.15))
    apply(st, step([("c", False)], k=0, round_s=0.03))
    apply(st, step([("d", True), ("e", False)], k=1, draft_s=0.01, round_s=0.2))  # cut, slow
    k, alpha = st.break_even
    assert k == 8
    assert alpha == pytest.approx(break_even_alpha(8, 0.01, 0.07, 0.03), abs=1e-12)
    assert 0.0 < alpha < 1.0
