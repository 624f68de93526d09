"""`duplex bench overlap`: pauses, turn-taking and speech over the bot, the way Full-Duplex-Bench
v1 and v1.5 measure them, through the browser's WebSocket protocol at real time.

Each item is one conversation (a new WebSocket) with the page-like player client
(`transport.web.client.play_along`): the mic timeline goes out in 20 ms PCM16 frames at real
time, the bot's audio plays on a playout clock, `clear` drops what is unplayed, and played marks
go back as the page sends them, so the server knows what the user heard. What was heard (chunk
intervals, and their level per 10 ms) and every JSON event, with its arrival time, are what is
measured. The client plays no bot audio into the mic: a headset, or a perfect echo canceller.

The audio is made offline, seeded and deterministic: flite's voices (kal, awb, rms, slt) and
Piper's, 16 kHz, the user's speech set to a level drawn per item (RMS over speech frames, -26 to
-18 dBFS), a low white noise floor drawn per item (-66 to -56 dBFS) under the whole mic timeline.

Categories (FD-Bench v1: pause handling, smooth turn-taking, user interruption; v1.5: user
backchannel, talking to others, background speech):
- pause: one utterance cut in two ("Can you tell me how" ... "to bake bread at home?"), the halves
  synthesized apart, trimmed and joined with 1.0-1.5 s of silence (the noise floor).
- turn_taking: a plain question whose answer takes a sentence.
- interruption: "Tell me a story about ...", then 1.5-2.5 s into the heard reply (v1.5 starts its
  overlaps there) a new question with a one-word answer ("Wait, what is the capital of France?"
  -> Paris), at the user's level.
- backchannel: the story, then "mm-hmm", "yeah", "right", "okay" or "uh-huh" at the user's level,
  1.5-2.5 s in.
- background: the story, then another voice (not the user's) at -20 dB below the user's speech
  level, a sentence or two not addressed to the bot (a TV, a person across the room), with a mild
  low-passed noise under it.
- side_talk: the story, then the user speaks to someone else in the room ("Honey, can you grab my
  keys from the table?"). FD-Bench v1.5's "talking to others" has the user's own voice say
  something addressed to a third party over the model's turn; what tells it apart there is what
  is said. Here the user is also turned away from the microphone: 3-6 dB quieter, with a short
  synthetic room reverb (exponentially decaying noise, RT60 0.3-0.5 s). That acoustic cue is our
  deviation; the words carry the same cue as theirs.
The user speaks a first turn at their normal level before any overlap (the story request): the
server learns the user's level from their turns. The story needs a long reply, so the server the
bench starts is told to tell long stories when asked (`SYSTEM_PROMPT`, `--max-tokens 120`); a
server given with `--url` should be started with the same (`--print-server-args`).

Metrics (FD-Bench's definitions where they apply; times on the client's clock, a mic sample at
its capture, bot audio when the player plays it; "voiced": a 10 ms step of heard audio within
35 dB of the reply's loudest):
- take-over (TOR): the bot takes the turn when a reply is heard and is not a short one: a reply
  with no heard words, or heard for under 1 s (first to last voiced step) with at most 3 words,
  is none (FD-Bench's 1 s / 3 words rule; its word count comes from an ASR of the output, ours
  from the reply's text: what `interrupted` says was heard when it was cut, else its `bot_text`).
  pause: a take-over by a reply whose audio began before the user's utterance ended (TOR, lower is
  better); also whether the server ended a turn inside the pause (`split`). turn_taking: a
  take-over by the reply after the question (higher is better). interruption: by the reply to the
  new question.
- the user's speech (the question's, the overlap's) begins and ends at the first and last 5 ms
  steps of its clip's runs of 20 ms or more within 40 dB of the clip's loudest (`speech_span`;
  FD-Bench: the words' times from an aligning ASR).
- response latency: the end of the user's speech (the question's; the interruption's) to the
  first voiced step of the reply heard (FD-Bench: the first word's start).
- stop latency (interruption): the overlap's speech onset to the end of the bot's heard audio
  after it (the flush: where its heard chunks stop for 0.5 s or more, FD-Bench's model merge gap).
  FD-Bench takes the end of the overlap of the two VAD streams, the same point when the user
  talks longer than the bot goes on.
- answered (interruption): the key word in the text of the next reply (a turn after the story's).
- backchannel, background, side_talk, from the overlap's onset until the window ends (6 s after
  the onset, or 3 s after the overlap speech ends if later), or until the story's last heard audio
  when the story finished: goes on (no `interrupted`, no new reply, and the story is heard again
  after the onset, or finished); paused (a `clear` came); new reply (`bot_text` of another turn:
  the server answered the overlap; "replied" for background and side talk); the longest silence
  (no voiced step of the story heard) while the story was unfinished, and the part of it a pause
  made (from a `clear` to the story's voice again; the rest is the voice falling behind, which
  the story's longest hole before the onset shows too). An item passes when it goes on with no
  silence over 0.5 s and no new reply. While the story is paused and the server has not yet shown
  what it makes of the overlap, the bench listens on past the window (up to 8 s after the
  overlap's end), so that resumed, cut and new reply are told apart on a slow machine. v1.5
  labels what follows the overlap with an LLM judge (respond / resume / uncertain / unknown);
  here the server's events say which reply is which, so no judge is needed.
Items whose story had ended before the overlap, or that got no reply at all, are invalid: counted,
and left out of the rates.

Which reply is which: the server's `bot_text` and `bot_done` carry the turn; a chunk of audio
belongs to the turn of the last `bot_text` before it (a reply's text always precedes its audio);
`interrupted` (what was heard of a cut reply), `clear` and `final` arrive in order.

    duplex bench overlap --json overlap.json
    duplex bench overlap --items 2 --categories interruption,backchannel --server-arg=--endpointing=rules
    duplex bench overlap --url ws://127.0.0.1:8080/ws     # a server already running
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from transport.audio import INPUT_RATE

RATE = INPUT_RATE  # the mic's rate: what the recognizer hears
CATEGORIES = ("pause", "turn_taking", "interruption", "backchannel", "background", "side_talk")
OVERLAPS = ("interruption", "backchannel", "background", "side_talk")
VOICES = ("slt", "kal", "awb", "rms", "piper")  # flite's four, then Piper's default voice

SYSTEM_PROMPT = (
    "You are a friendly voice assistant in a spoken conversation. When the user asks for a story, "
    "tell a long story of at least ten sentences in plain English. When the user asks a question, "
    "answer it directly in one or two short sentences. Never say the user's sentence back.")
SERVER_ARGS = ("--system-prompt", SYSTEM_PROMPT, "--max-tokens", "120")

# FD-Bench's rule: a reply shorter than 1 s with at most 3 words is not a take-over
TURN_MIN_S, TURN_MAX_WORDS = 1.0, 3
STOP_GAP_S = 0.5  # heard audio that stops this long has stopped (FD-Bench's model merge gap)
VOICED_BELOW_PEAK_DB = 35.0
VOICED_FLOOR_DB = -70.0
WINDOW_S, AFTER_S = 6.0, 3.0  # backchannel, background, side talk: the window after the onset
DECIDE_S = 8.0  # ... listened to longer, up to this after the overlap's end, while the story is paused
HEAR_S = 3.0  # pause, turn taking: at most this long after the reply's first heard audio
REPLY_WAIT_S = 20.0  # no reply heard this long after the user's turn: the item is invalid
ANSWER_WAIT_S = 12.0  # interruption: the new question's answer, after its end
ITEM_TIMEOUT_S = 75.0
LEAD_S = (0.3, 0.5)
OFFSET_S = (1.5, 2.5)  # the overlap's onset after the reply's first heard audio (FD-Bench v1.5)
PAUSE_S = (1.0, 1.5)
LEVEL_DB = (-26.0, -18.0)
NOISE_DB = (-66.0, -56.0)
BACKGROUND_DB = -20.0
SIDE_DROP_DB = (3.0, 6.0)
RT60_S = (0.3, 0.5)

TARGETS = {  # the acceptance figures, printed beside the measured ones
    "pause": {"tor": "<= 0.05"},
    "turn_taking": {"tor": "1.0"},
    "interruption": {"stop_250ms": ">= 95 %", "answered": ">= 95 %"},
    "backchannel": {"pass": ">= 90 %: goes on, no silence > 0.5 s, no new reply"},
    "background": {"pass": ">= 90 %: goes on, no silence > 0.5 s, no reply"},
    "side_talk": {"pass": ">= 90 %: goes on, no silence > 0.5 s, no reply"},
}

# ---- what is said ---------------------------------------------------------------------------------
PAUSED = [  # (first half, second half): a mid-sentence pause goes between them
    ("Can you tell me how", "to bake bread at home?"),
    ("Could you explain why", "the ocean is salty?"),
    ("What is the best way to", "learn to play the guitar?"),
    ("Can you give me some ideas for", "a birthday party for my son?"),
    ("I was wondering if you could", "recommend a good movie to watch."),
    ("How long does it take to", "boil an egg?"),
    ("Tell me the difference between", "a frog and a toad."),
    ("Can you help me plan", "a trip to the mountains?"),
    ("Why do people", "get hiccups?"),
    ("What should I cook", "for dinner tonight?"),
    ("Can you remind me how", "photosynthesis works?"),
    ("I need some advice on", "how to sleep better."),
]
QUESTIONS = [
    "Why is the sky blue?",
    "How do bees make honey?",
    "What causes the seasons on Earth?",
    "How does a rainbow form?",
    "Why do we need to sleep?",
    "How do airplanes stay in the air?",
    "What makes a volcano erupt?",
    "Why do leaves change color in the fall?",
    "How does the moon affect the tides?",
    "What is the water cycle?",
    "How do fish breathe underwater?",
    "Why do cats purr?",
]
STORIES = [
    "Tell me a story about a lighthouse keeper.",
    "Tell me a story about a dragon who was afraid of fire.",
    "Tell me a story about a lost puppy.",
    "Tell me a story about a sailor caught in a storm.",
    "Tell me a story about a little robot.",
    "Tell me a story about a girl who found an old map.",
    "Tell me a story about a baker in a small town.",
    "Tell me a story about an old clockmaker.",
    "Tell me a story about a fox and a crow.",
    "Tell me a story about a boy who wanted to fly.",
    "Tell me a story about a king and his gardener.",
    "Tell me a story about a train that could not stop.",
]
INTERRUPTIONS = [  # (the new question, its answer's key words: any one)
    ("Wait, what is the capital of France?", ("paris",)),
    ("Wait, what is the capital of Japan?", ("tokyo",)),
    ("Hold on, how many legs does a spider have?", ("eight", "8")),
    ("Sorry, what is the largest planet in our solar system?", ("jupiter",)),
    ("Wait, who wrote Romeo and Juliet?", ("shakespeare",)),
    ("Stop, what is the capital of Italy?", ("rome",)),
    ("Wait, what is frozen water called?", ("ice",)),
    ("Hold on, what is the opposite of hot?", ("cold",)),
    ("Wait, how many days are in a week?", ("seven", "7")),
    ("Sorry, what animal says moo?", ("cow", "cows")),
    ("Wait, what is the capital of Germany?", ("berlin",)),
    ("Hold on, what color is grass?", ("green",)),
]
BACKCHANNELS = ["Mm-hmm.", "Yeah.", "Right.", "Okay.", "Uh-huh."]
BACKGROUND = [
    "And in other news tonight, the city council approved the new budget for the park.",
    "The weather tomorrow will be sunny, with a high of seventy degrees.",
    "I told him we should have left earlier, but he never listens to me.",
    "Did you see the game last night? It went into overtime again.",
    "Our next guest has written three books about gardening. Please welcome her.",
    "The train to the airport is delayed by fifteen minutes. We apologize for the wait.",
    "She said the meeting moved to Thursday, so I booked the small room.",
    "Stocks closed higher today after a quiet morning of trading.",
    "Can you believe how expensive the tickets were this year?",
    "Stay tuned, after the break we will look at the best recipes for summer.",
    "I think the blue one looks better, but the red one was cheaper.",
    "Traffic is heavy on the main bridge because of an accident near the exit.",
]
SIDE_TALK = [
    "Honey, can you grab my keys from the table?",
    "Hey, could you turn the oven off for me?",
    "Sweetie, your shoes are by the front door.",
    "Can you close the window? It's getting cold in here.",
    "Tom, please feed the dog before you go.",
    "Mom, I'll be down for dinner in a minute.",
    "Could you hand me that pen over there?",
    "Hey, don't forget to call your sister tonight.",
    "Kids, it's time to brush your teeth.",
    "Babe, did you lock the back door?",
    "Jenny, can you answer the phone for me?",
    "Dad, the car keys are in the kitchen drawer.",
]


# ---- audio ---------------------------------------------------------------------------------------
def _frame_power(x: np.ndarray, rate: int, step_s: float = 0.02) -> np.ndarray:
    n = max(1, int(step_s * rate))
    m = x.size // n
    if m == 0:
        return np.array([float(np.mean(x * x))]) if x.size else np.zeros(1)
    return np.mean(x[:m * n].reshape(m, n) ** 2, axis=1)


def speech_level_db(x: np.ndarray, rate: int = RATE, within_db: float = 30.0) -> float:
    """The RMS level (dBFS) over the speech frames of `x`: 20 ms frames within `within_db` of
    the loudest."""
    p = _frame_power(np.asarray(x, np.float32), rate)
    top = float(p.max())
    if top <= 0:
        return -math.inf
    speech = p[p >= top * 10 ** (-within_db / 10)]
    return 10 * math.log10(float(speech.mean()))


def set_level(x: np.ndarray, level_db: float, rate: int = RATE) -> np.ndarray:
    now = speech_level_db(x, rate)
    if not math.isfinite(now):
        return np.asarray(x, np.float32)
    return (np.asarray(x, np.float32) * 10 ** ((level_db - now) / 20)).astype(np.float32)


def speech_span(x: np.ndarray, rate: int = RATE, below_peak_db: float = 40.0,
                min_run_s: float = 0.02) -> tuple[float, float]:
    """(onset, end) of the speech in `x`, seconds: the first and last 5 ms steps of the runs of
    `min_run_s` or more within `below_peak_db` of the loudest (any such step where no run is
    that long). A lone step is no onset: flite's awb opens six of the bench's phrases with
    145 ms of hiss 40-52 dB down, one step of it at 40, where flite's own segment times put the
    first phone at the end of it (docs/turn-taking.md)."""
    p = _frame_power(np.asarray(x, np.float32), rate, 0.005)
    top = float(p.max())
    if top <= 0:
        return 0.0, 0.0
    loud = p >= top * 10 ** (-below_peak_db / 10)
    n = max(1, int(round(min_run_s / 0.005)))
    runs = np.flatnonzero(np.convolve(loud, np.ones(n), "valid") >= n) if loud.size >= n else np.zeros(0, int)
    if runs.size:
        return float(runs[0]) * 0.005, float(runs[-1] + n) * 0.005
    steps = np.flatnonzero(loud)
    return float(steps[0]) * 0.005, float(steps[-1] + 1) * 0.005


def trim(x: np.ndarray, rate: int = RATE) -> np.ndarray:
    a, b = speech_span(x, rate)
    return np.asarray(x[int(a * rate):int(math.ceil(b * rate))], np.float32)


def convolve(x: np.ndarray, h: np.ndarray) -> np.ndarray:
    n = x.size + h.size - 1
    size = 1 << (n - 1).bit_length()
    return np.fft.irfft(np.fft.rfft(x, size) * np.fft.rfft(h, size), size)[:n].astype(np.float32)


def room(x: np.ndarray, rng: np.random.Generator, rate: int = RATE) -> np.ndarray:
    """`x` as heard from across a small room: the direct sound and an exponentially decaying
    noise tail (RT60 drawn from `RT60_S`), about as loud as each other."""
    rt60 = rng.uniform(*RT60_S)
    n = int(rt60 * rate)
    t = np.arange(n) / rate
    tail = rng.standard_normal(n) * 10 ** (-3 * t / rt60)  # -60 dB at rt60
    tail[: int(0.005 * rate)] = 0  # the first reflections come a few ms after the direct sound
    wet = convolve(x, tail.astype(np.float32))
    wet *= math.sqrt(float(np.sum(x * x)) / max(float(np.sum(wet * wet)), 1e-12))
    out = np.zeros(wet.size, np.float32)
    out[:x.size] += x
    return out + wet * rng.uniform(0.7, 1.0)


def hum(n: int, rms: float, rng: np.random.Generator) -> np.ndarray:
    """Low-passed noise (a room's, a TV's) of `rms`."""
    x = np.convolve(rng.standard_normal(n + 64), np.ones(16) / 16, mode="same")[32:32 + n]
    return (x * rms / max(float(np.sqrt(np.mean(x * x))), 1e-12)).astype(np.float32)


class Voices:
    """Speaks text in a voice at 16 kHz, once per (voice, text): flite's voices by the flite
    command, Piper's through the product's synthesizer (loaded at its first use)."""

    def __init__(self, work: Path):
        self.work = work
        self._piper = None
        self._cache: dict[tuple[str, str], np.ndarray] = {}

    def __call__(self, text: str, voice: str) -> np.ndarray:
        from agent.bench.quality import speak

        key = (voice, text)
        if key not in self._cache:
            if voice == "piper" and self._piper is None:
                from tts.piper_voice import PiperSynthesizer

                self._piper = PiperSynthesizer(threads=1)
            path = self.work / f"v{len(self._cache)}.wav"
            self._cache[key] = trim(speak(text, voice, path, self._piper))
        return self._cache[key]


# ---- the items -----------------------------------------------------------------------------------
@dataclass
class Item:
    category: str
    index: int
    voice: str
    text: str  # what the user says first
    first: np.ndarray  # lead silence, then it
    speech: tuple[float, float]  # its speech onset and end in `first`, seconds
    level_db: float
    noise_db: float
    seed: int
    pause: tuple[float, float] | None = None  # pause: the silence inside `first`, seconds
    overlap_text: str = ""
    overlap: np.ndarray | None = None  # what comes over the reply, its speech from sample 0
    overlap_end_s: float = 0.0  # the end of its speech in `overlap`
    overlap_voice: str = ""
    overlap_db: float | None = None  # its speech level
    offset_s: float = 0.0  # its onset after the reply's first heard audio
    key: tuple[str, ...] = ()  # interruption: the answer's key words

    @property
    def name(self) -> str:
        return f"{self.category}{self.index}:{self.voice}"


def item_rng(seed: int, category: str, index: int) -> np.random.Generator:
    """Each item's own generator: an item is the same whichever categories and counts are run."""
    return np.random.default_rng([seed, CATEGORIES.index(category), index])


