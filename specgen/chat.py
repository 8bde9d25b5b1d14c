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
import statistics
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from specgen.engine import Engine
from specgen.errors import ChatTemplateError, ConfigError, PromptError
from specgen.events import Done, Prefilled, Stats, Step, Totals, relay
from specgen.fileio import read_chat_template
from specgen.generate import Event

if TYPE_CHECKING:
    from specgen.api import Generation

EMBEDDED_KEY = "tokenizer.chat_template"

Message = dict[str, Any]
"""{"role": "system" | "user" | "assistant" | "tool", "content": text, ...}, as transformers
takes it (an assistant message may carry ``tool_calls``, a tool message ``tool_call_id``)."""


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
        return ChatTemplate(read_chat_template(Path(path)), str(path))
    embedded = target.chat_template()
    if not embedded:
        return None
    return ChatTemplate(embedded, f"{target.name} ({EMBEDDED_KEY})")


def prompt_tokens(target: Engine, text: bytes, add_special: bool = True) -> list[int]:
    """Token ids of a prompt: special tokens parsed, BOS added when the model adds one,
    but never a second BOS when the text already starts with the BOS text.

    Works for raw prompts too (``<bos>Hello`` on Gemma gives one BOS, as ``Hello`` does).
    With `add_special` False no BOS is added: the ids are the text's own (vLLM's
    ``add_special_tokens: false``), its special-token text still parsed.

    Returns:
        The ids, a list of ints (empty for empty text on a model that adds no BOS).
    """
    if not add_special:
        return target.tokenize(text, add_special=False)
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
        # start-up time: llama.cpp, which the CLI's chat module must not load at --help
        from specgen.llamacpp import compile_chat_template

        self.template = template
        self._target = target
        v = target.vocab
        bos = target.token_text(v.bos) if v.bos >= 0 else ""
        eos = target.token_text(v.eos) if v.eos >= 0 else ""
        with _named(template.source):
            self._render = compile_chat_template(template.text, bos, eos)

    def text(
        self,
        messages: Sequence[Message],
        tools: Sequence[object] | None = None,
        variables: Mapping[str, object] | None = None,
    ) -> str:
        """The rendered prompt, with the assistant's generation prompt at the end;
        `variables`: more of the template's variables (`enable_thinking`...).

        Raises:
            ChatTemplateError: the template failed (e.g. its `raise_exception`), naming
                its source.
        """
        with _named(self.template.source):
            return self._render(messages, tools, variables)

    def tokens(
        self,
        messages: Sequence[Message],
        tools: Sequence[object] | None = None,
        variables: Mapping[str, object] | None = None,
        add_special: bool = True,
    ) -> list[int]:
        """`text` tokenized by `prompt_tokens` (special tokens parsed, one BOS at most; with
        `add_special` False, none beyond the template's own)."""
        text = self.text(messages, tools, variables).encode("utf-8")
        return prompt_tokens(self._target, text, add_special)


@contextlib.contextmanager
def _named(source: str) -> Iterator[None]:
    try:
        yield
    except ChatTemplateError as e:
        raise ChatTemplateError(f"chat template {source}: {e}") from e


def messages(prompt: str, system: str | None = None) -> list[Message]:
    """One user message, after a system message when `system` is given (an empty one too:
    it replaces a template's default system prompt)."""
    head = [{"role": "system", "content": system}] if system is not None else []
    return [*head, {"role": "user", "content": prompt}]


@dataclass
class Conversation:
    """The turns of a chat so far, re-rendered whole each turn (the KV caches keep the
    common prefix, so only the new tokens are evaluated)."""

    system: str | None = None
    turns: list[Message] = field(default_factory=list)

    def messages(self) -> list[Message]:
        head = [{"role": "system", "content": self.system}] if self.system is not None else []
        return [*head, *self.turns]

    def add(self, role: str, content: str) -> None:
        self.turns.append({"role": role, "content": content})

    def reset(self) -> None:
        self.turns.clear()


