"""The only door to llguidance: grammars and JSON schemas compiled once, a matcher per
sequence, token masks, forced tokens and rollback.

What a grammar does to sampling. At a position whose generated text so far is ``h`` (the
tokens after the prompt), the grammar allows a set A(h) of tokens; every other token's
logit is set to -inf *before* the warpers (top-k, top-p, min-p, temperature) and greedy's
argmax. That is llama.cpp's order when the grammar is applied first
(`common_sampler_sample` with ``grammar_first``, common/sampling.cpp: the grammar sampler
runs on the raw logits, then the chain) and the order every row-level rejection rule
needs: p_i and q_i are both "mask, then warp", so q_i is the law the draft really drew
x_i from and p_i the target's constrained law at that position.

The request's side, what a grammar is before compilation (`GrammarSpec`, its formats
and the JSON whitespace default), is `specgen.grammarspec`, which loads no llguidance.

End of generation: a matcher that is *stopped* (the grammar is complete and allows
nothing but an end-of-generation token) ends generation with finish reason ``stop``; where
the grammar is complete but could go on (``"yes" | "yes!"``), every end-of-generation
token of the vocabulary is allowed and the model chooses.

Costs, measured on this project's machine (FIELD.md): a tokenizer from a 262,144-token
llama.cpp vocabulary in 1.4 s (built once per model and kept, `tokenizer_for`), a rollback
in 0.01 ms. A full-vocabulary mask at a new state costs what the grammar makes it: 0.01-0.1
ms for a JSON schema or llama.cpp's json.gbnf, but 4-8 ms on that vocabulary for free text
at the grammar's top level (``root ::= [^\\n]*``), more than a target pass of the demo
pair. So a round computes each mask once (`MaskCache`: the target's row i follows the same
output as the draft's row i), and greedy computes none where a row's own argmax is allowed
(`GrammarProcessor.argmax_rows`, `GrammarProcessor.allows`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import threading
import warnings
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import llguidance
import numpy as np
import numpy.typing as npt
from llguidance.gbnf_to_lark import any_to_lark

from specgen.constraints import eog_ids, vocab_owner
from specgen.deepstack import on_deep_stack
from specgen.errors import GrammarError
from specgen.grammarspec import JSON_DEFAULTS, GrammarSpec, one_line

_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.int64)


# -- compilation (per spec, cached) ---------------------------------------------------


@functools.lru_cache(maxsize=256)
def _llg_grammar(spec: GrammarSpec) -> str:
    """llguidance's grammar definition for `spec` (not yet checked against a tokenizer)."""
    if spec.kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema(
            '{"type":"object"}',
            defaults=JSON_DEFAULTS,  # type: ignore[arg-type]
        )
    if spec.kind == "json_schema":
        try:
            return llguidance.LLMatcher.grammar_from_json_schema(
                spec.text,
                defaults=JSON_DEFAULTS,  # type: ignore[arg-type]
            )
        except ValueError as e:
            raise GrammarError(f"{spec.source}: {one_line(e)}") from None
    if spec.kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(spec.text)
    if spec.kind == "lark":
        return llguidance.LLMatcher.grammar_from_lark(spec.text)
    try:  # within `GrammarSpec`'s size limits for GBNF
        lark = any_to_lark(spec.text)
    except Exception as e:  # noqa: BLE001 - the converter raises bare Exceptions
        raise GrammarError(f"{spec.source}: GBNF does not parse: {one_line(e)}") from None
    return llguidance.LLMatcher.grammar_from_lark(lark)


# -- the tokenizer (per model, cached) ------------------------------------------------


class Vocabulary(Protocol):
    """What a tokenizer is built from: `specgen.engine.Engine`'s vocabulary methods. A
    llama.cpp engine also has ``llama_vocab()`` (the `llama_vocab` pointer), from which
    llguidance builds its tokenizer natively (`lltokenizer_from_vocab`)."""

    n_vocab: int

    def tokenize(self, text: bytes, add_special: bool = True) -> list[int]: ...

    def token_bytes(self, token: int) -> bytes: ...

    def is_eog(self, token: int) -> bool: ...