def make_item(category: str, index: int, seed: int, speak: Callable[[str, str], np.ndarray]) -> Item:
    rng = item_rng(seed, category, index)
    voice = VOICES[(index + CATEGORIES.index(category)) % len(VOICES)]
    level, noise = float(rng.uniform(*LEVEL_DB)), float(rng.uniform(*NOISE_DB))
    lead = np.zeros(int(rng.uniform(*LEAD_S) * RATE), np.float32)
    pick = lambda seq: seq[index % len(seq)]  # noqa: E731 - each list in turn, the same for a seed
    pause = None
    if category == "pause":
        a, b = pick(PAUSED)
        text = f"{a} ... {b}"
        gap = np.zeros(int(rng.uniform(*PAUSE_S) * RATE), np.float32)
        one, two = speak(a, voice), speak(b, voice)
        scale = 10 ** ((level - speech_level_db(np.concatenate([one, two]))) / 20)
        first = np.concatenate([lead, one * scale, gap, two * scale]).astype(np.float32)
        pause = ((lead.size + one.size) / RATE, (lead.size + one.size + gap.size) / RATE)
    else:
        text = pick(QUESTIONS) if category == "turn_taking" else pick(STORIES)
        first = np.concatenate([lead, set_level(speak(text, voice), level)])
    item = Item(category, index, voice, text, first, speech_span(first), level, noise, seed, pause=pause)
    if category not in OVERLAPS:
        return item
    item.offset_s = float(rng.uniform(*OFFSET_S))
    other = voice
    if category == "interruption":
        item.overlap_text, item.key = pick(INTERRUPTIONS)
        over, item.overlap_db = speak(item.overlap_text, voice), level
        over = set_level(over, level)
    elif category == "backchannel":
        item.overlap_text = BACKCHANNELS[int(rng.integers(len(BACKCHANNELS)))]
        over, item.overlap_db = set_level(speak(item.overlap_text, voice), level), level
    elif category == "background":
        item.overlap_text = pick(BACKGROUND)
        other = str(rng.choice([v for v in VOICES if v != voice]))
        item.overlap_db = level + BACKGROUND_DB
        over = set_level(speak(item.overlap_text, other), item.overlap_db)
    else:  # side_talk
        item.overlap_text = pick(SIDE_TALK)
        item.overlap_db = level - float(rng.uniform(*SIDE_DROP_DB))
        over = set_level(speak(item.overlap_text, voice), item.overlap_db)
    item.overlap_end_s = speech_span(over)[1]  # of the voice alone: the noise and the tail go on after it
    if category == "background":
        over = over + hum(over.size, 10 ** ((item.overlap_db - 10) / 20), rng)
    elif category == "side_talk":
        over = set_level(room(over, rng), item.overlap_db)
    item.overlap, item.overlap_voice = over.astype(np.float32), other
    return item


