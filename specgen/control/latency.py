"""Latency targets (issue 37): whether a step at some K per slot is predicted to break the
time-to-first-token target (--slo-ttft) or a request's time-per-output-token target
(--slo-tpot), and the best choice with fewer draft depths that keeps them
(`Targets.within`, under `specgen.control.batch.BatchController.choose`).

TPOT here is each request's mean since its first token, with this step's seconds and its
E_i(K_i) added: what `specgen bench` and SLO goodput count (DistServe's and vLLM's
definition). A request whose blocks have kept it ahead of the target has time in hand for
the long steps of others; one that has fallen behind binds. A target the ordinary step
breaks already is held to that step's length instead: the shortest there is (a TPOT target
of 0 is that step's own, `Targets`). Where the best choice breaks one, a draft depth is
dropped at a time and the ratio solved again, down to K = 0. (A bound on each step
instead, the step's seconds over E_i(K_i), bound nearly every step of a batch with one
slot that accepts little.)

Pure: numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specgen.control.costs import Line
from specgen.control.goodput import Choice, SlotInput, choose, expected_gains, step_seconds


@dataclass(frozen=True)
class StepCosts:
    """The cost lines one step is predicted from (`BatchController.costs`).

    Attributes:
        target: seconds of a target decode by its rows.
        draft: seconds of one draft depth by the slots drafting it.
        spec_s: seconds a speculating step costs beyond its rows and depths.
        token_s: seconds of a draft token without a logits row (a catch-up's).
    """

    target: Line
    draft: Line
    spec_s: float
    token_s: float

    def whole(self, ks: Sequence[int], slots: Sequence[SlotInput], fixed_s: float) -> float:
        """Predicted seconds of a step at `ks` with every catch-up paid whole (what the
        step really lasts: `Choice.step_s` charges a catch-up by its share, a price)."""
        whole = [SlotInput(s.alpha_by_pos, s.k_max, s.catch_up, 0, s.free) for s in slots]
        return step_seconds(ks, self.target, self.draft, fixed_s, whole, self.spec_s, self.token_s)

    def choose(self, slots: Sequence[SlotInput], fixed_s: float, weight: float = 1.0) -> Choice:
        """`goodput.choose` over these lines."""
        return choose(slots, self.target, self.draft, fixed_s, self.spec_s, self.token_s, weight)


@dataclass(frozen=True)
class Targets:
    """The operator's latency targets in seconds (None: none). A TPOT target of 0 is
    ordinary decoding's own: each step's predicted length with every slot at K = 0 (the
    batch as it is now), so that no request streams slower per token than it would
    without speculation, while one that runs ahead of it has time in hand for others'
    blocks (a fairness rule, issue 37: "no slot starves while others speculate")."""

    ttft_s: float | None = None
    tpot_s: float | None = None

    def broken(
        self,
        costs: StepCosts,
        slots: Sequence[SlotInput],
        streams: Sequence[tuple[float, int]],
        ks: Sequence[int],
        waiting_s: Sequence[float],
        fixed_s: float,
    ) -> str | None:
        """The target the step at `ks` is predicted to break ("slo_ttft", "slo_tpot"), or
        None. `streams`: per slot, (seconds since its first token, tokens sent since)
        (`SlotState.streamed_s`, `streamed`); `waiting_s`: per request waiting for its
        first token, the seconds since it arrived."""
        sec = costs.whole(ks, slots, fixed_s)
        sec0 = costs.whole([0] * len(slots), slots, fixed_s)
        eps = 1e-9
        if self.ttft_s is not None and waiting_s:
            if sec > max(self.ttft_s - max(waiting_s), sec0) + eps:
                return "slo_ttft"
        if self.tpot_s is not None:
            # 0: ordinary decoding's own TPOT at this batch, the step at K = 0
            target = self.tpot_s if self.tpot_s > 0 else sec0
            for s, k, (done_s, done) in zip(slots, ks, streams, strict=True):
                tokens = float(expected_gains(s.alpha_by_pos, k)[k])
                tpot = (done_s + sec) / (done + tokens)
                if tpot > max(target, (done_s + sec0) / (done + 1)) + eps:
                    return "slo_tpot"
        return None

    def within(
        self,
        costs: StepCosts,
        slots: Sequence[SlotInput],
        streams: Sequence[tuple[float, int]],
        got: Choice,
        waiting_s: Sequence[float],
        fixed_s: float,
        weight: float,
    ) -> tuple[Choice, str | None]:
        """`got`, or the best choice with fewer draft depths that keeps the targets (one
        depth fewer at a time, each re-solved exactly by `goodput.choose`); K = 0
        everywhere at worst. Returns the choice and the target that bound it (None: none
        did)."""
        bound = None
        while any(got.k):
            broken = self.broken(costs, slots, streams, got.k, waiting_s, fixed_s)
            if broken is None:
                break
            bound = bound or broken
            depth = max(got.k) - 1
            capped = [
                SlotInput(
                    s.alpha_by_pos, min(s.k_max, depth), s.catch_up, s.left,
                    min(s.free, depth), s.run_rounds,
                )
                for s in slots
            ]  # fmt: skip
            got = costs.choose(capped, fixed_s, weight)
        return got, bound
