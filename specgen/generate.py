"""`generate`: the driver of one `specgen.round.Sequence` (prefill, baseline, rounds, Done),
yielding typed events. The stages live in `specgen.stages`, the round in `specgen.round`;
their names are re-exported here for the callers that drive a generation."""

from __future__ import annotations

from collections.abc import Generator

from specgen.engine import Drafter, Engine, under
from specgen.events import Done, Prefilled, Step
from specgen.round import Clock, Sequence
from specgen.stages import (
    VERIFY_RULES,
    FixedK,
    GenerateConfig,
    KPolicy,
    VerifyRule,
    check_prompt,
    prefill,
)

__all__ = [
    "VERIFY_RULES",
    "Event",
    "FixedK",
    "GenerateConfig",
    "KPolicy",
    "VerifyRule",
    "check_prompt",
    "generate",
    "prefill",
]

Event = Prefilled | Step | Done


def generate(
    target: Engine,
    drafter: Drafter | None,
    prompt: list[int],
    config: GenerateConfig,
    policy: KPolicy | None = None,
    clock: Clock | None = None,
    ordinary_first: bool = True,
) -> Generator[Event, None, None]:
    """Generate from `prompt` (token ids), yielding Prefilled, then a Step per round,
    then Done. With `drafter=None` (or K = 0) this is ordinary decoding. The drafter
    samples under `config.params` (`specgen.engine.under`). The first round
    is an ordinary pass unless `ordinary_first` is False (`specgen.round.Sequence.prefill`:
    the first token at ordinary decoding's latency; the law of the output is the same
    either way). A consumer
    interrupted between events throws ``KeyboardInterrupt`` in (``.throw``): that is
    handled as Ctrl-C inside the loop (the next event is the Done).

    On every exit (limit, stop, EOS, Ctrl-C, exception, the consumer closing the
    generator) both caches are left holding the committed tokens except the last.

    Raises:
        PromptError: empty prompt, or no room in the context (raised by the call itself).
        ConfigError: a setting the engines refuse (a logit bias past the vocabulary),
            raised by the call itself.
        EngineError: llama.cpp failed.
        KeyboardInterrupt: Ctrl-C during the generation, raised on the next iteration
            after the Done (finish reason "interrupted" unless the last round had already
            ended the generation, whose own reason it then keeps).
    """
    # built now, not at the first event: a bad prompt or setting (a logit bias past the
    # vocabulary, checked when the drafter is rebuilt under the generation's settings) is
    # raised by the call itself; q under this generation's own settings, whatever the
    # drafter was loaded with
    drafter = under(drafter, config.params)
    return _drive(Sequence(target, drafter, prompt, config, policy, clock), ordinary_first)


def _drive(seq: Sequence, ordinary_first: bool) -> Generator[Event, None, None]:
    """`generate`'s events from a built Sequence (see there)."""
    # A flag, not the finish reason: a Ctrl-C that lands after the final round closed
    # the emitter (during its rollback or bookkeeping) must still reach the caller.
    interrupted = False
    try:
        yield seq.prefill(ordinary_first)
        while not seq.ended():
            yield seq.step()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        seq.rollback()  # the invariant, whatever happened
    yield seq.finish("interrupted" if interrupted else None)
    if interrupted:
        # Ctrl-C is never swallowed: the consumer gets the partial Done (`run` shows the
        # text), then the interrupt itself, so a caller looping over generations (bench,
        # verify) stops instead of carrying on with the next one.
        raise KeyboardInterrupt
