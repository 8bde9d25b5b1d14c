"""specgen: exact speculative decoding on llama.cpp.

The public Python API (see docs/guides/python.md)::

    import specgen

    with specgen.load() as pair:  # the demo pair; or load("target.gguf", "draft.gguf")
        result = pair.generate("Once upon a time", max_tokens=64, temperature=0)
        print(result.text, result.acceptance_rate, result.stats.wall_s)
        for event in pair.stream("def fib(n):", max_tokens=32):
            ...
        reply = pair.chat([{"role": "user", "content": "Hi"}])  # an instruct target

`load`, `Pair`, `Generation` and `Result` come from `specgen.api`, imported on first use:
``import specgen`` stays cheap (no numpy, no llama.cpp) for the CLI's start-up. So do the
batch engine's (`Pair.scheduler`, what `specgen serve` drives): `Scheduler`, the `Job`
it takes with its `GenerateConfig`, the `Ticket` it gives, the `Failed` event, the
`BatchReport` of each step and its refusals `QueueFull` and `DoesNotFit`. The events
(`Prefilled`, `Step`, `Done`, `Span`, `Stats`), the settings (`ModelFlags`,
`SamplingFlags`) and the errors are cheap modules of their own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specgen.errors import (
    BusyError,
    ChatTemplateError,
    ConfigError,
    EngineError,
    GrammarError,
    ModelFileError,
    ModelLoadError,
    PromptError,
    SpecgenError,
    VocabMismatchError,
)
from specgen.events import ACCEPTANCE_HOW, Done, FinishReason, Prefilled, Span, Stats, Step
from specgen.flags import ModelFlags, SamplingFlags

__version__ = "0.1.0"
#: the names imported on first use, and their modules
_LAZY = {
    **dict.fromkeys(("Generation", "Pair", "Result", "load"), "specgen.api"),
    "Scheduler": "specgen.sched.scheduler",
    **dict.fromkeys(
        ("BatchReport", "DoesNotFit", "Failed", "Job", "QueueFull", "Ticket"), "specgen.sched.jobs"
    ),
    "GenerateConfig": "specgen.genconfig",
}
__all__ = [
    "ACCEPTANCE_HOW",
    "BatchReport",
    "BusyError",
    "ChatTemplateError",
    "ConfigError",
    "EngineError",
    "DoesNotFit",
    "Done",
    "Failed",
    "FinishReason",
    "GenerateConfig",
    "Generation",
    "GrammarError",
    "Job",
    "ModelFileError",
    "ModelFlags",
    "ModelLoadError",
    "Pair",
    "Prefilled",
    "PromptError",
    "QueueFull",
    "Result",
    "SamplingFlags",
    "Scheduler",
    "Span",
    "SpecgenError",
    "Stats",
    "Step",
    "Ticket",
    "VocabMismatchError",
    "__version__",
    "load",
]

if TYPE_CHECKING:
    from specgen.api import Generation, Pair, Result, load
    from specgen.genconfig import GenerateConfig
    from specgen.sched.jobs import BatchReport, DoesNotFit, Failed, Job, QueueFull, Ticket
    from specgen.sched.scheduler import Scheduler


def __getattr__(name: str) -> Any:
    # start-up time: specgen.api loads numpy and llama.cpp, which `specgen --help` must not
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'specgen' has no attribute {name!r}")


def __dir__() -> list[str]:
    # the lazy names too (PEP 562), so that completion and dir() list what is exported
    return sorted({*globals(), *__all__})