def build_items(categories: Sequence[str], n: int, seed: int, speak: Callable[[str, str], np.ndarray]) -> list[Item]:
    return [make_item(cat, i, seed, speak) for cat in categories for i in range(n)]


# ---- metrics (pure) ------------------------------------------------------------------------------
def take_over(heard_s: float | None, words: int) -> bool:
    """FD-Bench's rule: a reply takes the turn unless it has no words, or lasts under 1 s with
    at most 3 words. `heard_s`: from its first to its last voiced step heard (None: not heard)."""
    if heard_s is None or words <= 0:
        return False
    return heard_s >= TURN_MIN_S or words > TURN_MAX_WORDS


def voiced_floor(chunks) -> float:
    """The level a 10 ms step must reach to be voiced: 35 dB below the loudest step of `chunks`."""
    peak = max((lv for c in chunks for lv in c.levels), default=VOICED_FLOOR_DB)
    return max(VOICED_FLOOR_DB, peak - VOICED_BELOW_PEAK_DB)


def voiced_spans(chunks, floor_db: float, step_s: float = 0.01) -> list[tuple[float, float]]:
    """The voiced stretches of heard `chunks` (start, end), merged, in order."""
    spans: list[tuple[float, float]] = []
    for c in sorted(chunks, key=lambda c: c.start):
        for i, lv in enumerate(c.levels):
            a = c.start + i * step_s
            b = min(c.start + (i + 1) * step_s, c.end)
            if lv < floor_db or b <= a:
                continue
            if spans and a <= spans[-1][1] + 1e-6:
                spans[-1] = (spans[-1][0], max(spans[-1][1], b))
            else:
                spans.append((a, b))
    return spans


