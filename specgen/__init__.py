"""specgen: exact speculative decoding on llama.cpp.

The public Python API (see the README's "Python API")::

    import specgen

    with specgen.load() as pair:  # the demo pair; or load("target.gguf", "draft.gguf")
        result = pair.generate("Once upon a time", max_tokens=64, temperature=0)
        print(result.text, result.acceptance_rate)
        for event in pair.stream("def fib(n):", max_tokens=32):
            ...

`load`, `Pair`, `Result` and the events (`Prefilled`, `Step`, `Done`) live in `specgen.api`,
imported on first use: ``import specgen`` stays cheap (no numpy, no llama.cpp) for the CLI's
start-up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Done", "Pair", "Prefilled", "Result", "Step", "__version__", "load"]
_API = ("Done", "Pair", "Prefilled", "Result", "Step", "load")

if TYPE_CHECKING:
    from specgen.api import Done, Pair, Prefilled, Result, Step, load


def __getattr__(name: str) -> Any:
    # start-up time: specgen.api loads numpy and llama.cpp, which `specgen --help` must not
    if name in _API:
        from specgen import api

        return getattr(api, name)
    raise AttributeError(f"module 'specgen' has no attribute {name!r}")
