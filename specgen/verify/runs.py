"""What both checks share: a run of the loop at a fixed K, and the processing (grammar mask,
bias, penalties) a run applied to each target row before the warpers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from specgen.constraints import Chain, Processor, processor_for
from specgen.engine import Drafter, Engine
from specgen.events import Done, RoundTrace, Step
from specgen.generate import FixedK, GenerateConfig, generate
from specgen.sampling import SamplingParams

if TYPE_CHECKING:
    from specgen.grammarspec import GrammarSpec


def processor(
    target: Engine, params: SamplingParams, grammar: GrammarSpec | None, n_prompt: int
) -> Processor | None:
    """What the runs did to each target row before the warpers: the grammar's mask (after
    the generated tokens), then the logit bias and penalties; None when nothing is set."""
    proc = processor_for(params.constraints, target.n_vocab)
    if grammar is None:
        return proc
    # start-up time: llguidance loads only for a grammar
    from specgen.grammarrows import grammar_factory

    mask = grammar_factory(grammar)(target, n_prompt)
    return mask if proc is None else Chain([mask, proc])


def run(
    target: Engine,
    drafter: Drafter | None,
    prompt: list[int],
    config: GenerateConfig,
    k: int,
) -> tuple[Done, list[RoundTrace]]:
    """Generate from `prompt` at a fixed block size k (0: ordinary decoding): the Done and
    the rounds' traces (empty unless `config.trace`)."""
    done: Done | None = None
    traces: list[RoundTrace] = []
    # the first round speculates too: every tested position must go through the rule
    for ev in generate(target, drafter, prompt, config, FixedK(k), ordinary_first=False):
        if isinstance(ev, Step) and ev.trace is not None:
            traces.append(ev.trace)
        elif isinstance(ev, Done):
            done = ev
    assert done is not None
    return done, traces