def heard_span(chunks) -> tuple[float, float] | None:
    """First and last voiced instants of heard `chunks`, or None if none was voiced."""
    spans = voiced_spans(chunks, voiced_floor(chunks))
    return (spans[0][0], spans[-1][1]) if spans else None


def longest_silence(chunks, start: float, end: float, floor_db: float | None = None) -> float:
    """The longest stretch of [start, end] with no voiced heard audio of `chunks`."""
    if end <= start:
        return 0.0
    spans = voiced_spans(chunks, voiced_floor(chunks) if floor_db is None else floor_db)
    longest, t = 0.0, start
    for a, b in spans:
        if b <= start:
            continue
        if a >= end:
            break
        longest = max(longest, a - t)
        t = max(t, b)
    return max(longest, end - t, 0.0)


def paused_for(chunks, clears: Sequence[float], end: float, floor_db: float) -> float:
    """The longest silence a pause made: from a clear to the next voiced step of `chunks` heard
    (or `end`). The rest of a silence is the voice falling behind, with or without an overlap."""
    spans = voiced_spans(chunks, floor_db)
    out = 0.0
    for t in clears:
        if t >= end:
            break
        back = next((a for a, b in spans if b > t), end)
        out = max(out, min(back, end) - t)
    return out


def stop_time(chunks, onset: float, gap_s: float = STOP_GAP_S) -> float:
    """When the heard `chunks` stop after `onset`: the end of the heard audio that runs on from
    the onset with no gap of `gap_s` (the onset itself when none was playing or came soon)."""
    t = onset
    for c in sorted(chunks, key=lambda c: c.start):
        if c.end <= onset or c.end <= c.start:
            continue
        if c.start >= t + gap_s:
            break
        t = max(t, c.end)
    return t


def turn_of_chunks(chunks, texts: Sequence[tuple[float, int]]) -> list[int | None]:
    """The turn of each chunk: that of the last `bot_text` (arrival time, turn) that arrived
    before the chunk did, or None."""
    texts = sorted(texts)
    times = [t for t, _ in texts]
    out = []
    for c in chunks:
        i = int(np.searchsorted(times, c.received, side="right"))
        out.append(texts[i - 1][1] if i else None)
    return out


def overlap_outcome(*, story_finished: bool, heard_after: bool, cut: bool, new_reply: bool,
                    paused: bool) -> str:
    """What the bot did with the overlap: 'new_reply' (it answered it), 'cut' (the story was cut,
    nothing said instead), 'resumed' (paused, then the story went on), 'went_on' (never paused),
    or 'stopped' (paused and never went on within the window)."""
    if new_reply:
        return "new_reply"
    if cut:
        return "cut"
    if heard_after or story_finished:
        return "resumed" if paused else "went_on"
    return "stopped"


def words_in(text: str) -> int:
    return len(re.findall(r"[A-Za-z0-9']+", text or ""))


def says_key(text: str, keys: Sequence[str]) -> bool:
    said = set(re.findall(r"[a-z0-9]+", (text or "").lower()))
    return any(k in said for k in keys)


# ---- one conversation, as measured --------------------------------------------------------------
@dataclass
class Seen:
    """A finished conversation read back: events by type with their times, chunks by turn."""

    t0: float
    events: list[tuple[float, dict]]
    chunks: list  # HeardChunk, heard for some time
    turns: list[int | None]  # each chunk's turn

    @classmethod
    def of(cls, c) -> "Seen":
        events = list(zip(c.event_times, c.events))
        chunks = [h for h in c.heard if h.end > h.start]
        texts = [(t, e["turn"]) for t, e in events if e.get("type") == "bot_text" and isinstance(e.get("turn"), int)]
        return cls(c.started or 0.0, events, chunks, turn_of_chunks(chunks, texts))

    def of_type(self, kind: str, after: float = -math.inf) -> list[tuple[float, dict]]:
        return [(t, e) for t, e in self.events if e.get("type") == kind and t >= after]

    def chunks_of(self, turn: int | None) -> list:
        return [c for c, t in zip(self.chunks, self.turns) if t == turn]

    def first_turn_after(self, t: float) -> int | None:
        """The first reply whose audio began playing at or after `t` (a reply that began before
        `t` and plays on is not it)."""
        began: dict[int | None, float] = {}
        for c, turn in zip(self.chunks, self.turns):
            began[turn] = min(began.get(turn, math.inf), c.start)
        after = [(start, turn) for turn, start in began.items() if start >= t and turn is not None]
        return min(after)[1] if after else None

    def text_of(self, turn: int | None) -> str:
        done = [e.get("text", "") for _, e in self.of_type("bot_done") if e.get("turn") == turn]
        if done:
            return done[-1]
        return "".join(e.get("text", "") for _, e in self.of_type("bot_text") if e.get("turn") == turn)

    def done_at(self, turn: int | None) -> float | None:
        return next((t for t, e in self.of_type("bot_done") if e.get("turn") == turn), None)

    def heard_words(self, turn: int | None, chunks) -> int:
        """Words heard of `turn`'s reply: what an `interrupted` after its last chunk (and before
        its `bot_done`) says was heard, else its whole text."""
        if chunks:
            last = max(c.received for c in chunks)
            done = self.done_at(turn)
            cut = [e for t, e in self.of_type("interrupted", after=last) if done is None or t < done]
            if cut:
                return words_in(cut[0].get("heard", ""))
        return words_in(self.text_of(turn))

    def rel(self, t: float | None) -> float | None:
        return None if t is None else round(t - self.t0, 3)