def build_prompt(
    target: TemplateModel,
    prompt: bytes,
    *,
    raw: bool = False,
    system: str | None = None,
    template_file: Path | None = None,
) -> tuple[list[int], ChatTemplate | None]:
    """`run`'s prompt: one user message rendered with the chat template (the target's, or
    `template_file`), or the text as it is with `raw` or when the target has no template.

    Returns:
        (token ids, the template applied or None for a raw prompt).

    Raises:
        ConfigError: `raw` with `system` or `template_file`; `system` for a target without
            a template and no `template_file`; an unreadable template file.
        ChatTemplateError: the template fails, naming its source.
    """
    if raw:
        if system is not None or template_file is not None:
            raise ConfigError("--raw sends the prompt as it is: drop --system / --chat-template")
        return prompt_tokens(target, prompt), None
    template = load_template(target, template_file)
    if template is None:
        if system is not None:
            raise ConfigError(
                f"--system needs a chat template and {target.name} has none"
                " (a base model): pass --chat-template FILE"
            )
        return prompt_tokens(target, prompt), None
    text = prompt.decode("utf-8", errors="replace")
    return ChatFormatter(template, target).tokens(messages(text, system)), template


class ContextFullError(PromptError):
    """The conversation no longer fits the context: `ChatSession.reset()` (``/reset`` in
    `specgen chat`), or a larger context. The message is in the Python API's words; the
    CLI says it in its own (`how`: the sizes, for that)."""

    def __init__(self, n_tokens: int, n_ctx: int) -> None:
        self.how = f"the conversation is {n_tokens} tokens and the context holds {n_ctx}"
        super().__init__(f"{self.how}: reset() to start over, or load with a larger ctx_size")


@dataclass
class ChatTotals(Totals):
    """A chat session's running totals over its replies (what `/stats` shows).

    Attributes:
        turns: replies generated.
        n_generated, n_drafted, n_accepted, target_passes: summed over the replies.
        decode_s: seconds of decoding, summed (prefill excluded, as `run` reports).
        ordinary_token_s: seconds per token of ordinary decoding, the median of every
            reply's baseline (`Stats.ordinary_token_s`: the passes after the prompt, then
            the reply's own ordinary rounds); None when not measured.
        last_prompt, last_prefill: the last turn's prompt tokens (the whole conversation)
            and how many of them the target evaluated (the rest were cached).
    """

    turns: int = 0
    ordinary: list[float] = field(default_factory=list)
    last_prompt: int = 0
    last_prefill: int = 0

    def add(self, stats: Stats, ordinary_token_s: float | None) -> None:
        self.turns += 1
        self.add_totals(stats)
        self.last_prompt = stats.n_prompt
        self.last_prefill = stats.n_prefill
        if ordinary_token_s:
            self.ordinary.append(ordinary_token_s)

    @property
    def ordinary_token_s(self) -> float | None:
        return statistics.median(self.ordinary) if self.ordinary else None

    def describe(self) -> str:
        """One line for `/stats`: replies, tokens, acceptance, tokens/s, speedup over
        ordinary decoding (as `run` measures it), and the last turn's prefill."""
        acc = (
            f"acceptance {self.acceptance_rate:.1%} ({self.n_accepted} of {self.n_drafted} drafted)"
            if self.n_drafted
            else "acceptance n/a (nothing drafted)"
        )
        sp, o = self.speedup, self.ordinary_token_s
        speed = (
            f"speedup {sp:.2f}× over ordinary decoding ({1 / o:.1f} tok/s)"
            if sp is not None and o
            # without a draft the replies are ordinary decoding: nothing to time them against
            else "speedup n/a (ordinary decoding: no draft)"
            if not self.n_drafted
            else "speedup n/a (ordinary decoding not timed)"
        )
        replies = "reply" if self.turns == 1 else "replies"
        return (
            f"session: {self.turns} {replies} · {self.n_generated} tokens · {acc}"
            f" · {self.tokens_per_s:.1f} tok/s · {speed} · last turn prefilled"
            f" {self.last_prefill} of {self.last_prompt} prompt tokens"
        )


