"""The embedded Whisper's stream with the listener's hints: an utterance that begins while the
last one's final decode is still waiting or running (the user speaks again at once, as over a
bot that paused) is decoded whole, and the last one keeps its own words. A look at the words so
far (speech over the bot, still said) hears a backchannel as one and words as words, and leaves
the utterance's words to its flush."""
import asyncio

import numpy as np
import pytest
from helpers import say

from asr.base import Flushed, WordEvent

pytestmark = pytest.mark.models
RATE = 16000


@pytest.fixture(scope="module")
def recognizer():
    from asr import load_recognizer

    return load_recognizer()


def _words(text: str) -> list[str]:
    return ["".join(ch for ch in w.lower() if ch.isalnum()) for w in text.split()]


async def test_an_utterance_begun_while_the_last_one_is_finalized_is_decoded(recognizer, tmp_path):
    first = say("Please stop talking.", tmp_path / "a.wav")
    second = say("Wait a moment please.", tmp_path / "b.wav")
    gap = np.zeros(RATE // 10, np.float32)
    stream = await recognizer.open_stream()
    try:
        stream.begin_utterance(0.0)
        await stream.feed(np.concatenate([first, gap]))
        first_end = (first.size + gap.size) / RATE
        flush_first = asyncio.create_task(stream.flush(first_end))
        await asyncio.sleep(0)  # its decode is under way in the recognizer's thread
        stream.begin_utterance(first_end)
        await stream.feed(np.concatenate([second, gap]))
        await flush_first
        await stream.flush(first_end + (second.size + gap.size) / RATE)
        heard: list[list[str]] = [[]]
        async with asyncio.timeout(30):
            async for ev in stream.events():
                if isinstance(ev, WordEvent):
                    heard[-1] += _words(ev.word.text)
                elif isinstance(ev, Flushed):
                    if len(heard) == 2:
                        break
                    heard.append([])
    finally:
        await stream.close()
    assert heard == [["please", "stop", "talking"], ["wait", "a", "moment", "please"]], heard


async def test_a_look_at_the_words_so_far_tells_a_backchannel_from_words_and_keeps_nothing(recognizer, tmp_path):
    from agent.conversation.turns import BACKCHANNELS, interrupting_words

    lead = np.zeros(RATE * 3 // 10, np.float32)  # the listener's preroll
    okay = say("Okay.", tmp_path / "a.wav")
    words = say("Please stop talking now.", tmp_path / "b.wav")
    stream = await recognizer.open_stream()
    try:
        stream.begin_utterance(0.0)
        await stream.feed(np.concatenate([lead, okay]))
        heard = await stream.words_so_far((lead.size + okay.size) / RATE)
        assert any(ch.isalnum() for ch in heard) and interrupting_words(heard, BACKCHANNELS) == 0, heard
        start = (lead.size + okay.size) / RATE
        stream.begin_utterance(start)
        await stream.feed(np.concatenate([lead, words[:RATE * 8 // 10]]))  # its first 0.8 s
        heard = await stream.words_so_far(start + (lead.size + RATE * 8 // 10) / RATE)
        assert interrupting_words(heard, BACKCHANNELS) >= 1, heard
        await stream.feed(np.concatenate([words[RATE * 8 // 10:], lead]))
        await stream.flush(start + (2 * lead.size + words.size) / RATE)
        events = []
        async with asyncio.timeout(30):
            async for ev in stream.events():
                events.append(ev)
                if isinstance(ev, Flushed):
                    break
    finally:
        await stream.close()
    # the looks emitted nothing: the flush's words are the utterance's, whole
    assert all(isinstance(ev, (WordEvent, Flushed)) for ev in events)
    assert [w for ev in events if isinstance(ev, WordEvent) for w in _words(ev.word.text)] == \
        ["please", "stop", "talking", "now"]


def test_a_look_stops_after_its_first_tokens_and_a_decode_does_not(recognizer, tmp_path):
    # a look tells a backchannel, a name or words: its first tokens do, and the rest of a long
    # utterance (or a short window's loop) would hold the decode at the silence back
    import dataclasses

    from asr.whisper import UtteranceDecoder

    said = say("Hey, could you turn the oven off for me before you go to bed tonight?", tmp_path / "a.wav")
    x = np.concatenate([np.zeros(RATE * 3 // 10, np.float32), said])
    whisper = recognizer.whisper
    decoder = UtteranceDecoder(whisper)
    decoder.push(x)
    whole = _words(decoder.decode(x.size, quick=True).text)
    look = _words(decoder.glance(x.size))
    assert whisper.options.glance_max_tokens is not None and 2 <= len(look) < len(whole) and look == whole[:len(look)], (look, whole)
    options = whisper.options
    whisper.options = dataclasses.replace(options, glance_max_tokens=None)
    try:
        assert len(_words(decoder.glance(x.size))) > len(look)
    finally:
        whisper.options = options