def merged(chunks, t0: float, gap_s: float = 0.01) -> list[list[float]]:
    """Heard `chunks` as merged [start, end] stretches, seconds after `t0`: the timeline, compactly."""
    out: list[list[float]] = []
    for c in sorted(chunks, key=lambda c: c.start):
        if out and c.start <= out[-1][1] + gap_s:
            out[-1][1] = max(out[-1][1], c.end)
        else:
            out.append([c.start, c.end])
    return [[round(a - t0, 3), round(b - t0, 3)] for a, b in out]


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def measure(item: Item, c, onsets: list[float | None], stream0_s: float = 0.0,
            window_end: float | None = None) -> dict:
    """The figures of one item from what its conversation saw (module docstring). `onsets`: when
    the first clip and the overlap began (capture time; None: not said); `stream0_s`: where the
    first clip began in the mic stream, seconds (the server's endpoints count from the stream's
    start); `window_end`: the end of the window after an overlap (default: from the onset)."""
    s = Seen.of(c)
    start0 = onsets[0]
    row: dict = {"category": item.category, "index": item.index, "name": item.name, "voice": item.voice,
                 "text": item.text, "level_db": round(item.level_db, 1), "noise_db": round(item.noise_db, 1),
                 "valid": True, "reason": "", "timed_out": c.timed_out, "lost": c.lost,
                 "finals": [(e.get("turn"), e.get("text", "")) for _, e in s.of_type("final")],
                 "replies": {}, "clears": [s.rel(t) for t, _ in s.of_type("clear")],
                 "interrupted": [(s.rel(t), e.get("heard", "")) for t, e in s.of_type("interrupted")],
                 "errors": [e for _, e in s.of_type("error")], "marks_sent": c.marks_sent,
                 "overflows": c.overflows, "bad_audio": c.bad_audio}
    for turn in sorted({t for t in s.turns if t is not None} |
                       {e.get("turn") for _, e in s.of_type("bot_text") if isinstance(e.get("turn"), int)}):
        ch = s.chunks_of(turn)
        row["replies"][str(turn)] = {"text": s.text_of(turn)[:400], "heard_s": _r(sum(x.seconds for x in ch)),
                                     "first": s.rel(min((x.start for x in ch), default=None)),
                                     "last": s.rel(max((x.end for x in ch), default=None)),
                                     "done": s.rel(s.done_at(turn)), "heard": merged(ch, s.t0)}
    if start0 is None:
        row.update(valid=False, reason="the conversation never began")
        return row
    end = start0 + item.speech[1]
    row["speech_end"] = s.rel(end)
    if item.category in ("pause", "turn_taking"):
        return _measure_turn(item, s, row, start0, end, stream0_s)
    return _measure_overlap(item, s, row, end, onsets[1], window_end)


def _measure_turn(item: Item, s: Seen, row: dict, start0: float, end: float, stream0_s: float) -> dict:
    after = s.first_turn_after(end)
    reply = s.chunks_of(after) if after is not None else []
    span = heard_span(reply)
    row["reply_turn"] = after
    row["latency_s"] = _r(span[0] - end) if span else None
    row["take_over"] = take_over(span[1] - span[0] if span else None, s.heard_words(after, reply)) if reply else False
    if item.category == "turn_taking":
        if not reply:
            row["reason"] = "no reply heard"
        return row
    p0, p1 = start0 + item.pause[0], start0 + item.pause[1]
    row["pause"] = [s.rel(p0), s.rel(p1)]
    early = sorted({t for ch, t in zip(s.chunks, s.turns) if ch.start < end and ch.start >= p0 - 0.05})
    tors = []
    for turn in early:
        ch = s.chunks_of(turn)
        sp = heard_span(ch)
        tors.append(take_over(sp[1] - sp[0] if sp else None, s.heard_words(turn, ch)))
    row["early_turns"] = early
    row["tor"] = any(tors)  # pause: the bot took the turn before the user had finished
    # the server ended a turn inside the pause: its end of speech (mic stream seconds) lies before it
    resumed_s = stream0_s + item.pause[1]
    row["split"] = any(isinstance(e.get("speech_end_stream_s"), (int, float)) and e["speech_end_stream_s"] < resumed_s
                       for _, e in s.of_type("endpoint"))
    return row


