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
``import specgen`` stays cheap (no numpy, no llama.cpp) for the CLI's start-up. The events
(`Prefilled`, `Step`, `Done`, `Span`, `Stats`), the settings (`ModelFlags`,
`SamplingFlags`) and the errors are cheap modules of their own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specgen.errors import (
    ChatTemplateError,
    ConfigError,
    GrammarError,
    ModelFileError,
    ModelLoadError,
    PromptError,
    SpecgenError,
    VocabMismatchError,
)
from specgen.events import ACCEPTANCE_HOW, Done, Prefilled, Span, Stats, Step
from specgen.flags import ModelFlags, SamplingFlags

__version__ = "0.1.0"
_API = ("Generation", "Pair", "Result", "load")
__all__ = [
    "ACCEPTANCE_HOW",
    "ChatTemplateError",
    "ConfigError",
    "Done",
    "Generation",
    "GrammarError",
    "ModelFileError",
    "ModelFlags",
    "ModelLoadError",
    "Pair",
    "Prefilled",
    "PromptError",
    "Result",
    "SamplingFlags",
    "Span",
    "SpecgenError",
    "Stats",
    "Step",
    "VocabMismatchError",
    "__version__",
    "load",
]

if TYPE_CHECKING:
    from specgen.api import Generation, Pair, Result, load


def __getattr__(name: str) -> Any:
    # start-up time: specgen.api loads numpy and llama.cpp, which `specgen --help` must not
    if name in _API:
        from specgen import api

        return getattr(api, name)
    raise AttributeError(f"module 'specgen' has no attribute {name!r}")
