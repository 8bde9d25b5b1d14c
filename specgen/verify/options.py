"""verify's own options (`VerifyFlags`), apart from the checks: the CLI builds them at
start-up, and this module imports nothing heavy (no numpy, no llama.cpp)."""

from __future__ import annotations

from dataclasses import dataclass

from specgen.errors import ConfigError
from specgen.flags import check_types, parse_draft_max

CHECKS = ("all", "greedy", "sampling")
#: each field's flag, for messages (the Python API names them as its arguments)
VERIFY_FLAG = {
    "samples": "--samples",
    "positions": "--positions",
    "draft_max": "--draft-max",
    "alpha": "--alpha",
    "check": "--check",
    "prompts": "--prompt",
}


@dataclass(frozen=True)
class VerifyFlags:
    """verify's own options: `specgen verify`'s --samples, --positions, --draft-max,
    --alpha, --check, --prompt (repeatable) and `specgen.Pair.verify`'s keyword arguments of
    the same names (``prompts`` for --prompt). See
    `specgen.verify.config.VerifyConfig` for what each sets.

    Raises:
        ConfigError: naming the flag: a value of the wrong type (`check_types`: the Python
            API's ``samples="x"``), `check` not one of `CHECKS`, `draft_max` outside 1 to 64, an
            empty prompt (the ranges of the rest: `VerifyConfig`).
    """

    samples: int = 400
    positions: int = 3
    draft_max: int = 3
    alpha: float = 1e-3
    check: str = "all"
    prompts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # also one string for the prompts (a prompt), or None (Typer's none)
        check_types(self, VERIFY_FLAG)
        if self.check not in CHECKS:
            raise ConfigError(f"--check must be all, greedy or sampling, got {self.check!r}")
        parse_draft_max(str(self.draft_max))
        if any(not p for p in self.prompts):
            # an empty prompt leaves nothing to continue (run refuses one too)
            raise ConfigError("--prompt: a prompt is empty")