def _measure_overlap(item: Item, s: Seen, row: dict, end: float, start1: float | None,
                     window_end: float | None) -> dict:
    story_turn = s.first_turn_after(end)
    story = s.chunks_of(story_turn) if story_turn is not None else []
    row["story_turn"] = story_turn
    if not story:
        row.update(valid=False, reason="no reply heard to talk over")
        return row
    first = min(x.start for x in story)
    row["story_first_heard"] = s.rel(first)
    row["story_latency_s"] = _r((heard_span(story) or (first, first))[0] - end)
    if start1 is None:
        row.update(valid=False, reason="the overlap was never said (the reply ended or stalled)")
        return row
    onset, over_end = start1, start1 + item.overlap_end_s
    row.update(overlap_text=item.overlap_text, overlap_voice=item.overlap_voice,
               overlap_db=_r(item.overlap_db, 1), offset_s=_r(item.offset_s),
               onset=s.rel(onset), overlap_end=s.rel(over_end))
    story_done = s.done_at(story_turn)
    last_heard = max(x.end for x in story)
    if story_done is not None and story_done <= onset and last_heard <= onset:
        row.update(valid=False, reason="the story had ended before the overlap")
        return row
    floor = voiced_floor(story)
    cut = bool(s.of_type("interrupted", after=onset))
    clears = s.of_type("clear", after=onset)
    new = sorted({e["turn"] for _, e in s.of_type("bot_text", after=onset)
                  if isinstance(e.get("turn"), int) and e["turn"] != story_turn}
                 | {t for ch, t in zip(s.chunks, s.turns) if t is not None and t != story_turn and ch.start >= onset})
    again = onset if not clears else clears[0][0]
    heard_after = any(a >= again for a, _ in voiced_spans(story, floor))
    row.update(paused=bool(clears), pause_after_s=_r(clears[0][0] - onset) if clears else None, cut=cut,
               new_turns=new, new_reply=bool(new))
    row["outcome"] = overlap_outcome(story_finished=story_done is not None, heard_after=heard_after, cut=cut,
                                     new_reply=bool(new), paused=bool(clears))
    row["delay_s"] = _r(onset - first)  # the cue's offset, or later where it waited for the voice
    if item.category == "interruption":
        row["stop_latency_s"] = _r(stop_time(story, onset) - onset)
        row["key"] = list(item.key)
        reply = new[0] if new else None
        text = s.text_of(reply) if reply is not None else ""
        row["answer"] = text[:400]
        row["answered"] = says_key(text, item.key)
        ch = s.chunks_of(reply) if reply is not None else []
        sp = heard_span(ch)
        row["take_over"] = take_over(sp[1] - sp[0] if sp else None, s.heard_words(reply, ch)) if ch else False
        row["response_latency_s"] = _r(sp[0] - over_end) if sp else None
        return row
    if window_end is None:
        window_end = max(onset + WINDOW_S, over_end + AFTER_S)
    until = window_end
    if story_done is not None and not cut and last_heard <= window_end:
        until = last_heard  # the story finished: no silence after its end counts
    row["window"] = [s.rel(onset), s.rel(until)]
    row["longest_silence_s"] = _r(longest_silence(story, onset, until, floor))
    row["paused_for_s"] = _r(paused_for(story, [t for t, _ in clears], until, floor)) if clears else 0.0
    row["longest_silence_before_s"] = _r(longest_silence(story, first, min(onset, last_heard), floor))
    row["goes_on"] = row["outcome"] in ("went_on", "resumed")
    row["passed"] = row["goes_on"] and row["longest_silence_s"] <= 0.5 and not row["new_reply"]
    return row


# ---- running one item ----------------------------------------------------------------------------
def _done_between(c, kind: str, a: float, b: float, skip_turn: int | None = None) -> bool:
    """An event of `kind` (of a turn other than `skip_turn`) arrived between `a` and `b`."""
    return any(e.get("type") == kind and a <= t <= b and (skip_turn is None or e.get("turn") != skip_turn)
               for t, e in zip(c.event_times, c.events))


def _turn_before(c, t: float) -> int | None:
    """The turn of the last `bot_text` that arrived before `t`."""
    turn = None
    for at, e in zip(c.event_times, c.events):
        if at >= t:
            break
        if e.get("type") == "bot_text" and isinstance(e.get("turn"), int):
            turn = e["turn"]
    return turn


def _answer_heard(c, onset: float, story: int | None, keys: Sequence[str]) -> bool:
    """The reply after the story has its key word in its text so far, and enough of it was heard
    to tell a take-over."""
    texts = [(t, e) for t, e in zip(c.event_times, c.events)
             if e.get("type") == "bot_text" and t >= onset and e.get("turn") != story]
    if not texts or not says_key("".join(e.get("text", "") for _, e in texts
                                         if e.get("turn") == texts[0][1].get("turn")), keys):
        return False
    began = texts[0][0]
    return sum(min(h.end, c.now) - h.start for h in c.heard if h.received >= began) >= TURN_MIN_S + 0.2


def _decided(c, onset: float) -> bool:
    """After speech over the story, the server has shown what it makes of it: it never paused
    the story, the story was heard again after its last pause, or another turn's reply began."""
    story = _turn_before(c, onset)
    clears = [t for t, e in zip(c.event_times, c.events) if e.get("type") == "clear" and t >= onset]
    return (not clears or any(h.start >= clears[-1] for h in c.heard)
            or any(e.get("type") == "bot_text" and t >= onset and e.get("turn") != story
                   for t, e in zip(c.event_times, c.events)))


async def run_item(url: str, item: Item, timeout_s: float = ITEM_TIMEOUT_S, refused_wait_s: float = 30.0) -> dict:
    """One conversation: the first clip at once, the overlap (if any) `item.offset_s` after the
    reply's first heard audio; listens until the category has what it measures (module
    docstring), or its bounds pass."""
    from websockets.exceptions import InvalidHandshake, InvalidStatus

    from transport.web.client import CuedMic, at_once, play_along

    mic: CuedMic
    window: list[float] = []
    seen: list = []  # the conversation as the mic last saw it: what an item that overran had got to

    def speech_end(c) -> float | None:
        t = mic.onset(0, c)
        return None if t is None else t + item.speech[1]

    def overlap_at(c) -> float | None:
        """`offset_s` after the reply's first heard audio, at the first frame the bot is heard
        then: a cue that fell in a hole of the reply's audio (its voice falling behind) waits for
        it to play again, so the overlap always comes over the bot's voice."""
        end = speech_end(c)
        first = None if end is None else c.first_heard_after(end)
        if first is None or c.now < first + item.offset_s or not c.playing_at(c.now):
            return None
        return c.now

    def done(c) -> bool:
        seen[:] = [c]
        end = speech_end(c)
        if end is None:
            return False
        if not mic.sent_all:
            return mic.waiting and c.now > end + REPLY_WAIT_S  # no reply to talk over
        if item.overlap is None:  # enough of the reply to tell a take-over, or all of it
            first = c.first_heard_after(end)
            heard = first is not None and sum(min(h.end, c.now) - h.start for h in c.heard
                                              if h.start >= first) >= TURN_MIN_S + 0.2
            return ((first is not None and (heard or c.now >= first + HEAR_S)) or c.now > end + REPLY_WAIT_S
                    or _done_between(c, "bot_done", end, c.now - 0.5))
        onset = mic.onset(1, c)
        over_end = onset + item.overlap_end_s
        if item.category == "interruption":  # the answer finished, or heard long enough and said
            story = _turn_before(c, onset)
            return (c.now > over_end + ANSWER_WAIT_S
                    or _done_between(c, "bot_done", onset, c.now - 0.5, skip_turn=story)
                    or _answer_heard(c, onset, story, item.key))
        if not window:
            window.append(max(onset + WINDOW_S, over_end + AFTER_S))
        if c.now < window[0]:
            return False
        return c.now >= over_end + DECIDE_S or _decided(c, onset)

    clips = [(item.first, at_once)] + ([(item.overlap, overlap_at)] if item.overlap is not None else [])
    loop = asyncio.get_running_loop()
    t = loop.time()
    while True:
        mic = CuedMic(RATE, clips, done, noise_rms=10 ** (item.noise_db / 20), seed=item.seed * 1000 + item.index)
        try:
            async with asyncio.timeout(timeout_s + 20.0):
                c = await play_along(url, mic, RATE, timeout_s=timeout_s, ping_interval=5.0, ping_timeout=20.0)
            break
        except InvalidStatus as e:
            if e.response.status_code != 503 or loop.time() - t > refused_wait_s:
                return _failed(item, f"HTTP {e.response.status_code}")
            await asyncio.sleep(1.0)  # the last conversation is still being counted: try again
        except TimeoutError as e:
            if not seen:
                return _failed(item, f"TimeoutError: {e}")
            return _failed(item, f"no end within {timeout_s + 20.0:.0f} s: {_where(seen[0], loop.time())}")
        except (OSError, InvalidHandshake) as e:
            return _failed(item, f"{type(e).__name__}: {e}")
    onsets = [mic.onset(0, c)]
    if item.overlap is not None:
        onsets.append(mic.onset(1, c))
    row = measure(item, c, onsets, stream0_s=(mic.start_frames[0] if mic.start_frames else 0) / 50,
                  window_end=window[0] if window else None)
    row["seconds"] = round(loop.time() - t, 1)
    return row


