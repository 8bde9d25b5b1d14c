"""`specgen verify`'s entry point: run the checks a `VerifyConfig` selects and return what
they found (`VerifyReport`). Returns data; never prints (the CLI renders it)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from specgen.engine import Engine
from specgen.verify.config import DrafterFactory, Progress, VerifyConfig
from specgen.verify.greedy import GreedyCase, check_greedy
from specgen.verify.sampling import SamplingResult, check_sampling

HIGH_ACCEPTANCE = 0.9
"""Above this acceptance rate the report notes that residual bugs are hard to see."""


@dataclass(frozen=True)
class VerifyReport:
    """Everything `verify` found. `verdict`: "fail" (a check failed), "untested" (nothing
    failed, but a check tested nothing of speculation: the sampling check had no position
    with enough samples, or its draft proposed nothing; the greedy check's draft proposed
    nothing), else "pass". `passed` (the verdict is a pass) decides the exit code: 0,
    else 1."""

    target: str
    draft: str
    greedy: tuple[GreedyCase, ...] = ()
    sampling: SamplingResult | None = None
    seconds: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)
    verify_rule: str = "token"
    grammar: str | None = None  # the grammar's source (--json-schema...), None for free text

    @property
    def greedy_passed(self) -> bool:
        return all(c.status != "fail" for c in self.greedy)

    @property
    def untested(self) -> bool:
        """A check ran but tested nothing of speculation (see `notes`)."""
        s = self.sampling
        greedy_empty = bool(self.greedy) and not any(c.n_drafted for c in self.greedy)
        return greedy_empty or (s is not None and (not s.tests or s.drafted == 0))

    @property
    def verdict(self) -> str:
        if not self.greedy_passed or (self.sampling is not None and not self.sampling.passed):
            return "fail"
        return "untested" if self.untested else "pass"

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (for `verify --json`)."""
        s = self.sampling
        return {
            "passed": self.passed,
            "verdict": self.verdict,
            "target": self.target,
            "draft": self.draft,
            "verify_rule": self.verify_rule,
            "grammar": self.grammar,
            "seconds": round(self.seconds, 3),
            "notes": list(self.notes),
            "greedy": [asdict(c) for c in self.greedy],
            "sampling": None
            if s is None
            else {
                "passed": s.passed,
                "samples": s.samples,
                "positions": s.positions,
                "k": s.k,
                "params": asdict(s.params),
                "seed": s.seed,
                "alpha": s.alpha,
                "acceptance_rate": round(s.acceptance_rate, 6),
                "drafted": s.drafted,
                "seconds": round(s.seconds, 3),
                "tests": [asdict(t) for t in s.tests],
            },
        }


def verify(
    target: Engine,
    make_drafter: DrafterFactory,
    config: VerifyConfig,
    draft_name: str = "",
    progress: Progress | None = None,
) -> VerifyReport:
    """Run the checks `config` selects and return the report (prints nothing).

    Args:
        target: the target engine (its cache is used and left empty).
        make_drafter: builds the drafter for a sampling setting (`drafter_factory`).
        config: what to run.
        draft_name: for the report.
        progress: called with one-line status messages.
    """
    t0 = time.perf_counter()
    greedy = check_greedy(target, make_drafter, config, progress) if config.greedy else []
    sampling = check_sampling(target, make_drafter, config, progress) if config.sampling else None
    notes = []
    if sampling is not None and not sampling.tests and sampling.drafted:
        # (with nothing drafted the note below says why; more samples would not help)
        notes.append("no sampling test had enough samples: raise --samples")
    elif sampling is not None:
        missing = sorted(set(range(1, config.positions + 1)) - {t.position for t in sampling.tests})
        if missing:
            where = ", ".join(str(j) for j in missing)
            notes.append(
                f"position{'s' * (len(missing) > 1)} {where} had no prefix shared by"
                f" {config.min_group} samples: untested (raise --samples)"
            )
    if greedy and not any(c.n_drafted for c in greedy):
        notes.append(
            "the draft proposed nothing in the greedy check (a grammar forcing every token,"
            " or prompt lookup finding no repeat?): it compared ordinary decoding with"
            " itself, not speculation; give prompts it drafts for (--prompt)"
        )
    if sampling is not None and sampling.drafted == 0:
        notes.append(
            "the draft proposed nothing on the sampling prompts (prompt lookup finds no"
            " repeat in them?): the check compared ordinary decoding with the target's law,"
            " not speculation; give prompts it drafts for (--prompt)"
        )
    if sampling is not None and sampling.drafted and sampling.acceptance_rate > HIGH_ACCEPTANCE:
        notes.append(
            f"acceptance is {sampling.acceptance_rate:.0%}: only the rejected"
            f" {1 - sampling.acceptance_rate:.0%} of proposals go through the residual, so a"
            " residual bug moves little mass; raise --samples (or --temp) for more power"
        )
    return VerifyReport(
        target=target.name,
        draft=draft_name,
        greedy=tuple(greedy),
        sampling=sampling,
        seconds=time.perf_counter() - t0,
        notes=tuple(notes),
        verify_rule=config.verify_rule,
        grammar=config.grammar.source if config.grammar is not None else None,
    )
