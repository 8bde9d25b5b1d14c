"""The tool-call fixtures of the server tests on the SmolLM2 pair: a Qwen 2.5 chat template
(ChatML like SmolLM2's own, plus tools and the Hermes ``<tool_call>`` syntax), a weather
function whose one argument is an enum, and SmolLM2's tokens of the call tag."""

from __future__ import annotations

from pathlib import Path

TEMPLATE = Path(__file__).parent / "qwen2.5-chat-template.jinja"
# SmolLM2's tokens of "<tool_call>": "<", "tool", "_", "call", ">" (its BPE vocabulary)
TAG_TOKENS = (44, 19324, 79, 4350, 46)
TAG_BIAS = {str(t): 100 for t in TAG_TOKENS}
WEATHER_FUNCTION = {
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "London"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
"""The function as the chat API nests it (``{"type": "function", "function": ...}``); the
Responses API takes its keys flat, beside ``"type"``."""