def _where(c, now: float) -> str:
    """Where a conversation that overran its bounds stood: for the server's log beside it."""
    last = f"{c.events[-1].get('type')} {now - c.event_times[-1]:.1f} s ago" if c.event_times else "none"
    return (f"{len(c.frame_times)} frames sent (the mic last asked {now - c.now:.1f} s ago), "
            f"{len(c.heard)} chunks heard, {len(c.events)} events (the last: {last}), "
            f"closed {c.close_code}")


def _failed(item: Item, reason: str) -> dict:
    return {"category": item.category, "index": item.index, "name": item.name, "voice": item.voice,
            "text": item.text, "valid": False, "reason": reason, "error": True}


# ---- the figures -----------------------------------------------------------------------------------
def _rate(rows: list[dict], key: str) -> float | None:
    vals = [bool(r.get(key)) for r in rows]
    return round(sum(vals) / len(vals), 3) if vals else None


def _median(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return round(float(np.median(vals)), 3) if vals else None


def _p90(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return round(float(np.percentile(vals, 90)), 3) if vals else None


def summarize(category: str, rows: list[dict]) -> dict:
    valid = [r for r in rows if r.get("valid")]
    out = {"items": len(rows), "valid": len(valid), "invalid": [f"{r['name']}: {r['reason']}" for r in rows
                                                                if not r.get("valid")]}
    if category == "pause":
        out.update(tor=_rate(valid, "tor"), split=_rate(valid, "split"),
                   replied_after=_rate(valid, "take_over"), latency_p50_s=_median(valid, "latency_s"))
    elif category == "turn_taking":
        out.update(tor=_rate(valid, "take_over"), latency_p50_s=_median(valid, "latency_s"),
                   latency_p90_s=_p90(valid, "latency_s"),
                   latency_mean_s=round(float(np.mean([r["latency_s"] for r in valid if r.get("latency_s") is not None])), 3)
                   if any(r.get("latency_s") is not None for r in valid) else None)
    elif category == "interruption":
        out.update(stop_p50_s=_median(valid, "stop_latency_s"), stop_p90_s=_p90(valid, "stop_latency_s"),
                   stop_250ms=round(sum(r["stop_latency_s"] <= 0.25 for r in valid) / len(valid), 3) if valid else None,
                   answered=_rate(valid, "answered"), tor=_rate(valid, "take_over"),
                   response_p50_s=_median(valid, "response_latency_s"))
    else:
        out.update(goes_on=_rate(valid, "goes_on"), paused=_rate(valid, "paused"),
                   silence_over_05=round(sum(r["longest_silence_s"] > 0.5 for r in valid) / len(valid), 3)
                   if valid else None,
                   longest_silence_p50_s=_median(valid, "longest_silence_s"),
                   longest_silence_max_s=max((r["longest_silence_s"] for r in valid), default=None),
                   paused_for_p50_s=_median(valid, "paused_for_s"),
                   paused_for_max_s=max((r["paused_for_s"] for r in valid), default=None),
                   silence_before_p50_s=_median(valid, "longest_silence_before_s"),
                   new_reply=_rate(valid, "new_reply"), cut=_rate(valid, "cut"), passed=_rate(valid, "passed"))
    out["targets"] = TARGETS[category]
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f} %"


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f} ms"


def print_tables(summary: dict, out=None) -> None:
    p = lambda *a: print(*a, file=out or sys.stdout)  # noqa: E731
    for cat, f in summary.items():
        p(f"\n{cat}: {f['items']} items, {f['valid']} valid")
        if cat == "pause":
            rows = [("take-over in the pause (TOR)", _pct(f["tor"]), TARGETS[cat]["tor"]),
                    ("server ended a turn in the pause", _pct(f["split"]), ""),
                    ("answered after the whole utterance", _pct(f["replied_after"]), ""),
                    ("response latency p50", _s(f["latency_p50_s"]), "")]
        elif cat == "turn_taking":
            rows = [("take-over (TOR)", _pct(f["tor"]), TARGETS[cat]["tor"]),
                    ("response latency p50 / p90", f"{_s(f['latency_p50_s'])} / {_s(f['latency_p90_s'])}", ""),
                    ("response latency mean (FD-Bench's)", _s(f["latency_mean_s"]), "")]
        elif cat == "interruption":
            rows = [("stop latency p50 / p90", f"{_s(f['stop_p50_s'])} / {_s(f['stop_p90_s'])}", ""),
                    ("stopped within 250 ms", _pct(f["stop_250ms"]), TARGETS[cat]["stop_250ms"]),
                    ("answered (key word in the next reply)", _pct(f["answered"]), TARGETS[cat]["answered"]),
                    ("take-over by the answer (TOR)", _pct(f["tor"]), ""),
                    ("response latency p50 (question end -> answer heard)", _s(f["response_p50_s"]), "")]
        else:
            rows = [("goes on with the same reply", _pct(f["goes_on"]), ""),
                    ("paused (clear) at the overlap", _pct(f["paused"]), ""),
                    ("silence > 0.5 s after the onset", _pct(f["silence_over_05"]), ""),
                    ("longest silence p50 / max",
                     f"{_s(f['longest_silence_p50_s'])} / {_s(f['longest_silence_max_s'])}", ""),
                    ("  of it, from a clear to its voice again, p50 / max",
                     f"{_s(f['paused_for_p50_s'])} / {_s(f['paused_for_max_s'])}", ""),
                    ("  its voice's longest hole before the onset, p50", _s(f["silence_before_p50_s"]), ""),
                    ("cut (interrupted)", _pct(f["cut"]), ""),
                    ("new reply (it answered the overlap)", _pct(f["new_reply"]), "0 %"),
                    ("passed: goes on, no silence > 0.5 s, no new reply", _pct(f["passed"]), TARGETS[cat]["pass"])]
        p(f"  {'figure':<52} {'measured':>17}  target")
        for name, value, target in rows:
            p(f"  {name:<52} {value:>17}  {target}")
        for why in f["invalid"]:
            p(f"  invalid: {why}")