class ChatSession:
    """A multi-turn conversation whose KV caches persist across turns, built by
    `specgen.Pair.chat_session` (which `specgen chat` drives).

    Each turn re-renders the whole conversation; the pair's generation, with
    `GenerateConfig.reuse_cache`, keeps the longest common prefix of what the target holds
    and evaluates only the rest (the drafter does the same), so a turn's prefill does not
    grow with earlier replies.

    Args:
        formatter: the target's compiled chat template.
        n_ctx: the target's context, tokens.
        start: ``start(ids, i)``: reply i's generation from prompt `ids` (the pair's, with
            its settings, seeded for reply i, the caches reused).
        drafting: whether the pair has a drafter (without one, ordinary decoding is the
            baseline itself: the replies' own rounds time it).
        system: optional system message.

    Attributes:
        conversation: the turns so far; totals: the replies' running totals (`/stats`);
        replies: replies generated over the whole session, /reset included.
    """

    def __init__(
        self,
        formatter: ChatFormatter,
        n_ctx: int,
        start: Callable[[list[int], int], Generation],
        drafting: bool,
        system: str | None = None,
    ) -> None:
        self.formatter = formatter
        self._n_ctx = n_ctx
        self._start = start
        self._drafting = drafting
        self.conversation = Conversation(system=system)
        self.totals = ChatTotals()
        self.replies = 0  # over the whole session, /reset included: each reply's seed

    def reply(self, user: str) -> Generator[Event, None, None]:
        """Render the conversation with `user`'s message and return the reply's events
        (`Prefilled`, a `Step` per round, `Done`; lazily: generation runs as they are
        consumed).

        The user turn and the reply join the conversation when the reply ends (an
        interrupted reply is kept as far as it got, as llama-cli keeps it); a reply whose
        events are closed early leaves the conversation as it was. To interrupt from the
        consumer's side, throw ``KeyboardInterrupt`` into the events (``events.throw``):
        the next event is the reply's Done (finish reason "interrupted"), after which the
        interrupt is raised.

        Raises (at once, before any event):
            ContextFullError: the conversation with this turn does not fit the context
                (nothing is added: /reset or a larger -c).
            ChatTemplateError: the template failed. ConfigError, GrammarError: a setting
                the engines refuse (as `Pair.stream`).
        """
        msgs = [*self.conversation.messages(), {"role": "user", "content": user}]
        ids = self.formatter.tokens(msgs)
        if len(ids) >= self._n_ctx:
            raise ContextFullError(len(ids), self._n_ctx)
        return self._generate(user, self._start(ids, self.replies))

    def _generate(self, user: str, events: Generation) -> Generator[Event, None, None]:
        ordinary_s: float | None = None

        def record(ev: Event) -> None:
            nonlocal ordinary_s
            if isinstance(ev, Prefilled):
                ordinary_s = ev.ordinary_token_s
            elif isinstance(ev, Step) and ev.timed_ordinary_s is not None:
                ordinary_s = ev.timed_ordinary_s  # timed after the first token
            elif isinstance(ev, Done):
                # the reply's own baseline, kept current by its ordinary rounds (none
                # without a draft: ordinary decoding is the baseline itself)
                if self._drafting:
                    ordinary_s = ev.stats.ordinary_token_s or ordinary_s
                # kept at its Done, an interrupted one as far as it got: a Ctrl-C after it
                # (the loop raises one after the Done) cannot lose it
                self._keep(user, ev, ordinary_s)

        # Ctrl-C in the consumer (say while the live view draws), in `record`, or in the
        # glue between them and the loop is handed on to the loop (`relay`), which ends the
        # reply as when Ctrl-C lands in it: with its Done. A generator of its own here had
        # a frame where a Ctrl-C ended the reply without its Done, which was then lost
        return relay(events, record)

    def _keep(self, user: str, done: Done, ordinary_s: float | None) -> None:
        self.conversation.add("user", user)
        self.conversation.add("assistant", done.text)
        self.totals.add(done.stats, ordinary_s)
        self.replies += 1

    def context_full(self, done: Done) -> bool:
        """Whether `done` stopped because the context filled up (not because of -n)."""
        return done.finish_reason == "context"

    def reset(self) -> None:
        """Forget the conversation and start the session totals over (the caches keep what
        the next turn can still reuse, such as the system prompt)."""
        self.conversation.reset()
        self.totals = ChatTotals()
