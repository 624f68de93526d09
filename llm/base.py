"""The LLM vocabulary: chat messages, tool calls and the streaming, cancellable ChatModel protocol.

A stream yields text deltas (`str`) and, from a model given tools, `ToolCall`s. Messages follow
OpenAI's chat format, which every backend here speaks or translates: an assistant message may
carry `tool_calls`, and each call's result is a `tool` message with its `tool_call_id`.
"""
from __future__ import annotations

import ctypes
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, NotRequired, Protocol, TypedDict


class Message(TypedDict):
    role: str  # "system" | "user" | "assistant" | "tool"
    content: str
    tool_calls: NotRequired[list[dict]]  # assistant: OpenAI's [{"id", "type": "function", "function": {...}}]
    tool_call_id: NotRequired[str]  # tool: the call this is the result of


@dataclass(frozen=True)
class ToolCall:
    """One function call the model asked for: `arguments` is its JSON object, as text."""

    id: str
    name: str
    arguments: str = "{}"

    def args(self) -> dict[str, Any]:
        """The arguments as a dict; ValueError when they are not a JSON object."""
        value = json.loads(self.arguments or "{}")
        if not isinstance(value, dict):
            raise ValueError(f"arguments must be a JSON object, not {type(value).__name__}")
        return value

    def as_message_part(self) -> dict:
        """The call as an assistant message's `tool_calls` entry (OpenAI's format)."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


Delta = str | ToolCall  # what a stream yields


def assistant_calls(content: str, calls: list[ToolCall]) -> Message:
    return {"role": "assistant", "content": content, "tool_calls": [c.as_message_part() for c in calls]}


def tool_result(call: ToolCall, content: str) -> Message:
    return {"role": "tool", "content": content, "tool_call_id": call.id}


class ChatModel(Protocol):
    name: str

    def stream(self, messages: list[Message], max_tokens: int | None = None,
               tools: list[dict] | None = None) -> AsyncIterator[Delta]:
        """Yield text pieces as they are generated, and `ToolCall`s when `tools` (OpenAI's
        function specs) were given and the model calls one. Stop consuming (or cancel the task)
        to cancel generation; the model stops within one token. A model that takes no `tools`
        parameter is only ever asked without them."""


class ReadAheadStop:
    """Stops one read-ahead (`PromptCacheWarmer.warm`) from any thread: the user stopped
    speaking, and the decode of their words needs the cores now (beside a read-ahead on two
    cores both are slower). Its one byte is readable from C, so that llama.cpp can check it
    between graph operations without taking the GIL (llm/llamacpp.py `stoppable`)."""

    def __init__(self):
        self.buffer = ctypes.create_string_buffer(2)  # b"" goes on, b"x" stops

    def set(self) -> None:
        self.buffer[0] = b"x"

    def is_set(self) -> bool:
        return self.buffer[0] != b"\0"


class PromptCacheWarmer(Protocol):
    """Optional: a ChatModel that keeps a prompt cache can process a prefix ahead of time."""

    def warm(self, messages: list[Message], stop: ReadAheadStop | None = None) -> None:
        """Blocking: evaluate the prompt for `messages` now, so that a later request that starts
        with them only processes what follows. Once `stop` is set it ends as soon as it can,
        keeping what it evaluated whole (or nothing); a set `stop` before it begins skips it.
        (The session calls a `warm` without a `stop` parameter with the messages alone.)"""
