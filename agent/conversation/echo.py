"""The bot's own voice heard back: told apart from the user's words by what the bot just said.

A browser's echo canceller takes a loudspeaker's echo down by 60 dB most of the time, but lets
short bursts through when the capture glitches (tests/test_browser_echo.py, Chromium on a busy
machine); a phone line or a room speaker with no canceller lets all of it through. Those bursts
reach the recognizer as the bot's words, and words over the bot cut it. So words over the bot
that are, mostly, one run of what the current reply has sent in the last few seconds are its
echo: no interruption, no turn to answer. A user who talks over the bot with its own last words
is the price (rare: they can say something else). Once the reply has ended nothing is echo.
"""
from __future__ import annotations

from difflib import SequenceMatcher

from asr.wer import normalize


def is_echo(heard: str, said: str, recent_words: int = 30, share: float = 0.6, single_within: int = 8) -> bool:
    """`heard` (a transcript over the bot) is an echo of `said` (the bot's words sent so far):
    at least `share` of its words are one contiguous run of the last `recent_words` said. One
    word alone counts only among the last `single_within` (a real "stop" may be anywhere in a
    story)."""
    h, s = normalize(heard), normalize(said)[-recent_words:]
    if not h or not s:
        return False
    if len(h) == 1:
        return h[0] in s[-single_within:]
    run = SequenceMatcher(None, s, h, autojunk=False).find_longest_match(0, len(s), 0, len(h)).size
    return run >= 2 and run >= share * len(h)
