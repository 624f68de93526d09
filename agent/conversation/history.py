"""The conversation as the LLM sees it: what was said and what the user actually heard.

Pure code, no models, no I/O, no clocks of its own.
- `Heard`: the pieces of one reply as they were sent (text per piece) and which of them the far
  end played (its marks, or their time having come): the words heard. Pieces a clear dropped
  unplayed leave it (a paused reply sends them again when it resumes).
- `History`: the context messages, cut back in one go when too long (so the LLM's cached
  prompt prefix stays valid for several turns), with the exchange of a cut reply kept as heard.
  A tool call and its result are always kept together (the cut starts at a user's turn).
- `as_written`: the user's words as the model reads them (the history keeps them as heard), a
  sentence with its capital and its closing mark even where the recognizer wrote none.
"""
from __future__ import annotations

import asyncio
import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from llm.base import Message

# a tool's result when the user's barge-in stopped it
CANCELLED = json.dumps({"error": "cancelled: the user interrupted before it finished"})

# words that open a question when a turn has no closing mark of its own
_ASKING = frozenset("""what how why who whom whose where when which can could do does did is are
was were will would should shall may might am isn't aren't don't doesn't didn't won't can't""".split())


def as_written(text: str) -> str:
    """The user's words as a written sentence: Whisper writes some short finals and every
    partial bare ("turn left at the next corner"), and the small model says such a line back
    about twice as often as the same words written out (docs/quality.md)."""
    text = re.sub(r"\bi\b", "I", text.strip().rstrip(",;:-").rstrip())
    if not text:
        return text
    text = text[0].upper() + text[1:]
    if text[-1] in ".?!\"')":
        return text
    return text + ("?" if text.split()[0].lower() in _ASKING else ".")


class Heard:
    """One reply's audio pieces (chunk id, offset in the reply, text) and what was played."""

    def __init__(self) -> None:
        self.pieces: list[tuple[int, float, str]] = []  # (chunk_id, offset_s, text), in the order sent
        self.played_ids: set[int] = set()

    def sent(self, chunk_id: int, offset_s: float, text: str) -> None:
        self.pieces.append((chunk_id, offset_s, text))

    def played(self, chunk_id: int) -> None:
        self.played_ids.add(chunk_id)

    def dropped(self, chunk_ids: set[int]) -> None:
        """The far end dropped these pieces unplayed (a clear): they were never heard. (What a
        resume sends again in their place is recorded anew.)"""
        self.pieces = [p for p in self.pieces if p[0] not in chunk_ids]
        self.played_ids -= chunk_ids

    def played_by_time(self, elapsed_s: float) -> set[int]:
        """The pieces whose time has come, for a far end that reports no marks."""
        return {cid for cid, off, _ in self.pieces if off <= elapsed_s}

    def text(self, played: set[int]) -> str:
        return " ".join(t for cid, _, t in self.pieces if cid in played and t).strip()


@dataclass
class History:
    """The context after the system prompt. `on_new_prefix` is called whenever the prompt's
    prefix changed in a way the LLM could evaluate ahead of time (a turn was stored)."""

    max_messages: int = 16
    messages: list[Message] = field(default_factory=list)
    on_new_prefix: Callable[[], None] | None = None
    waiting: list[asyncio.Task] = field(default_factory=list)  # tools whose results are still to come

    def prompt(self, system: str, user_text: str | None, examples: list[Message] = ()) -> list[Message]:
        """The system prompt, the agent's example turns, the conversation, the user's words."""
        said = [{**m, "content": as_written(m["content"])} if m["role"] == "user" and isinstance(m.get("content"), str)
                else m for m in self.messages]
        out: list[Message] = [{"role": "system", "content": system}, *examples, *said]
        if user_text is not None:
            out.append({"role": "user", "content": as_written(user_text)})
        return out

    def remember(self, user: str, assistant: str) -> None:
        """Store one exchange: the user's words (none before a greeting) and what was heard."""
        self.remember_reply(user, [{"role": "assistant", "content": assistant}] if assistant else [])

    def remember_reply(self, user: str, reply: list[Message],
                       waiting: list[tuple[Message, asyncio.Task]] = ()) -> None:
        """Store one exchange: the user's words and the reply's messages (what was heard, and
        its tool calls with their results). `waiting`: tool messages whose result is still to
        come from a task that runs on (a tool a barge-in did not stop); `settle` waits for them."""
        if user:
            self.messages.append({"role": "user", "content": user})
        self.messages.extend(reply)
        for message, task in waiting:
            task.add_done_callback(functools.partial(_fill, message))
            self.waiting.append(task)
        if len(self.messages) > self.max_messages:
            del self.messages[:self._cut_at(len(self.messages) - self.max_messages // 2)]
        if self.on_new_prefix is not None:
            self.on_new_prefix()

    def _cut_at(self, cut: int) -> int:
        """Where the context starts once cut back to the messages from `cut` on: at a user's
        turn, never at an answer nor a tool result without its call (the last user's turn when
        none is left after `cut`); where the bot alone spoke (`say` after `say`), at an answer."""
        users = [i for i, m in enumerate(self.messages) if m["role"] == "user"]
        if users:
            return next((i for i in users if i >= cut), users[-1])
        while cut < len(self.messages) and self.messages[cut]["role"] != "assistant":
            cut += 1
        return cut

    async def settle(self) -> None:
        """Until every tool result the history waits for has come."""
        self.waiting = [t for t in self.waiting if not t.done()]
        if self.waiting:
            await asyncio.wait(self.waiting)
            self.waiting = []

    async def settled_prompt(self, system: str, user_text: str | None, examples: list[Message] = ()) -> list[Message]:
        await self.settle()
        return self.prompt(system, user_text, examples)


def _fill(message: Message, task: asyncio.Task) -> None:
    """A tool that ran on after its reply was cut has ended: its message gets the result."""
    if task.cancelled():
        message["content"] = CANCELLED
    elif task.exception() is not None:
        message["content"] = json.dumps({"error": f"failed: {task.exception()}"})
    else:
        message["content"] = task.result()
