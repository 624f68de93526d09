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


class PromptCacheWarmer(Protocol):
    """Optional: a ChatModel that keeps a prompt cache can process a prefix ahead of time."""

    def warm(self, messages: list[Message]) -> None:
        """Blocking: evaluate the prompt for `messages` now, so that a later request that starts
        with them only processes what follows."""
