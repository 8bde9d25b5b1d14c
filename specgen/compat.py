"""Draft/target vocabulary compatibility, with llama.cpp's rules.

Source: llama.cpp `common/speculative.cpp`, `common_speculative_are_compatible`:
same vocab type; same BOS/EOS ids and add-BOS/add-EOS flags; sizes differ by at most
SPEC_VOCAB_MAX_SIZE_DIFFERENCE = 128; identical token text from id
SPEC_VOCAB_CHECK_START_TOKEN_ID = 5 up to the smaller size.
"""

from __future__ import annotations

from collections.abc import Callable

from specgen.engine import VocabInfo
from specgen.errors import VocabMismatchError

SPEC_VOCAB_MAX_SIZE_DIFFERENCE = 128
SPEC_VOCAB_CHECK_START_TOKEN_ID = 5

# llama.h `enum llama_vocab_type`, named as the tokenizers are usually called
_TOKENIZER_KINDS = {
    0: "no tokenizer",
    1: "SentencePiece",
    2: "BPE",
    3: "WordPiece",
    4: "Unigram",
    5: "RWKV",
    6: "PLaMo-2",
}
SAME_FAMILY = "the draft must come from the same model family as the target"


def describe(vocab: VocabInfo) -> str:
    """The tokenizer in users' words: its kind and size, e.g. ``SentencePiece 262,144``."""
    kind = _TOKENIZER_KINDS.get(vocab.vocab_type, f"tokenizer type {vocab.vocab_type}")
    return f"{kind} {vocab.n_vocab:,}"


def check_compatible(
    target: VocabInfo,
    draft: VocabInfo,
    target_text: Callable[[int], str],
    draft_text: Callable[[int], str],
) -> None:
    """Refuse a draft whose tokens do not mean the same as the target's.

    Args:
        target, draft: vocabulary summaries of both models.
        target_text, draft_text: token id -> vocabulary text.

    Raises:
        VocabMismatchError: one line naming both tokenizers (kind and size: "the target's
            tokenizer is SentencePiece 262,144, the draft's BPE 49,152"), the first
            difference when the kinds and sizes agree (a special token, or a token id with
            both texts), and that the draft must come from the target's model family.
    """
    head = f"the target's tokenizer is {describe(target)}, the draft's {describe(draft)}"
    diff = abs(target.n_vocab - draft.n_vocab)
    if target.vocab_type != draft.vocab_type or diff > SPEC_VOCAB_MAX_SIZE_DIFFERENCE:
        raise VocabMismatchError(f"{head}: {SAME_FAMILY}")
    for field, what in (
        ("bos", "BOS token id"),
        ("eos", "EOS token id"),
        ("add_bos", "adds BOS"),
        ("add_eos", "adds EOS"),
    ):
        a, b = getattr(target, field), getattr(draft, field)
        if a != b:
            raise VocabMismatchError(
                f"{head}, and they differ ({what}: {a!r} in the target, {b!r} in the draft):"
                f" {SAME_FAMILY}"
            )
    for i in range(SPEC_VOCAB_CHECK_START_TOKEN_ID, min(target.n_vocab, draft.n_vocab)):
        t, d = target_text(i), draft_text(i)
        if t != d:
            raise VocabMismatchError(
                f"{head}, and they differ at token {i} (target {t!r}, draft {d!r}): {SAME_FAMILY}"
            )
