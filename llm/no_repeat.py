"""Keep a reply from copying the bot's earlier replies, or itself.

A small model in a long conversation copies its own earlier answers word for word ("That's a
good idea! ..." turn after turn): each copy in the context makes the next one likelier. A
repetition penalty reaches only the last few dozen tokens, the user's turn; this looks at every
earlier assistant message of the prompt instead and forbids the token that would make the reply
repeat `n` tokens in a row of any of them. Shorter runs (a greeting's "Sure", "I think") stay free.
The reply's own words count too: a small model can loop inside one reply ('Check out "The Legend
of Zelda: The Legend of Zelda: ...') until its token limit, half a minute of speech.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

NGRAM = 6  # tokens in a row that may not be copied from an earlier reply


class NoRepeat:
    """The earlier replies' `n`-grams, as (n-1 tokens) -> the tokens that followed them."""

    def __init__(self, earlier: Iterable[list[int]], n: int = NGRAM, itself: bool = True):
        self.n = n
        self.itself = itself  # nor a run of the reply's own (off where tool calls repeat their form)
        self.after: dict[tuple[int, ...], set[int]] = {}
        for tokens in earlier:
            for i in range(len(tokens) - n + 1):
                self.after.setdefault(tuple(tokens[i:i + n - 1]), set()).add(tokens[i + n - 1])

    def banned(self, context: list[int] | np.ndarray) -> set[int]:
        """The next tokens that would copy `n` tokens of an earlier reply after `context`."""
        if not self.after or len(context) < self.n - 1:
            return set()
        return self.after.get(tuple(int(t) for t in context[len(context) - self.n + 1:]), set())

    def banned_in_itself(self, reply: list[int] | np.ndarray) -> set[int]:
        """The next tokens that would make `reply` repeat `n` tokens in a row of itself: the
        reply read as an earlier reply of its own."""
        return NoRepeat([[int(t) for t in reply]], self.n).banned(reply)

    def logits_processor(self) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        """llama-cpp-python's `logits_processor` form: (input ids, scores) -> scores. The first
        call's ids are the prompt: what comes after them is the reply."""
        start: int | None = None

        def process(input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
            nonlocal start
            if start is None:
                start = len(input_ids)
            banned = self.banned(input_ids)
            if self.itself:
                banned = banned | self.banned_in_itself(input_ids[start:])
            if banned:
                scores[list(banned)] = -np.inf
            return scores

        return process


def earlier_replies(messages: list[dict]) -> list[str]:
    """The text of every assistant message in a prompt."""
    return [m["content"] for m in messages if m.get("role") == "assistant" and isinstance(m.get("content"), str)
            and m["content"]]
