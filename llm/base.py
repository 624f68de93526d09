"""The LLM vocabulary: chat messages and the streaming, cancellable ChatModel protocol."""
from __future__ import annotations

import ctypes
from collections.abc import AsyncIterator
from typing import Protocol, TypedDict


class Message(TypedDict):
    role: str  # "system" | "user" | "assistant"
    content: str


class ChatModel(Protocol):
    name: str

    def stream(self, messages: list[Message], max_tokens: int | None = None) -> AsyncIterator[str]:
        """Yield text pieces as they are generated. Stop consuming (or cancel the task) to
        cancel generation; the model stops within one token."""


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
