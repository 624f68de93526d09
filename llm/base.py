"""The LLM vocabulary: chat messages and the streaming, cancellable ChatModel protocol."""
from __future__ import annotations

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