def item_line(r: dict) -> str:
    if not r.get("valid"):
        return f"  {r['name']:<18} invalid: {r['reason']}"
    cat = r["category"]
    if cat == "pause":
        return (f"  {r['name']:<18} TOR {int(r['tor'])}  split {int(r['split'])}  latency {_s(r['latency_s'])}"
                f"  heard {r['finals']}")
    if cat == "turn_taking":
        return f"  {r['name']:<18} take-over {int(r['take_over'])}  latency {_s(r['latency_s'])}  heard {r['finals']}"
    if cat == "interruption":
        return (f"  {r['name']:<18} stop {_s(r['stop_latency_s'])}  answered {int(r['answered'])}"
                f"  ({r['answer'][:50]!r})  outcome {r['outcome']}")
    return (f"  {r['name']:<18} {r['outcome']:<9} silence {_s(r['longest_silence_s'])}"
            f" (from a clear {_s(r['paused_for_s'])}; before the onset {_s(r['longest_silence_before_s'])})"
            f"  paused {int(r['paused'])}  heard "
            f"{[t for _, t in r['finals'][1:]]}")


# ---- the server ----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def checkout() -> dict | None:
    """The commit of the code the bench's server runs, and the files changed since (the server
    runs the working tree), for the figures' record; None outside a git checkout."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                 capture_output=True, text=True, timeout=10, check=True).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": head, "changed": [line[3:] for line in changed if line.strip()]}


def server_command(port: int, server_args: Sequence[str]) -> list[str]:
    """`duplex serve` on loopback with the bench's prompt; `server_args` after it (they win)."""
    return [sys.executable, "-m", "agent.serving.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
            "--insecure-no-auth", "--load-threshold", "0", "--drain-timeout", "2", *SERVER_ARGS, *server_args]


def wait_ready(port: int, proc: subprocess.Popen, timeout_s: float = 300.0) -> None:
    """Until the server's /readyz answers 200; raises if it exits or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"duplex serve exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2.0) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"duplex serve was not ready within {timeout_s:.0f} s")


def stop_server(proc: subprocess.Popen, wait_s: float = 15.0) -> None:
    """SIGTERM (it drains), a bounded wait, then SIGKILL."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5.0)


# ---- command line --------------------------------------------------------------------------------
def parse_args(argv: list[str]) -> argparse.Namespace:
    from agent.serving.cli import positive_int

    p = argparse.ArgumentParser(prog="duplex bench overlap", description=__doc__.split("\n")[0])
    p.add_argument("--url", default=None,
                   help="a server already running (ws://HOST:PORT/ws); default: start duplex serve on a free "
                        "loopback port and stop it at the end")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="one more argument for the duplex serve it starts, e.g. --server-arg=--endpointing=rules "
                        "(repeatable; after the bench's own, so they win)")
    p.add_argument("--items", type=positive_int, default=10, help="items per category (default 10)")
    p.add_argument("--categories", default=",".join(CATEGORIES),
                   help=f"comma-separated, of {', '.join(CATEGORIES)} (default all)")
    p.add_argument("--seed", type=int, default=0, help="the audio's voices, levels, noise and timings (default 0)")
    p.add_argument("--json", dest="json_out", type=Path, default=None, help="write all figures and rows here")
    p.add_argument("--server-log", type=Path, default=None, help="keep the server's output in this file")
    p.add_argument("--print-server-args", action="store_true",
                   help="print the arguments the bench gives duplex serve (for a server of your own) and exit")
    args = p.parse_args(argv)
    cats = [c.strip() for c in args.categories.split(",") if c.strip()]
    if not cats or any(c not in CATEGORIES for c in cats):
        p.error(f"--categories: choose from {', '.join(CATEGORIES)}")
    args.categories = [c for c in CATEGORIES if c in cats]
    if args.url is not None and args.server_arg:
        p.error("--server-arg is for the server the bench starts, not one given with --url")
    return args


async def run_items(url: str, items: list[Item], progress=None, warm_up: Item | None = None) -> list[dict]:
    """The items one after another, each its own conversation; first `warm_up`, not measured: a
    fresh server reads its instructions and makes its first audio in the first conversation."""
    if warm_up is not None:
        await run_item(url, warm_up)
    rows = []
    for item in items:
        rows.append(await run_item(url, item))
        if progress is not None:
            progress(rows[-1])
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.print_server_args:
        import shlex

        print(shlex.join(["duplex", "serve", "--load-threshold", "0", *SERVER_ARGS]))
        return 0
    if shutil.which("flite") is None:
        raise SystemExit("duplex bench overlap: flite is not installed (apt-get install flite)")
    t0 = time.monotonic()
    proc = log = None
    url = args.url
    with tempfile.TemporaryDirectory(prefix="bench-overlap-") as work:
        try:
            if url is None:
                port = free_port()
                log_path = args.server_log or Path(work) / "serve.log"
                log = open(log_path, "w")
                proc = subprocess.Popen(server_command(port, args.server_arg), stdout=log, stderr=subprocess.STDOUT,
                                        env=dict(os.environ, PYTHONUNBUFFERED="1"))
                url = f"ws://127.0.0.1:{port}/ws"
            voices = Voices(Path(work))
            items = build_items(args.categories, args.items, args.seed, voices)  # while the server loads
            warm = make_item("turn_taking", len(QUESTIONS) - 1, args.seed, voices)
            print(f"duplex bench overlap: {len(items)} items ({args.items} per category: "
                  f"{', '.join(args.categories)}), seed {args.seed}, against {url}", flush=True)
            if proc is not None:
                try:
                    wait_ready(port, proc)
                except RuntimeError as e:
                    log.flush()
                    print(Path(log.name).read_text()[-3000:], file=sys.stderr)
                    raise SystemExit(f"duplex bench overlap: {e}") from None
                print(f"server ready after {time.monotonic() - t0:.0f} s: {' '.join(args.server_arg) or 'defaults'}",
                      flush=True)
            rows = asyncio.run(run_items(url, items, progress=lambda r: print(item_line(r), flush=True),
                                         warm_up=warm))
            if log is not None and any(r.get("error") for r in rows):
                log.flush()  # what the server made of the conversations that failed
                print("the server's log, its end:\n" + Path(log.name).read_text()[-6000:], file=sys.stderr)
        finally:
            if proc is not None:
                stop_server(proc)
            if log is not None:
                log.close()
    summary = {cat: summarize(cat, [r for r in rows if r["category"] == cat]) for cat in args.categories}
    wall = time.monotonic() - t0
    print_tables(summary)
    print(f"\n{len(rows)} items in {wall:.0f} s")
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        report = {"config": {"url": args.url, "server_args": list(SERVER_ARGS) + args.server_arg,
                             "items": args.items, "categories": args.categories, "seed": args.seed,
                             "cpus": os.cpu_count(), "wall_s": round(wall, 1),
                             "checkout": checkout() if args.url is None else None},
                  "categories": summary, "items": rows}
        args.json_out.write_text(json.dumps(report, indent=2))
        print(f"figures written to {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
