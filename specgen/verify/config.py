"""What `specgen verify` runs: its settings (`VerifyConfig`), defaults and prompts, and the
drafter each sampling setting is checked with (`drafter_factory`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specgen.engine import Drafter
from specgen.errors import ConfigError
from specgen.flags import SamplingFlags, at_least, seed_or_random
from specgen.genconfig import grammar_spec
from specgen.generate import VerifyRule
from specgen.sampling import SamplingParams
from specgen.verify.options import VerifyFlags

if TYPE_CHECKING:
    from specgen.grammarspec import GrammarSpec

Progress = Callable[[str], None]
DrafterFactory = Callable[[SamplingParams], Drafter]
"""Builds the drafter for a given sampling setting (a model drafter samples with it)."""

GREEDY = SamplingParams(temp=0.0)
DEFAULT_SAMPLING_PARAMS = SamplingParams(temp=1.0, top_k=40, top_p=1.0, min_p=0.0)
"""High temperature and top-k only: wide support, so a wrong rule has room to show."""
SAMPLING_FLAGS = SamplingFlags(temp=1.0, top_k=40, top_p=1.0, min_p=0.0, seed=0)
"""The sampling check's settings when none are given (`specgen verify`'s defaults: these
params, seed 0)."""
UNUSED = ("max_tokens", "stop", "ignore_eos", "logprobs")
"""Settings the checks fix themselves (their lengths, no stop, every token's own test)."""
ARGUMENTS = ("samples", "positions", "draft_max", "alpha", "check", "prompts", "progress")
"""`Pair.verify`'s own keyword arguments (a misspelt one is matched against them too)."""

GREEDY_PROMPTS: tuple[bytes, ...] = (
    b"The history of the Roman Empire begins",
    b"def fibonacci(n):\n",
    b"Once upon a time, in a small village,",
)
SAMPLING_PROMPTS: tuple[bytes, ...] = (
    b"My favourite colour is",
    b"The weather today is",
)
NOISE_GAP_LOGITS = 0.05
"""Floor of the near-tie threshold, in logits (see `specgen.verify.greedy`)."""


@dataclass(frozen=True)
class VerifyConfig:
    """What `verify` runs.

    Attributes:
        samples: N, speculative generations per sampling prompt.
        positions: m, generated tokens checked per sample (positions 1..m).
        k: block size of the sampling check (the loop caps it at m - 1, so the first
            block spans positions 1..K and the bonus token lands at K + 1).
        params: sampling settings of the sampling check.
        seed: fixes every random stream (sample i uses a seed derived from it).
        alpha: family-wise significance level after the Holm correction.
        min_group: smallest prefix group tested at positions >= 2.
        greedy_ks: block sizes of the greedy check.
        greedy_tokens: tokens generated per greedy case.
        noise_gap: floor of the greedy near-tie threshold, logits.
        greedy_prompts, sampling_prompts: UTF-8 prompts.
        greedy, sampling: run that check.
        verify_rule: the acceptance rule both checks run under (`--verify`).
        grammar: what the output must match (--grammar, --json-schema...), or None. Both
            checks then run under it: greedy speculative output must equal ordinary
            constrained decoding, and the sampling check's exact law at each position is
            the grammar's mask then the warpers (`specgen.grammar`).
    """

    samples: int = 400
    positions: int = 3
    k: int = 3
    params: SamplingParams = DEFAULT_SAMPLING_PARAMS
    seed: int = 0
    alpha: float = 1e-3
    min_group: int = 20
    greedy_ks: tuple[int, ...] = (4, 8)
    greedy_tokens: int = 48
    noise_gap: float = NOISE_GAP_LOGITS
    greedy_prompts: tuple[bytes, ...] = GREEDY_PROMPTS
    sampling_prompts: tuple[bytes, ...] = SAMPLING_PROMPTS
    greedy: bool = True
    sampling: bool = True
    verify_rule: VerifyRule = "token"
    grammar: GrammarSpec | None = None

    def __post_init__(self) -> None:
        if self.sampling:
            at_least("--samples", self.samples, 20)
            if self.positions < 2:  # the block is K = positions - 1 long: none at 1
                raise ConfigError(
                    f"--positions must be at least 2 (a block of positions - 1 drafted tokens,"
                    f" then the bonus token), got {self.positions}"
                )
            at_least("--draft-max", self.k, 1)
            if self.params.greedy:
                raise ConfigError("the sampling check needs --temp > 0")
        if not 0.0 < self.alpha < 1.0:
            raise ConfigError(f"--alpha must be in (0, 1), got {self.alpha}")
        if not (self.greedy or self.sampling):
            raise ConfigError("nothing to verify: both checks are off")


def config_of(sampling: SamplingFlags, options: VerifyFlags) -> VerifyConfig:
    """What `specgen verify` and `specgen.Pair.verify` run: `sampling`'s params, seed
    (None or -1: random), verification rule and grammar, and verify's own `options`
    (`prompts`: both checks' prompts instead of the built-in ones).

    Raises:
        ConfigError: a setting out of range (`VerifyConfig`); a grammar file that cannot be
            read.
        GrammarError: a schema that is not JSON.
    """
    o = options
    extra: dict[str, Any] = {}
    if o.prompts:
        encoded = tuple(p.encode("utf-8", "surrogateescape") for p in o.prompts)
        extra = {"greedy_prompts": encoded, "sampling_prompts": encoded}
    return VerifyConfig(
        samples=o.samples, positions=o.positions, k=o.draft_max, params=sampling.params(),
        seed=seed_or_random(sampling.seed), alpha=o.alpha, greedy=o.check in ("all", "greedy"),
        sampling=o.check in ("all", "sampling"),
        verify_rule=sampling.verify_rule,  # type: ignore[arg-type]
        grammar=grammar_spec(sampling), **extra,
    )  # fmt: skip


def drafter_factory(drafter: Drafter | None) -> DrafterFactory:
    """A factory over a loaded drafter: a `ModelDrafter` is rebuilt on the same engine for
    each sampling setting (its q must come from the setting it samples with); other
    drafters (prompt lookup) are returned as they are.

    Raises:
        ConfigError: no drafter (``--draft none``): there is nothing to verify.
    """
    if drafter is None:
        raise ConfigError("verify needs a draft: pass --draft MODEL or 'ngram', not 'none'")
    return drafter.with_params
