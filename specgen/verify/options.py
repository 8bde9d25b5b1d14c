"""verify's own options (`VerifyFlags`), apart from the checks: the CLI builds them at
start-up, and this module imports nothing heavy (no numpy, no llama.cpp)."""

from __future__ import annotations

from dataclasses import dataclass

from specgen.errors import ConfigError
from specgen.flags import parse_draft_max

CHECKS = ("all", "greedy", "sampling")


@dataclass(frozen=True)
class VerifyFlags:
    """verify's own options: `specgen verify`'s --samples, --positions, --draft-max,
    --alpha, --check, --prompt (repeatable) and `specgen.Pair.verify`'s keyword arguments of
    the same names (``prompts`` for --prompt). See
    `specgen.verify.config.VerifyConfig` for what each sets.

    Raises:
        ConfigError: `check` not one of `CHECKS`; `draft_max` not an integer from 1 to 64
            (the rest is checked by `VerifyConfig`).
    """

    samples: int = 400
    positions: int = 3
    draft_max: int = 3
    alpha: float = 1e-3
    check: str = "all"
    prompts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.check not in CHECKS:
            raise ConfigError(f"--check must be all, greedy or sampling, got {self.check!r}")
        if isinstance(self.draft_max, bool) or not isinstance(self.draft_max, int):
            raise ConfigError(f"--draft-max must be an integer, got {self.draft_max!r}")
        parse_draft_max(str(self.draft_max))
        prompts = self.prompts
        # Typer gives a list or None; a caller may give one string
        object.__setattr__(
            self, "prompts", (prompts,) if isinstance(prompts, str) else tuple(prompts or ())
        )
