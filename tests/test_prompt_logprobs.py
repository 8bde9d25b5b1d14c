"""The prompt's log-probabilities (`GenerateConfig.prompt_logprobs`: what the server's
``echo`` with ``logprobs`` reports), on fake engines whose every row is known: each prompt
token after the first under the target's row at the position before it, exactly, in
chunks of at most prompt_rows_chunk rows, whatever shares the batch, with no cached prefix
kept, and without changing what is generated."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import FakeBatchEngine

from specgen.drafters import ModelDrafter
from specgen.events import Done, Prefilled, Step
from specgen.genconfig import prompt_rows_chunk
from specgen.generate import FixedK, GenerateConfig, generate
from specgen.logprobs import log_softmax_at, top_ids
from specgen.sampling import SamplingParams
from specgen.sched.jobs import Job
from specgen.sched.scheduler import Scheduler

V = 6
SAMPLED = SamplingParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.0)


def make(n_parallel: int = 3, n_batch: int = 64) -> tuple[Scheduler, FakeBatchEngine]:
    target = FakeBatchEngine(n_parallel, n_batch, n_vocab=V, seed=0, n_ctx=256)
    draft = FakeBatchEngine(n_parallel, n_batch, n_vocab=V, seed=0, noise=1.0, n_ctx=256)
    drafter = ModelDrafter(draft, SAMPLED, V)
    return Scheduler(target, drafter, n_parallel=n_parallel, queue_max=64, draft_max=3), target


def run(sched: Scheduler, jobs: list[tuple[list[int], GenerateConfig]]) -> list[list[object]]:
    sinks: list[list[object]] = [[] for _ in jobs]
    for i, (prompt, config) in enumerate(jobs):
        sched.submit(Job(f"j{i}", prompt, config), sinks[i].append)
    sched.run_until_idle()
    return sinks


def expected(target: FakeBatchEngine, prompt: list[int], n_top: int) -> list[tuple]:
    """(token, logprob, top ids) of prompt tokens 2..n from the model's own rows."""
    out = []
    for i in range(1, len(prompt)):
        row = target.model.logits_after(prompt[:i])
        top = top_ids(row, n_top) if n_top else np.zeros(0, dtype=np.int64)
        out.append((prompt[i], float(log_softmax_at(row, np.array([prompt[i]]))[0]), list(top)))
    return out


def got(prefilled: Prefilled) -> list[tuple]:
    assert prefilled.prompt_logprobs is not None
    return [(t.token, t.logprob, [a.token for a in t.top]) for t in prefilled.prompt_logprobs]


def test_each_prompt_token_is_scored_by_the_row_before_it_in_a_shared_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("specgen.genconfig.PROMPT_ROWS_BYTES", 0)  # the floor: 32 rows
    sched, target = make(n_batch=128)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, V, size=n).tolist() for n in (5, 40, 75)]
    configs = [GenerateConfig(8, SAMPLED, seed=i, prompt_logprobs=2) for i in range(3)]
    sinks = run(sched, list(zip(prompts, configs, strict=True)))
    assert any(len(b) > 1 for b in target.batches)  # the prompts shared decodes
    for prompt, sink in zip(prompts, sinks, strict=True):
        assert isinstance(sink[0], Prefilled) and isinstance(sink[-1], Done)
        assert got(sink[0]) == expected(target, prompt, 2)
        for t in sink[0].prompt_logprobs or ():
            assert [a.logprob for a in t.top] == sorted((a.logprob for a in t.top), reverse=True)
    # a row per prompt token, at most 32 a step (and the first round's own row with the
    # last chunk)
    rows = [n for b in target.batches for _, _, n in b]
    assert max(rows) <= 32 + 1 and sum(rows) >= sum(len(p) for p in prompts)


def test_a_steps_prompt_rows_are_bounded_by_their_bytes() -> None:
    assert [prompt_rows_chunk(v) for v in (6, 49_152, 151_936, 262_144)] == [256, 256, 110, 64]
    assert prompt_rows_chunk(1 << 22) == 32  # a floor: a huge vocabulary still progresses