@dataclass(frozen=True)
class GrammarTokenizer:
    """llguidance's tokenizer for one model's vocabulary.

    Attributes:
        llt: the `llguidance.LLTokenizer`.
        n_vocab: the model's logits width (masks have this length).
        eog: every end-of-generation token id (llguidance allows them all where the grammar
            may end).
    """

    llt: llguidance.LLTokenizer
    n_vocab: int
    eog: tuple[int, ...]


_TOKENIZERS: weakref.WeakKeyDictionary[object, GrammarTokenizer] = weakref.WeakKeyDictionary()
_TOKENIZERS_LOCK = threading.Lock()


def tokenizer_for(vocab: Vocabulary) -> GrammarTokenizer:
    """The grammar tokenizer of `vocab`'s model, built once and kept as long as the model
    (a sequence view shares its engine's).

    Costs about 1.4 s for a 262,144-token vocabulary (FIELD.md), 0.3 s for SmolLM2's 49,152.
    """
    owner = vocab_owner(vocab)
    with _TOKENIZERS_LOCK:
        tok = _TOKENIZERS.get(owner)
        if tok is None:
            tok = _build_tokenizer(owner)
            _TOKENIZERS[owner] = tok
        return tok


def _build_tokenizer(vocab: Any) -> GrammarTokenizer:
    n = int(vocab.n_vocab)
    eog = eog_ids(vocab)
    if hasattr(vocab, "llama_vocab"):
        # imports llama_cpp: only for a llama.cpp vocabulary
        from llguidance.llamacpp import lltokenizer_from_vocab

        with warnings.catch_warnings():  # it calls llama_token_get_attr, deprecated
            warnings.simplefilter("ignore", DeprecationWarning)
            llt = lltokenizer_from_vocab(
                vocab.llama_vocab(), n_vocab=n, eos_token=list(eog) or None
            )
    else:
        llt = llguidance.LLTokenizer(
            llguidance.TokenizerWrapper(_PlainVocab(vocab, n, eog)),
            n_vocab=n,
            eos_token=list(eog) or None,
        )
    return GrammarTokenizer(llt, n, eog)


class _PlainVocab:
    """llguidance's `TokenizerWrapper` interface over an `Engine`'s vocabulary methods
    (fakes and any engine without a llama.cpp vocabulary). End-of-generation tokens are
    marked special by llguidance's convention (a 0xff byte in front)."""

    def __init__(self, vocab: Any, n: int, eog: tuple[int, ...]) -> None:
        self._vocab = vocab
        self.eos_token_id = eog[0] if eog else 0
        self.bos_token_id = None
        self.special_token_ids = list(eog)
        special = set(eog)
        self.tokens = [
            b"\xff" + (vocab.token_bytes(t) or f"<eog{t}>".encode())
            if t in special
            else vocab.token_bytes(t)
            for t in range(n)
        ]

    def __call__(self, text: bytes) -> list[int]:
        return list(self._vocab.tokenize(text, add_special=False))


# -- a compiled grammar and its matchers --------------------------------------------------


class Grammar:
    """A grammar compiled for one tokenizer: makes matchers (`matcher`).

    Build with `compile_grammar` (cached per tokenizer and spec)."""

    def __init__(self, spec: GrammarSpec, tokenizer: GrammarTokenizer, llg: str) -> None:
        self.spec = spec
        self.tokenizer = tokenizer
        # compiled once, on the deep stack (`compile_grammar`); a matcher is a copy of it
        self._start = llguidance.LLMatcher(tokenizer.llt, llg, log_level=0)

    def matcher(self) -> Matcher:
        """A fresh matcher at the start of the output."""
        return Matcher(self)

    def _new(self) -> llguidance.LLMatcher:
        return self._start.deep_copy()


_COMPILED: dict[tuple[int, GrammarSpec], Grammar] = {}
_COMPILED_LOCK = threading.Lock()
_COMPILED_MAX = 256


