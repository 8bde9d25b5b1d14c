"""Chat templates, rendered as llama-cpp-python renders them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from specgen.errors import ChatTemplateError


def compile_chat_template(template: str, bos_token: str, eos_token: str) -> Callable[..., str]:
    """Compile a Hugging Face-style chat template; returns ``messages -> prompt text``.

    Rendering is llama-cpp-python's `Jinja2ChatFormatter`: Jinja2 in an
    `ImmutableSandboxedEnvironment` with `trim_blocks` and `lstrip_blocks`, the
    `loopcontrols` extension, transformers' `tojson`, and the variables `messages`,
    `bos_token`, `eos_token`, `add_generation_prompt` (always true here),
    `raise_exception` and `strftime_now`, as transformers' `apply_chat_template` renders.

    Args:
        template: the Jinja2 source.
        bos_token, eos_token: the model's BOS and EOS token text (e.g. ``<bos>``).

    Raises:
        ChatTemplateError: the template does not compile (at once) or fails while rendering
            (when the returned function is called; `raise_exception` included); the message
            is one line without the template's source, which the caller adds.
    """
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    try:
        formatter = Jinja2ChatFormatter(template, eos_token=eos_token, bos_token=bos_token)
    except Exception as e:  # jinja2.TemplateSyntaxError and friends: user-supplied code
        raise ChatTemplateError(_template_error(e)) from e

    def render(
        messages: Sequence[dict[str, Any]],
        tools: Sequence[Any] | None = None,
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        try:
            # `tools` in the template's context as llama-server --jinja and transformers
            # give it (OpenAI's tool objects), when there are any; `variables`: more of
            # them (llama-server's chat_template_kwargs), beside the ones above
            return formatter(
                messages=list(messages),  # type: ignore[arg-type]
                tools=list(tools) if tools else None,
                **dict(variables or {}),
            ).prompt
        except Exception as e:  # the template's own raise_exception, undefined names, ...
            raise ChatTemplateError(_template_error(e)) from e

    return render


def _template_error(e: Exception) -> str:
    line = getattr(e, "lineno", None)
    msg = " ".join(str(getattr(e, "message", None) or e).split()) or type(e).__name__
    return f"line {line}: {msg}" if line else msg
