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
        VocabMismatchError: one line naming the first difference (field, or token id
            with both texts).
    """
    for field in ("vocab_type", "bos", "eos", "add_bos", "add_eos"):
        a, b = getattr(target, field), getattr(draft, field)
        if a != b:
            raise VocabMismatchError(
                f"draft and target vocabularies differ: {field} is {b!r} in the draft,"
                f" {a!r} in the target"
            )
    diff = abs(target.n_vocab - draft.n_vocab)
    if diff > SPEC_VOCAB_MAX_SIZE_DIFFERENCE:
        raise VocabMismatchError(
            f"draft and target vocabularies differ in size by {diff} tokens"
            f" ({draft.n_vocab} vs {target.n_vocab}; at most"
            f" {SPEC_VOCAB_MAX_SIZE_DIFFERENCE} allowed)"
        )
    for i in range(SPEC_VOCAB_CHECK_START_TOKEN_ID, min(target.n_vocab, draft.n_vocab)):
        t, d = target_text(i), draft_text(i)
        if t != d:
            raise VocabMismatchError(
                f"draft and target vocabularies differ at token {i}: draft {d!r}, target {t!r}"
            )