def compile_grammar(spec: GrammarSpec, tokenizer: GrammarTokenizer) -> Grammar:
    """`spec` compiled and checked against `tokenizer`, once per (tokenizer, spec); safe to
    call from any thread (the server compiles in its request handlers, off the step loop).

    Raises:
        GrammarError: the schema or grammar does not compile, uses what llguidance does
            not support, or matches no text at all (``{"$ref": "#"}``); the message names
            `spec.source` and the problem.
    """
    key = (id(tokenizer), spec)
    with _COMPILED_LOCK:
        hit = _COMPILED.get(key)
    if hit is not None and hit.tokenizer is tokenizer:
        return hit
    # a chain of thousands of rules recurses past a thread's default stack (`deepstack`)
    grammar = on_deep_stack(lambda: _compile(spec, tokenizer))
    with _COMPILED_LOCK:
        if len(_COMPILED) >= _COMPILED_MAX:
            _COMPILED.pop(next(iter(_COMPILED)))
        _COMPILED[key] = grammar
    return grammar


def _compile(spec: GrammarSpec, tokenizer: GrammarTokenizer) -> Grammar:
    llg = _llg_grammar(spec)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(llg, tokenizer.llt)
    if is_error:
        raise GrammarError(f"{spec.source}: {one_line(messages[0] if messages else 'invalid')}")
    grammar = Grammar(spec, tokenizer, llg)
    _probe_patterns(spec, tokenizer)
    grammar.matcher().n_allowed()  # an empty language is refused now, not mid-generation
    return grammar


_PATTERN = re.compile(r'"pattern"\s*:\s*("(?:[^"\\]|\\.)*")')


