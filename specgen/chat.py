"""Chat prompts: a conversation rendered with the target's chat template, then tokenized.

Rendering is the way llama.cpp and transformers do it (Jinja2 in a sandbox, through
`specgen.llamacpp.compile_chat_template`, llama-cpp-python's `Jinja2ChatFormatter`). The
template comes from the target's GGUF (`tokenizer.chat_template`) or from a file
(`--chat-template`). Tokenization parses special tokens (the template's turn markers) and
never leaves two BOS tokens in front: templates that write ``{{ bos_token }}`` themselves
(Gemma, Llama 3) would otherwise get a second one from the tokenizer. llama.cpp's
`common/chat.cpp` strips the BOS text from the rendered prompt for the same reason.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from specgen.engine import Engine
from specgen.errors import ChatTemplateError, ConfigError

EMBEDDED_KEY = "tokenizer.chat_template"

Message = dict[str, str]
"""{"role": "system" | "user" | "assistant", "content": text}, as transformers takes it."""


class TemplateModel(Engine, Protocol):
    """An engine that can say which chat template its GGUF carries (`LlamaEngine`)."""

    def chat_template(self) -> str | None: ...


@dataclass(frozen=True)
class ChatTemplate:
    """A chat template and where it came from.

    Attributes:
        text: the Jinja2 source.
        source: for messages and `--json`: the file path, or the model file's name with
            ``(tokenizer.chat_template)``.
    """

    text: str
    source: str

    @property
    def sha256(self) -> str:
        """First 12 hex digits of the SHA-256 of the template's UTF-8 text."""
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()[:12]

    def to_dict(self) -> dict[str, str]:
        return {"source": self.source, "sha256": self.sha256}


def load_template(target: TemplateModel, path: Path | None = None) -> ChatTemplate | None:
    """The template to apply: the file at `path` when given, else the target's embedded one.

    Returns:
        None when no file is given and the target carries no template (base models such
        as the demo pair): the prompt is then sent raw.

    Raises:
        ConfigError: the file cannot be read or is not UTF-8.
        ChatTemplateError: the file is empty.
    """
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"--chat-template: cannot read {path}: {e.strerror}") from e
        except UnicodeDecodeError as e:
            raise ConfigError(f"--chat-template: {path} is not UTF-8 text") from e
        if not text.strip():
            raise ChatTemplateError(f"chat template {path}: the file is empty")
        return ChatTemplate(text, str(path))
    text = target.chat_template()
    if not text:
        return None
    return ChatTemplate(text, f"{target.name} ({EMBEDDED_KEY})")


def prompt_tokens(target: Engine, text: bytes) -> list[int]:
    """Token ids of a prompt: special tokens parsed, BOS added when the model adds one,
    but never a second BOS when the text already starts with the BOS text.

    Works for raw prompts too (``<bos>Hello`` on Gemma gives one BOS, as ``Hello`` does).

    Returns:
        The ids, a list of ints (empty for empty text on a model that adds no BOS).
    """
    ids = target.tokenize(text, add_special=True)
    bos = target.vocab.bos
    if target.vocab.add_bos and bos >= 0 and len(ids) >= 2 and ids[0] == ids[1] == bos:
        del ids[0]
    return ids


class ChatFormatter:
    """A template compiled for one target: messages -> prompt text and token ids.

    Raises (constructor):
        ChatTemplateError: the template does not compile; one line naming its source.
    """

    def __init__(self, template: ChatTemplate, target: Engine) -> None:
        from specgen.llamacpp import compile_chat_template

        self.template = template
        self._target = target
        v = target.vocab
        bos = target.token_text(v.bos) if v.bos >= 0 else ""
        eos = target.token_text(v.eos) if v.eos >= 0 else ""
        with _named(template.source):
            self._render = compile_chat_template(template.text, bos, eos)

    def text(self, messages: Sequence[Message]) -> str:
        """The rendered prompt, with the assistant's generation prompt at the end.

        Raises:
            ChatTemplateError: the template failed (e.g. its `raise_exception`), naming
                its source.
        """
        with _named(self.template.source):
            return self._render(messages)

    def tokens(self, messages: Sequence[Message]) -> list[int]:
        """`text` tokenized by `prompt_tokens` (special tokens parsed, one BOS at most)."""
        return prompt_tokens(self._target, self.text(messages).encode("utf-8"))


@contextlib.contextmanager
def _named(source: str) -> Iterator[None]:
    try:
        yield
    except ChatTemplateError as e:
        raise ChatTemplateError(f"chat template {source}: {e}") from e


def messages(prompt: str, system: str | None = None) -> list[Message]:
    """One user message, after a system message when `system` is given."""
    head = [{"role": "system", "content": system}] if system else []
    return [*head, {"role": "user", "content": prompt}]


@dataclass
class Conversation:
    """The turns of a chat so far, re-rendered whole each turn (the KV caches keep the
    common prefix, so only the new tokens are evaluated)."""

    system: str | None = None
    turns: list[Message] = field(default_factory=list)

    def messages(self) -> list[Message]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return [*head, *self.turns]

    def add(self, role: str, content: str) -> None:
        self.turns.append({"role": role, "content": content})

    def reset(self) -> None:
        self.turns.clear()