def test_asking_changes_nothing_generated_and_others_get_no_prefilled() -> None:
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, V, size=50).tolist()
    plain = GenerateConfig(16, SAMPLED, seed=7)
    scored = GenerateConfig(16, SAMPLED, seed=7, prompt_logprobs=0)
    a, b = run(make()[0], [(prompt, plain), (prompt, scored)])
    assert not any(isinstance(e, Prefilled) for e in a)  # a server job that did not ask
    assert isinstance(b[0], Prefilled)
    assert a[-1].tokens == b[-1].tokens  # type: ignore[attr-defined]


def test_a_cached_prefix_is_evaluated_again_for_its_rows() -> None:
    sched, target = make(n_parallel=1)
    prompt = np.random.default_rng(2).integers(0, V, size=30).tolist()
    run(sched, [(prompt, GenerateConfig(4, SAMPLED, seed=1))])  # the slot keeps its cells
    (sink,) = run(sched, [(prompt + [1, 2], GenerateConfig(4, SAMPLED, prompt_logprobs=1))])
    assert got(sink[0]) == expected(target, prompt + [1, 2], 1)


def test_max_tokens_zero_scores_the_prompt_alone() -> None:
    sched, target = make(n_parallel=2)
    prompt = np.random.default_rng(3).integers(0, V, size=12).tolist()
    (sink,) = run(sched, [(prompt, GenerateConfig(0, SAMPLED, prompt_logprobs=1))])
    assert [type(e) for e in sink] == [Prefilled, Done]
    done = sink[-1]
    assert isinstance(done, Done) and done.tokens == () and done.finish_reason == "length"
    assert got(sink[0]) == expected(target, prompt, 1)
    # the prompt's rows and nothing after them: no round was decoded
    assert sum(n for b in target.batches for _, n, _ in b) == len(prompt) - 1


@pytest.mark.parametrize("n_top", [0, 3])
def test_the_single_stream_carries_them_on_its_prefilled(n_top: int) -> None:
    target = FakeBatchEngine(1, 64, n_vocab=V, seed=0, n_ctx=256)
    draft = FakeBatchEngine(1, 64, n_vocab=V, seed=0, noise=1.0, n_ctx=256)
    prompt = np.random.default_rng(4).integers(0, V, size=45).tolist()
    config = GenerateConfig(6, SAMPLED, seed=3, prompt_logprobs=n_top)
    drafter = ModelDrafter(draft.sequence(0), SAMPLED, V)
    events = list(generate(target.sequence(0), drafter, prompt, config, FixedK(2)))
    assert isinstance(events[0], Prefilled) and any(isinstance(e, Step) for e in events)
    assert got(events[0]) == expected(target, prompt, n_top)


def test_an_end_of_generation_token_carries_its_logprob_on_its_step() -> None:
    """OpenAI's completions list the end-of-generation token that ended a completion; a
    harness scoring a prompt by echo drops the last entry, so without it the prompt's
    last token would be dropped instead."""
    ended = 0
    for seed in range(12):
        target = FakeBatchEngine(1, 64, n_vocab=V, seed=0, n_ctx=256, eos=0)
        draft = FakeBatchEngine(1, 64, n_vocab=V, seed=0, noise=1.0, n_ctx=256, eos=0)
        prompt = [3, 1, 4, 1, 5]
        config = GenerateConfig(30, SAMPLED, seed=seed, logprobs=2)
        drafter = ModelDrafter(draft.sequence(0), SAMPLED, V)
        events = list(generate(target.sequence(0), drafter, prompt, config, FixedK(2)))
        steps = [e for e in events if isinstance(e, Step)]
        done = events[-1]
        assert isinstance(done, Done)
        assert all(s.eos_logprob is None for s in steps[:-1])
        if done.finish_reason != "eos":
            assert steps[-1].eos_logprob is None
            continue
        ended += 1
        lp = steps[-1].eos_logprob
        assert lp is not None and lp.token == 0 and len(lp.top) == 2
        row = target.model.logits_after(prompt + list(done.tokens))
        assert lp.logprob == float(log_softmax_at(row, np.array([0]))[0])
    assert ended >= 3  # the check ran on generations that ended at EOS