def _probe_patterns(spec: GrammarSpec, tokenizer: GrammarTokenizer) -> None:
    """Refuse a regular expression llguidance's lexer gives up on: alone (``regex``) it
    fails at the first token (a 400 mid-generation), but as a JSON Schema's ``pattern``
    it was dropped without a word (``"pattern": "(a{1000}){1000}"`` let ``"528.0..."``
    through). Each one, the schema's and the tools' ``pattern`` strings included, is tried
    alone on its first allowed token.

    Raises:
        GrammarError: naming the pattern and llguidance's message.
    """
    if spec.kind == "regex":
        patterns = [spec.text]
    else:
        patterns = []
        for literal in _PATTERN.findall(spec.text):
            with contextlib.suppress(ValueError):
                patterns.append(json.loads(literal))
    for rx in dict.fromkeys(patterns):
        try:
            m = llguidance.LLMatcher(
                tokenizer.llt, llguidance.LLMatcher.grammar_from_regex(rx), log_level=0
            )
        except ValueError:
            continue  # not this probe's to judge: the grammar compiled as a whole
        bits = np.zeros((1, (tokenizer.n_vocab + 31) // 32), dtype=np.int32)
        m.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        allowed = np.unpackbits(bits[0].view(np.uint8), bitorder="little")[: tokenizer.n_vocab]
        first = next((int(t) for t in np.flatnonzero(allowed) if t not in tokenizer.eog), None)
        if first is not None and not m.consume_token(first) or m.is_error():
            shown = rx if len(rx) <= 60 else rx[:59] + "…"
            raise GrammarError(
                f"{spec.source}: the pattern {shown!r} is too complex for the grammar engine"
                f" ({one_line(m.get_error())})"
            )


class MaskCache:
    """The masks one sequence's matchers computed, each under the exact output it follows
    (compared whole, so a hit is the mask of that state), the last `keep` of them.

    A round's two sides pass through the same states: the draft's row i and the target's
    row i both follow the committed output and x_1..x_{i-1}, and the next round's first
    rows follow the output just committed. One cache shared by the sequence's target and
    draft matchers computes each such mask once. Not thread-safe (one sequence's rounds
    run on one thread)."""

    def __init__(self, keep: int = 48) -> None:
        self.keep = keep
        self._at: dict[int, list[tuple[list[int], npt.NDArray[np.int32]]]] = {}
        self._order: deque[int] = deque()

    def get(self, tokens: list[int]) -> npt.NDArray[np.int32] | None:
        """The (1, words) int32 mask after `tokens` (the output so far), or None."""
        for seen, bits in self._at.get(len(tokens), ()):
            if seen == tokens:
                return bits
        return None

    def put(self, tokens: list[int], bits: npt.NDArray[np.int32]) -> None:
        """Keep `bits`, the mask after `tokens` (copied: the caller's list goes on)."""
        n = len(tokens)
        self._at.setdefault(n, []).append((list(tokens), bits))
        self._order.append(n)
        while len(self._order) > self.keep:
            old = self._order.popleft()
            entries = self._at[old]
            entries.pop(0)
            if not entries:
                del self._at[old]


class Matcher:
    """One sequence's position in a grammar: the tokens generated so far (`tokens`), what
    may come next (`allowed`, `mask`), what is forced (`forced`), rollback (`sync`).

    Not thread-safe; one per sequence and side (the target's rows and the draft's own).
    """

    def __init__(self, grammar: Grammar, cache: MaskCache | None = None) -> None:
        self.grammar = grammar
        self.n_vocab = grammar.tokenizer.n_vocab
        self._m = grammar._new()
        self.tokens: list[int] = []
        self._words = (self.n_vocab + 31) // 32
        self._bits = np.zeros((1, self._words), dtype=np.int32)
        self._bits_at = -1  # len(tokens) when _bits was computed; -1: stale
        self._cache = cache

    # -- state ---------------------------------------------------------------------------

    def sync(self, generated: Sequence[int]) -> bool:
        """Move to the state after `generated` (the output so far): roll back to the
        longest common prefix with `tokens`, then consume the rest.

        Returns:
            False when a token of `generated` is not allowed: the matcher then stands after
            the longest allowed prefix (`tokens`), and masks what may follow it.
        """
        mine = self.tokens
        n = 0
        limit = min(len(mine), len(generated))
        while n < limit and mine[n] == generated[n]:
            n += 1
        if n < len(mine):
            if not self._m.rollback(len(mine) - n):  # an error state must never pass silently
                raise GrammarError(f"{self.grammar.spec.source}: {one_line(self._m.get_error())}")
            del mine[n:]
            self._bits_at = -1
        for t in generated[n:]:
            if not self._consume(int(t)):
                return False
        return True

    def _consume(self, token: int) -> bool:
        if self._m.validate_tokens([token]) != 1:
            return False
        if not self._m.consume_token(token):  # validated: cannot happen, but never silently
            raise GrammarError(f"{self.grammar.spec.source}: {one_line(self._m.get_error())}")
        self.tokens.append(token)
        self._bits_at = -1
        return True

    @property
    def accepting(self) -> bool:
        """The output so far is complete under the grammar (it may still go on)."""
        return bool(self._m.is_accepting())

    @property
    def stopped(self) -> bool:
        """The grammar is complete and allows nothing more (but end-of-generation)."""
        return bool(self._m.is_stopped())

    # -- what comes next -----------------------------------------------------------------

    def _bitmask(self) -> npt.NDArray[np.int32]:
        if not self._at_hand():
            self._bits, self._bits_at = self._compute(), len(self.tokens)
        return self._bits[0]

    def _compute(self) -> npt.NDArray[np.int32]:
        bits = np.empty((1, self._words), dtype=np.int32)  # a new one: the cache keeps it
        self._m.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        if self._m.is_error():  # no way on: llguidance allows the end alone
            why = one_line(self._m.get_error())
            if "panic" in why:  # past its limits (65,535 symbols): said, not "no text"
                raise GrammarError(f"{self.grammar.spec.source}: too large ({why})")
            raise GrammarError(
                f"{self.grammar.spec.source}: the grammar allows no text from here"
                " (does it describe an empty language, such as a schema defined only by"
                " itself?)"
            )
        if self._cache is not None:
            self._cache.put(self.tokens, bits)
        return bits

    def _at_hand(self) -> bool:
        """Whether the mask here is computed or cached (then loaded), so costs nothing."""
        if self._bits_at != len(self.tokens) and self._cache is not None:
            hit = self._cache.get(self.tokens)
            if hit is not None:
                self._bits, self._bits_at = hit, len(self.tokens)
        return self._bits_at == len(self.tokens)

    def allows(self, token: int) -> bool:
        """Whether the mask allows `token` next: read off the mask when it is at hand
        (computed here or cached), else `ask`ed of llguidance where that is the same
        answer, else read off a new mask."""
        if 0 <= token < self.n_vocab and self._at_hand():
            return bool((int(self._bits[0][token >> 5]) >> (token & 31)) & 1)
        known = self.ask(token)
        if known is not None:
            return known
        return bool((int(self._bitmask()[token >> 5]) >> (token & 31)) & 1)

    def ask(self, token: int) -> bool | None:
        """Whether the mask allows `token` next, asked of llguidance for this token alone
        (1-3 us against up to 8 ms for a mask), without looking for a mask at hand; None
        where that is not the mask's answer. Not where bytes are forced: the mask then
        allows their canonical tokens only, while llguidance validates any spelling of
        them; nor for an end-of-generation token: in a state past any text (`_compute`'s
        error) llguidance validates the end alone."""
        if not 0 <= token < self.n_vocab:
            return False
        if token in self.grammar.tokenizer.eog or self._m.compute_ff_bytes():
            return None
        return bool(self._m.validate_tokens([token]) == 1)

    def allowed(self) -> npt.NDArray[np.bool_]:
        """(n_vocab,) bool: the tokens allowed next."""
        bits = np.unpackbits(self._bitmask().view(np.uint8), bitorder="little")
        return bits[: self.n_vocab].astype(bool)

    def n_allowed(self) -> int:
        """How many tokens are allowed next."""
        return int(_POPCOUNT[self._bitmask().view(np.uint8)].sum())

    def single(self) -> int | None:
        """The one token allowed next, or None when several (or none) are. Without a mask
        at hand, None where no byte is forced (llguidance's `compute_ff_bytes`, 0.1 us)
        and the grammar has not stopped: with a byte token for every byte, as Gemma's and
        SmolLM2's vocabularies have, several tokens are allowed there. Where a vocabulary
        lacks one, a sole token may be missed: it is then drafted and verified as any
        other, never taken unverified."""
        if not self._at_hand() and not self._m.is_stopped() and not self._m.compute_ff_bytes():
            return None
        words = self._bitmask()
        # one nonzero word holding one bit; no popcount over the whole mask (on a
        # 262,144-token vocabulary that was 0.14 ms, the mask itself 0.015 ms)
        nz = np.flatnonzero(words)
        if nz.size != 1:
            return None
        bit = int(words[nz[0]]) & 0xFFFFFFFF
        if bit & (bit - 1):
            return None
        return int(nz[0]) * 32 + bit.bit_length() - 1

    def forced(self) -> list[int]:
        """The tokens the grammar forces next (llguidance's `compute_ff_tokens`): a forced
        string, tokenized canonically. Only the first is certain to be the *only* allowed
        token (`single`); later ones spell the forced bytes one way of several."""
        return list(self._m.compute_ff_tokens())

    def mask(self, row: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """(n_vocab,) float32: a copy of `row` (raw logits, at least n_vocab wide) with
        every token the grammar does not allow next at -inf.

        Raises:
            GrammarError: the grammar allows no token at all here (not even the end; a
                row of -inf has no law to sample from), or no text from here on (an
                empty language, which llguidance answers with the end alone).
        """
        keep = self.allowed()
        if not keep.any():
            raise GrammarError(
                f"{self.grammar.spec.source}: the grammar allows no token after the output so"
                " far, not even its end (does it describe an empty language, a schema defined"
                " only by itself?)"
            )
        width = row.shape[-1]
        if width > self.n_vocab:  # logits wider than the vocabulary: padding, never allowed
            keep = np.concatenate([keep, np.zeros(width - self.n_vocab, dtype=bool)])
        elif width < self.n_vocab:
            keep = keep[:width]
        return np.where(keep, row, np.float32(-np.inf)).astype(np.float32, copy=False)
