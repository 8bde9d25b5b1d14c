"""The settings of one generation (`GenerateConfig`), built the one way from what was asked
(`GenerateConfig.of`): the CLI's flags, the Python API's keyword arguments, a server
request and each bench configuration all come here through a `SamplingFlags`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from specgen.errors import ConfigError
from specgen.sampling import SamplingParams

if TYPE_CHECKING:
    from collections.abc import Sequence

    from specgen.flags import SamplingFlags
    from specgen.grammarspec import GrammarSpec

VerifyRule = Literal["token", "block"]
VERIFY_RULES: tuple[VerifyRule, ...] = ("token", "block")

#: the logits a step may hold for prompt rows (`prompt_rows_chunk`), bytes
PROMPT_ROWS_BYTES = 64 << 20


def prompt_rows_chunk(n_vocab: int) -> int:
    """The most prompt tokens one step evaluates for a generation that asks for the
    prompt's log-probabilities: each needs a logits row of `n_vocab` float32, so a long
    prompt's rows come in steps of `PROMPT_ROWS_BYTES` (64 rows of Gemma's 262,144
    entries, about 6 ms of output layer each on two cores), between 32 and 256 rows.
    Larger decodes are faster per row, and with llama.cpp's flash attention more
    precise (docs/measurements/2026-12-06-lm-eval.md)."""
    return max(32, min(256, PROMPT_ROWS_BYTES // (4 * n_vocab)))


@dataclass(frozen=True)
class GenerateConfig:
    """Settings of one generation.

    Attributes:
        max_tokens: `-n`, tokens to emit at most.
        params: sampling settings for both p and q.
        stop: stop strings (cut exactly).
        ignore_eos: do not stop at end-of-generation tokens.
        stop_token_ids: token ids that end the generation when emitted, finish "stop",
            the token kept in the output (vLLM's ``stop_token_ids``); with `ignore_eos`
            too. The law of the tokens before it is unchanged.
        include_stop: keep the stop string that ended the output in its text (vLLM's
            ``include_stop_str_in_output``).
        min_tokens: the output cannot end before this many tokens (vLLM's ``min_tokens``):
            at those positions the end-of-generation tokens and `stop_token_ids` are held
            back in the target's rows and the draft's alike (`specgen.constraints.MinTokens`:
            the target's law is that of the rows so processed), and a stop string ends the
            output only where it ends in a later token. 0 = off; at most `max_tokens`;
            not with a grammar (ConfigError, raised when the settings are built).
        seed: seeds both random streams (draft sampling, acceptance); None = random.
        measure_ordinary: single-token target passes timed after the prompt to measure the
            ordinary-decoding baseline (0 = skip); each is rolled back. With an adaptive
            policy (not FixedK) and a model drafter, as many draft passes are timed too.
        trace: attach a `RoundTrace` to every Step (`--trace`).
        reuse_cache: keep the target's cached common prefix with the prompt (a chat's
            earlier turns) instead of evaluating the whole prompt again. Off by default so
            that measurements (bench, verify) always pay a full prefill.
        verify_rule: `--verify`: "token" (token-wise rejection, Leviathan et al.) or
            "block" (block verification, Sun et al. 2025); both are exact.
        grammar: what the output must match (`--grammar`, `--json-schema`, a request's
            response_format...), or None. Its mask applies to the target's rows and the
            draft's alike, before the warpers (`specgen.grammar`); generation ends with
            finish "stop" when the grammar is complete.
        logprobs: `--logprobs N`: each emitted token's `Span.logprob` with the N most
            likely alternatives (0..20, `specgen.logprobs`); None (the default) computes
            nothing. While it is None a proposer may skip target rows it does not need
            (`wants_logprobs`): with it set every emitted token needs its row.
        prompt_logprobs: the prompt's log-probabilities too (vLLM's ``prompt_logprobs``;
            OpenAI's ``echo`` with ``logprobs``): each prompt token after the first under
            the target's row at the position before it, with this many alternatives
            (0..20), carried by the `Prefilled` event. The whole prompt is then evaluated
            (no cached prefix is kept: its rows are gone), with a row per token, in chunks
            of at most `prompt_rows_chunk` tokens. None (the default) computes nothing.
        prediction: token ids of a predicted output (OpenAI's Predicted Outputs
            ``prediction``): prompt lookup matches the output against them as well as
            against the context (`specgen.ngram.NgramIndex.predict`), so a drafter with
            prompt lookup (`--draft ngram`, `--lookup on|auto`) proposes its tokens where
            the output follows it. It changes which tokens are proposed, never the
            output's law; a drafter without prompt lookup does not read it.
    """

    max_tokens: int = 256
    params: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    include_stop: bool = False
    min_tokens: int = 0
    seed: int | None = None
    measure_ordinary: int = 0
    trace: bool = False
    reuse_cache: bool = False
    verify_rule: VerifyRule = "token"
    grammar: GrammarSpec | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    prediction: tuple[int, ...] = ()

    @classmethod
    def of(
        cls,
        sampling: SamplingFlags,
        seed: int | None,
        *,
        grammar: GrammarSpec | None = None,
        measure_ordinary: int = 0,
        trace: bool = False,
        reuse_cache: bool = False,
        prompt_logprobs: int | None = None,
        prediction: Sequence[int] = (),
    ) -> GenerateConfig:
        """The one way from what was asked to a generation's settings: every door builds a
        `SamplingFlags` (the CLI from its flags, the Python API from keyword arguments,
        the server from a request over its start flags, bench per configuration) and
        comes here. A new sampling setting is a `SamplingFlags` field mapped here.

        Args:
            sampling: the settings asked for (validated when built).
            seed: the seed to use (`specgen.flags.seed_or_random` of ``sampling.seed``),
                or None for a fresh one.
            grammar: what the output must match when it does not come from `sampling`'s
                grammar flags (a request's ``response_format``); None = theirs.
            measure_ordinary, trace, reuse_cache: how this generation runs (see above).
            prompt_logprobs: the prompt's log-probabilities with this many alternatives
                (see above), or None.
            prediction: ``sampling.prediction`` tokenized (the caller holds the
                tokenizer: `specgen.apiengine.predicted`), or a request's; only its first
                ``max_tokens`` tokens are kept (a longer one cannot be followed to its end).

        Raises:
            ConfigError: --top-p or --min-p, a penalty or a bias out of range
                (`SamplingFlags.params`), a grammar file that cannot be read.
        """
        return cls(
            max_tokens=sampling.max_tokens,
            params=sampling.params(),
            stop=sampling.stop,
            ignore_eos=sampling.ignore_eos,
            min_tokens=sampling.min_tokens,
            seed=seed,
            measure_ordinary=measure_ordinary,
            trace=trace,
            reuse_cache=reuse_cache,
            verify_rule=sampling.verify_rule,  # type: ignore[arg-type]
            grammar=grammar if grammar is not None else grammar_spec(sampling),
            logprobs=sampling.logprobs,
            prompt_logprobs=prompt_logprobs,
            prediction=tuple(int(t) for t in prediction[: sampling.max_tokens]),
        )

    def __post_init__(self) -> None:
        m = self.min_tokens
        if m < 0:
            raise ConfigError(f"min_tokens must be 0 or more, got {m}")
        if m and m > self.max_tokens:
            raise ConfigError(
                f"min_tokens {m} is more than the {self.max_tokens} tokens this output may"
                " have (its max_tokens)"
            )
        if m and self.grammar is not None:
            # the grammar decides where the output may end: a complete text allows nothing
            # but an end, which min_tokens would hold back (a row with no law)
            raise ConfigError(
                f"min_tokens cannot be used with a grammar ({self.grammar.source}): the"
                " grammar decides where the output ends"
            )

    @property
    def wants_logprobs(self) -> bool:
        """Whether emitted tokens carry their log-probabilities (every one needs its row)."""
        return self.logprobs is not None

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Whether the prompt's own tokens are scored: every prompt position needs its row,
        so no cached prefix can be reused (the slot keeps none)."""
        return self.prompt_logprobs is not None


def grammar_spec(sampling: SamplingFlags) -> GrammarSpec | None:
    """The grammar of `sampling`'s --grammar, --grammar-file, --json-schema or
    --json-schema-file (`specgen.grammarspec.spec_of`), or None.

    Raises:
        ConfigError: a file that cannot be read; GrammarError: a schema that is not JSON.
    """
    s = sampling
    given = (s.grammar, s.grammar_file, s.json_schema, s.json_schema_file)
    if all(v is None for v in given):
        return None  # llguidance is not even loaded
    from specgen.grammarspec import spec_of

    return spec_of(*given)
