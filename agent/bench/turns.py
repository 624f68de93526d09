"""`duplex bench turns`: a labelled end-of-turn benchmark, offline and reproducible.

Utterances (16 kHz, 0.5 s of silence before, 2.5 s after):
- complete: whole sentences (questions, requests, statements) in five voices (flite slt, kal,
  awb, rms; Piper joe) and the real dev clips (`../shared/speech/dev`, transcripts.tsv);
- incomplete: the same sentences cut at a natural mid-sentence point ("What should I cook for |
  dinner tonight?") with 0.3-1.0 s of silence put there, two ways: "joined", the two halves
  synthesized apart (each then ends with a sentence's falling prosody), and "cut", the sentence
  synthesized once and cut between the two words (Whisper's word times, moved to the quietest
  20 ms nearby, 10 ms fades): its own mid-sentence prosody, though a trace of the next word's
  onset can be left. A dev clip is cut so at the word boundary nearest its middle.
  Piper runs without generator noise, so every run hears the same audio (flite is deterministic).
The true ends are read from the audio (`speech_end_offset`, as `bench latency`): the end of
speech, and for an incomplete one the pause (end of the first half, start of the second).

For each policy (a `TurnConfig`) every utterance is replayed, frame by frame, through the
listener's own machine (`agent.conversation.listening.ListenMachine`, which holds the real
`TurnMachine` and every listener decision: when smart-turn, the early decode and the text turn
model are asked, which silence each answer belongs to, at most `max_speculations_per_turn`
early decodes a turn, one smart-turn check at a time, one text check per silence and text). The
bench is only its shell (`_Replay`, as agent/conversation/listener.py is the live one):
- real: Silero VAD probabilities and frame levels (32 ms frames, aligned with the stream);
  smart-turn on the audio the listener gives it (the last 8 s up to the last whole VAD frame
  heard, padded by `as_of_pause`); Whisper tiny.en on the utterance from `preroll_s` before its
  start to the early decode's end (`final_pad_s` after the end of speech); the text turn model
  (`TextTurnScorer`), for the policies that use it.
- simulated: the clock. Audio is not played in real time; each model call is placed on the
  stream clock at a fixed cost (`--eou-ms`, `--asr-ms`, `--text-ms`, one worker, calls in
  order), and its answer reaches the machine when it is done (the stream clock moved to that
  time; the frames go on meanwhile). The cost each call measures where the bench runs is
  printed beside them. Not simulated: the recognizer's partials (they feed only barge-in and
  the text model's read-ahead), the session's speculation (LLM, TTS) and any load they put on
  the CPU, transport chunking and resampling.
Measured: latency = the time the turn ended minus the true end of speech (complete utterances,
p50/p90); false cut-off = an incomplete utterance whose turn ended before its second half began
(+ `min_speech_s`, the speech the machine needs to hear it); a complete one whose turn ended
before its end is counted as `early`.
"""
from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from agent.bench.latency import _dev_clip, _pct, default_dev_dir, speech_end_offset
from agent.bench.quality import speak
from agent.conversation.endpointing import CombinedPolicy, RulesPolicy, SmartTurnPolicy
from agent.conversation.eou import as_of_pause
from agent.conversation.listening import (
    AwaitAudioCheck,
    AwaitTextTurn,
    BeginUtterance,
    CheckAudioTurn,
    CheckTextTurn,
    DecodeEarly,
    EndTurn,
    ListenerConfig,
    ListenMachine,
    QueueEarlyDecode,
)
from agent.conversation.turns import TurnConfig
from asr.base import SPEECH_RATE
from asr.vad import FRAME

RATE = SPEECH_RATE  # what the VAD and the end-of-turn model hear
FRAME_S = FRAME / RATE
LEAD_S = 0.5
TAIL_S = 2.5
PAUSES_S = (0.3, 0.45, 0.6, 0.8, 1.0)
FLITE_VOICES = ("slt", "kal", "awb", "rms")

# (first half, second half): the cut is where people pause mid-sentence (before the object,
# after a preposition, before the time or the place)
SENTENCES = [
    ("What should I cook for", "dinner tonight?"),
    ("How many legs does", "a spider have?"),
    ("Can you explain how", "a rainbow forms?"),
    ("What is the capital of", "France?"),
    ("Tell me a short story about", "a cat."),
    ("What are some tips for", "sleeping better?"),
    ("I'd like to book a table for", "four people tonight."),
    ("My flight leaves at", "seven in the morning."),
    ("I need to change my", "delivery address."),
    ("Could you remind me to", "call my mother tomorrow."),
    ("The weather today is", "cold and rainy."),
    ("Set a timer for", "ten minutes."),
    ("Turn off the lights in", "the kitchen."),
    ("I was wondering if", "you could help me with my homework."),
]


@dataclass
class Utterance:
    name: str
    voice: str
    text: str
    complete: bool
    pcm: np.ndarray  # float32 16 kHz
    speech_end_s: float  # the true end of speech
    pause: tuple[float, float] | None = None  # incomplete: (end of the first half, start of the second)
    probs: list[float] | None = None  # Silero's, per frame (filled by `score_vad`)
    levels: list[float] | None = None


@dataclass
class Costs:
    eou_s: float = 0.025
    asr_s: float = 0.10
    text_s: float = 0.04


@dataclass
class Policy:
    name: str
    config: TurnConfig
    sweep: str = "eou_threshold"  # the policy's field its trade-off curve varies
    sweep_values: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)

    def with_value(self, value: float) -> Policy:
        """This policy with its swept field set to `value`."""
        return replace(self, config=replace(self.config, endpointing=replace(self.config.endpointing,
                                                                             **{self.sweep: value})))


@dataclass
class Outcome:
    name: str
    complete: bool
    end_s: float | None  # stream time the turn ended (None: never within the tail)
    latency_ms: float | None  # end - true end of speech
    cut_off: bool  # ended before the utterance's true end (inside the pause if incomplete)
    features: list = field(default_factory=list)  # (t, kind, value): the models' answers as they reached the machine


# ---- audio ---------------------------------------------------------------------------------
def _silence(s: float) -> np.ndarray:
    return np.zeros(round(s * RATE), dtype=np.float32)


def speech_start_offset(pcm: np.ndarray, rate: int = RATE) -> float | None:
    """Seconds from the start of `pcm` to its first sample above the end threshold (mirror of
    `speech_end_offset`)."""
    end = speech_end_offset(pcm[::-1].copy(), rate)
    return None if end is None else pcm.size / rate - end


def trim(pcm: np.ndarray) -> np.ndarray:
    """The speech of a synthesized phrase, with 20 ms either side of its loud part."""
    start, end = speech_start_offset(pcm), speech_end_offset(pcm, RATE)
    if start is None or end is None:
        return pcm
    a, b = max(0, int((start - 0.02) * RATE)), min(pcm.size, int((end + 0.02) * RATE))
    return pcm[a:b]


def make_complete(name: str, voice: str, text: str, speech: np.ndarray) -> Utterance:
    pcm = np.concatenate([_silence(LEAD_S), trim(speech), _silence(TAIL_S)]).astype(np.float32)
    return Utterance(name, voice, text, True, pcm, speech_end_offset(pcm, RATE))


def make_incomplete(name: str, voice: str, text: str, first: np.ndarray, rest: np.ndarray, pause_s: float,
                    trim_halves: bool = True) -> Utterance:
    """`first`, `pause_s` of silence, `rest`: the labels are read back from the joined audio."""
    a, b = (trim(first), trim(rest)) if trim_halves else (first, rest)
    head = np.concatenate([_silence(LEAD_S), a]).astype(np.float32)
    pause_start = speech_end_offset(head, RATE)
    pcm = np.concatenate([head, _silence(pause_s), b, _silence(TAIL_S)]).astype(np.float32)
    tail_start = speech_start_offset(pcm[head.size:])
    return Utterance(name, voice, text, False, pcm, speech_end_offset(pcm, RATE),
                     (pause_start, head.size / RATE + tail_start))


class Voices:
    """flite voices and Piper (joe), each phrase synthesized once."""

    def __init__(self, work: Path):
        self.work = work
        self._piper = None
        self._n = 0

    def say(self, voice: str, text: str) -> np.ndarray:
        if voice == "piper":
            from transport.audio import resample

            if self._piper is None:
                from tts.piper_voice import PiperSynthesizer

                self._piper = PiperSynthesizer(threads=1)
            # no generator noise: the same audio on every run (Piper draws it at random)
            from piper import SynthesisConfig

            cfg = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
            with self._piper._lock:
                parts = [c.audio_int16_array for c in self._piper._voice.synthesize(text, cfg)]
            pcm = np.concatenate(parts).astype(np.float32) / 32768.0
            return resample(pcm, self._piper.sample_rate, RATE).astype(np.float32)
        self._n += 1
        path = self.work / f"say{self._n}.wav"
        return speak(text, voice, path)


def build_corpus(work: Path, dev_dir: Path | None, voices: tuple[str, ...], sentences=SENTENCES,
                 dev_clips: int | None = None, whisper=None) -> list[Utterance]:
    """Complete and incomplete utterances: every sentence in every voice, then the dev clips
    (cut by `whisper`'s word times for the incomplete copies; none without it)."""
    if any(v != "piper" for v in voices) and shutil.which("flite") is None:
        raise RuntimeError("flite is not installed (apt-get install flite)")
    v = Voices(work)
    out: list[Utterance] = []
    k = 0
    for voice in voices:
        for i, (first, rest) in enumerate(sentences):
            text = f"{first} {rest}"
            out.append(make_complete(f"{voice}:s{i}", voice, text, v.say(voice, text)))
            pause = PAUSES_S[k % len(PAUSES_S)]
            k += 1
            # the halves synthesized apart: each ends with a sentence's falling prosody
            out.append(make_incomplete(f"{voice}:s{i}/joined{pause:.2f}", voice, f"{first} ... {rest}",
                                       v.say(voice, first), v.say(voice, rest), pause))
            whole = trim(v.say(voice, text))
            cut = _word_cut(whisper, whole, len(first.split())) if whisper is not None else None
            if cut is not None:  # the sentence spoken once, cut between the words: its own prosody
                out.append(make_incomplete(f"{voice}:s{i}/cut{pause:.2f}", voice, f"{first} ... {rest}",
                                           fade(whole[:cut[0]], tail_s=0.01), fade(whole[cut[0]:], head_s=0.01), pause,
                                           trim_halves=False))
    if dev_dir is not None and (dev_dir / "transcripts.tsv").exists():
        rows = [line.split("\t", 1) for line in (dev_dir / "transcripts.tsv").read_text().splitlines() if "\t" in line]
        for name, text in rows[:dev_clips]:
            speech = _dev_clip(dev_dir / name)
            out.append(make_complete(f"dev:{name}", "dev", text.strip(), speech))
            if whisper is None:
                continue
            cut = _word_cut(whisper, speech)
            if cut is None:
                continue
            pause = PAUSES_S[k % len(PAUSES_S)]
            k += 1
            words = text.split()
            out.append(make_incomplete(f"dev:{name}/cut{pause:.2f}", "dev", f"{' '.join(words[:cut[1]])} ... "
                                       f"{' '.join(words[cut[1]:])}", fade(speech[:cut[0]], tail_s=0.01),
                                       fade(speech[cut[0]:], head_s=0.01), pause,
                                       trim_halves=False))
    return out


def _word_cut(whisper, speech: np.ndarray, j: int | None = None) -> tuple[int, int] | None:
    """(sample, words before it): the boundary before word `j` (default: the word boundary
    nearest the middle of the clip), by Whisper's word times, moved to the quietest 10 ms within
    60 ms of the midpoint between the two words."""
    _, words = whisper.transcribe(speech, word_timestamps=True)
    if len(words) < 3 or (j is not None and not 0 < j < len(words)):
        return None
    if j is None:
        mid = speech.size / RATE / 2
        j = min(range(1, len(words)), key=lambda i: abs(words[i].start - mid))
    centre = int((words[j - 1].end + words[j].start) / 2 * RATE)
    hop = RATE // 100
    best, cut = None, centre
    # Whisper's boundaries are coarse and often late (the next word's onset before them, which
    # Whisper then completes: "the weather today is | cold" heard as "... is going"): look from
    # 100 ms before to 30 ms after, for the quietest 20 ms
    for c in range(max(hop, centre - 10 * hop), min(speech.size - hop, centre + 3 * hop) + 1, hop // 2):
        e = float(np.mean(speech[c - hop:c + hop] ** 2))
        if best is None or e < best:
            best, cut = e, c
    return cut, j


def fade(pcm: np.ndarray, head_s: float = 0.0, tail_s: float = 0.0) -> np.ndarray:
    """Linear fades at either end (a cut between words clicks without them)."""
    x = pcm.astype(np.float32).copy()
    for n, sl in ((int(head_s * RATE), slice(None)), (int(tail_s * RATE), slice(None, None, -1))):
        if 0 < n <= x.size:
            x[sl][:n] *= np.linspace(0.0, 1.0, n, dtype=np.float32)
    return x


def score_vad(utts: list[Utterance], vad_factory) -> None:
    """Silero's probability and the RMS level of each 32 ms frame (a fresh stream each)."""
    for u in utts:
        u.probs = list(vad_factory()(u.pcm))
        n = len(u.probs)
        x = u.pcm[:n * FRAME].reshape(n, FRAME).astype(np.float64)
        u.levels = np.sqrt(np.mean(x * x, axis=1)).tolist()


# ---- the replay ---------------------------------------------------------------------------------
class CachedModels:
    """The models, each answer kept (by utterance and audio) so every policy and every threshold
    sees the same verdicts; the measured time of each real call is kept too."""

    def __init__(self, eou, asr, text=None):
        self.eou, self.asr, self.text = eou, asr, text
        self._cache: dict = {}
        self.call_ms: dict[str, list[float]] = {"eou": [], "asr": [], "text": []}

    def _get(self, kind: str, key, fn, *args):
        if (kind, key) not in self._cache:
            t = time.perf_counter()
            self._cache[(kind, key)] = fn(*args)
            self.call_ms[kind].append((time.perf_counter() - t) * 1000)
        return self._cache[(kind, key)]

    def eou_p(self, utt: str, key, audio) -> float:
        return self._get("eou", (utt, key), self.eou, audio)

    def transcript(self, utt: str, key, audio) -> str:
        return self._get("asr", (utt, key), self.asr, audio)

    def text_p(self, text: str) -> float:
        return self._get("text", text, self.text, text)


class _Wait:
    """What a parked task waits for: the end of an early decode or of a smart-turn check."""

    def __init__(self, done: bool = False):
        self.done = done
        self.waiters: list = []


class _Replay:
    """The listener's shell on the simulated stream clock: it carries out `ListenMachine`'s
    commands as agent/conversation/listener.py does, with tasks that are generators here. A task
    parks by yielding the stream time its work is done (a model call on the one worker, at its
    cost) or a `_Wait`; it is resumed then, and what the call answered goes back to the machine."""

    def __init__(self, u: Utterance, models: CachedModels, costs: Costs, listener: ListenerConfig):
        self.u, self.models, self.costs = u, models, costs
        self.m = ListenMachine(listener, audio_model=models.eou is not None, text_model=models.text is not None)
        self.due: list = []  # heap of (stream time, seq, task): parked tasks and tasks spawned
        self.seq = 0
        self.busy_until = 0.0  # the one worker the model calls queue on, in order
        self.frames = 0  # VAD frames heard
        self.t_start = 0.0  # where the utterance's decode starts (its preroll included)
        self.early = _Wait(done=True)  # the last early decode queued
        self.audio = _Wait(done=True)  # the last smart-turn check
        self.text_due = 0.0  # when the last text turn check is done
        self.end_s: float | None = None
        self.features: list = []

    def run(self) -> float | None:
        """The stream time the turn ended (None: not within the utterance)."""
        m = self.m
        for i, (p, level) in enumerate(zip(self.u.probs, self.u.levels)):
            t = round((i + 1) * FRAME_S, 6)
            while self.due and self.due[0][0] <= t and self.end_s is None:
                at, _, task = heapq.heappop(self.due)
                self._clock(at)
                self._step(task)
            if self.end_s is not None:
                break
            self._clock(t)
            self.frames += 1
            self._step(self._carry(m.on_vad([p], [level], FRAME_S, FRAME_S)))
            if self.end_s is not None:
                break
        return self.end_s

    # ---- tasks ----------------------------------------------------------------------------------
    def _clock(self, t: float) -> None:
        if t > self.m.t_audio:
            self.m.on_audio(t - self.m.t_audio)

    def _at(self, t: float, task) -> None:
        self.seq += 1
        heapq.heappush(self.due, (t, self.seq, task))

    def _spawn(self, task) -> None:
        self._at(self.m.t_audio, task)  # it runs once the current one waits, as asyncio's would

    def _step(self, task) -> None:
        while True:
            try:
                wait = next(task)
            except StopIteration:
                return
            if isinstance(wait, _Wait):
                if not wait.done:
                    wait.waiters.append(task)
                    return
            elif wait > self.m.t_audio:
                self._at(wait, task)
                return

    def _finish(self, wait: _Wait) -> None:
        wait.done = True
        for task in wait.waiters:
            self._spawn(task)
        wait.waiters = []

    def _work(self, cost: float) -> float:
        """A model call queued on the worker now: when it is done."""
        self.busy_until = max(self.m.t_audio, self.busy_until) + cost
        return self.busy_until

    # ---- the machine's commands -------------------------------------------------------------------
    def _carry(self, commands):
        for c in commands:
            yield from self._do(c)

    def _do(self, c):
        m, u = self.m, self.u
        if isinstance(c, EndTurn):
            if self.end_s is None:
                self.end_s = m.t_audio
        elif isinstance(c, BeginUtterance):
            self.t_start = c.t_start
        elif isinstance(c, QueueEarlyDecode):
            previous, self.early = self.early, _Wait()
            self._spawn(self._early_decode(c, previous, self.early))
        elif isinstance(c, DecodeEarly):
            a, b = int(self.t_start * RATE), int(c.until * RATE)
            text = self.models.transcript(u.name, (a, b), u.pcm[a:b])
            yield self._work(self.costs.asr_s)
            if not m.policy.uses_text_model:
                self.features.append((round(m.t_audio, 3), "text", text))
            yield from self._carry(m.on_early_transcript(c.t_speech_end, text))
        elif isinstance(c, CheckAudioTurn):
            # up to the last whole VAD frame heard, as it will be at the pause
            end = self.frames * FRAME
            audio = as_of_pause(u.pcm[max(0, end - 8 * RATE):end], c.heard_silence_s, c.pause_s)
            p = self.models.eou_p(u.name, (self.frames - 1, round(c.heard_silence_s, 4)), audio)
            self.audio = _Wait()
            self._spawn(self._audio_check(c.t_speech_end, p, self._work(self.costs.eou_s), self.audio))
        elif isinstance(c, AwaitAudioCheck):
            yield self.audio
        elif isinstance(c, CheckTextTurn):
            p = self.models.text_p(c.text)
            self.text_due = due = self._work(self.costs.text_s)
            yield due
            self.features.append((round(due, 3), "text_p", (c.text, round(float(np.log10(max(p, 1e-12))), 2))))
            yield from self._carry(m.on_text_verdict(c.t_speech_end, c.text, p))
        elif isinstance(c, AwaitTextTurn):  # the check started for this silence and text
            yield self.text_due
            yield from self._carry(m.on_text_verdict(c.t_speech_end, c.text, self.models.text_p(c.text)))
        # the rest tells the session or the recognizer, or marks the trace: nothing to time here

    def _early_decode(self, c: QueueEarlyDecode, previous: _Wait, done: _Wait):
        yield previous
        yield from self._carry(self.m.on_early_turn(c.t_speech_end, c.until))
        self._finish(done)

    def _audio_check(self, t_speech_end: float, p: float, due: float, done: _Wait):
        yield due
        self.features.append((round(self.m.t_audio, 3), "audio_p", round(p, 3)))
        yield from self._carry(self.m.on_audio_verdict(p, t_speech_end))
        self.m.on_audio_check_ended()
        self._finish(done)


def replay(u: Utterance, policy: Policy, models: CachedModels, costs: Costs, **listener) -> Outcome:
    """One utterance through the listener's machine (see the module doc); `listener`: fields of
    `ListenerConfig` other than `turns` (the listener's defaults otherwise)."""
    cfg = policy.config
    r = _Replay(u, models, costs, ListenerConfig(cfg, **listener))
    end_s = r.run()
    if end_s is None:
        return Outcome(u.name, u.complete, None, None, False, r.features)
    if u.complete:
        cut = end_s < u.speech_end_s
    else:
        cut = end_s < u.pause[1] + cfg.min_speech_s
    return Outcome(u.name, u.complete, end_s, round((end_s - u.speech_end_s) * 1000, 1), cut, r.features)


def summarize(outcomes: list[Outcome]) -> dict:
    comp = [o for o in outcomes if o.complete]
    inc = [o for o in outcomes if not o.complete]
    lat = [o.latency_ms for o in comp if o.latency_ms is not None and not o.cut_off]
    cuts = sum(o.cut_off for o in inc)
    joined = [o for o in inc if "/joined" in o.name]
    cut = [o for o in inc if "/cut" in o.name]
    return {"cut_offs_joined": f"{sum(o.cut_off for o in joined)}/{len(joined)}",
            "cut_offs_cut": f"{sum(o.cut_off for o in cut)}/{len(cut)}","complete": len(comp), "p50_ms": _pct(lat, 50), "p90_ms": _pct(lat, 90),
            "mean_ms": round(float(np.mean(lat)), 1) if lat else None,
            "early": sum(o.cut_off for o in comp), "never": sum(o.end_s is None for o in comp),
            "incomplete": len(inc), "cut_offs": cuts,
            "cut_off_rate": round(cuts / len(inc), 3) if inc else None}


def run_policy(utts: list[Utterance], policy: Policy, models: CachedModels, costs: Costs) -> list[Outcome]:
    return [replay(u, policy, models, costs) for u in utts]


def policies(text_model: bool = True) -> list[Policy]:
    """The baselines and the new policy, at their defaults (agent/conversation/turns.py, agent/conversation/endpointing.py)."""
    out = [Policy("rules (before)", TurnConfig(endpointing=RulesPolicy())),
           Policy("smart-turn alone", TurnConfig(endpointing=SmartTurnPolicy()))]
    if text_model:
        out.append(Policy("combined (default)", TurnConfig(endpointing=CombinedPolicy()), sweep="threshold"))
    return out


def extra_curves(text_model: bool = True) -> list[Policy]:
    """The new policy's second knob: the shift of the text score (how unlikely the chat model
    may find the end of the message and still call it done)."""
    if not text_model:
        return []
    return [Policy("combined (default)", TurnConfig(endpointing=CombinedPolicy()), sweep="text_bias",
                   sweep_values=(10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 17.0, 18.0))]


# ---- report ---------------------------------------------------------------------------------
def _f(v, w=6) -> str:
    return f"{v:>{w}.0f}" if isinstance(v, (int, float)) else f"{'-':>{w}}"


def print_summary(name: str, s: dict, out=None) -> None:
    print(f"{name:<22} {s['complete']:>4} {_f(s['p50_ms'])} {_f(s['p90_ms'])} {_f(s['mean_ms'])} "
          f"{s['early']:>5} {s['never']:>5}   {s['incomplete']:>4} {s['cut_offs']:>5} "
          f"{100 * s['cut_off_rate'] if s['cut_off_rate'] is not None else 0:>6.1f}%  {s['cut_offs_joined']:>7} {s['cut_offs_cut']:>7}", file=out or sys.stdout)


HEADER = (f"{'policy':<22} {'compl':>4} {'p50':>6} {'p90':>6} {'mean':>6} {'early':>5} {'never':>5}   "
          f"{'inc':>4} {'cuts':>5} {'cut %':>7}  {'joined':>7} {'cut':>7}")


def parse_args(argv):
    p = argparse.ArgumentParser(prog="duplex bench turns", description=__doc__.split("\n")[0])
    p.add_argument("--voices", default="slt,kal,awb,rms,piper", help="flite voices and/or piper")
    p.add_argument("--sentences", type=int, default=None, help="use the first N sentences")
    p.add_argument("--dev-dir", type=Path, default=None)
    p.add_argument("--no-dev", action="store_true", help="leave the dev clips out")
    p.add_argument("--asr", default="whisper-tiny.en")
    p.add_argument("--text-model", default="smollm2-135m", help="GGUF for the text turn model; 'none': skip it")
    p.add_argument("--eou-ms", type=float, default=25.0)
    p.add_argument("--asr-ms", type=float, default=100.0)
    p.add_argument("--text-ms", type=float, default=40.0)
    p.add_argument("--no-curve", action="store_true")
    p.add_argument("--json", dest="json_out", type=Path, default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from agent.conversation.models import configure_openmp

    configure_openmp()  # before the model libraries load
    from agent.conversation.eou import SmartTurn, TextTurnScorer
    from asr.vad import SileroVAD
    from asr.whisper import WhisperRecognizer

    t = time.perf_counter()
    whisper = WhisperRecognizer.load(args.asr)
    eou = SmartTurn(threads=1)
    vad = SileroVAD()
    text = None if args.text_model == "none" else TextTurnScorer.load(args.text_model)
    load_s = time.perf_counter() - t
    voices = tuple(v.strip() for v in args.voices.split(",") if v.strip())
    sentences = SENTENCES[:args.sentences] if args.sentences else SENTENCES
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-turns-")))
        dev = None if args.no_dev else (args.dev_dir or default_dev_dir())
        t = time.perf_counter()
        utts = build_corpus(work, dev, voices, sentences, whisper=whisper)
        score_vad(utts, vad.new_stream)
        build_s = time.perf_counter() - t
    models = CachedModels(eou.probability, lambda a: whisper.transcribe(a, word_timestamps=True)[0],
                          text.probability if text else None)
    costs = Costs(args.eou_ms / 1000, args.asr_ms / 1000, args.text_ms / 1000)
    n_c = sum(u.complete for u in utts)
    print(f"duplex bench turns: {n_c} complete + {len(utts) - n_c} incomplete utterances "
          f"(voices {', '.join(voices)}{', dev clips' if dev else ''}; pauses {', '.join(map(str, PAUSES_S))} s); "
          f"asr={args.asr}, eou=smart-turn-v3.2, text={args.text_model}; models {load_s:.1f} s, audio {build_s:.1f} s; "
          f"{os.cpu_count()} CPUs")
    print(f"simulated costs on the stream clock: smart-turn {args.eou_ms:.0f} ms, decode {args.asr_ms:.0f} ms, "
          f"text model {args.text_ms:.0f} ms (measured below)")
    print("latency = end of turn - true end of speech, complete utterances (ms); cuts = incomplete ones "
          "whose turn ended in the pause; early = complete ones ended before their end; never = no end in 2.5 s")
    report: dict = {"policies": {}, "curves": {}}
    pols = policies(text is not None)
    print("\n" + HEADER)
    results = {}
    for pol in pols:
        outs = run_policy(utts, pol, models, costs)
        results[pol.name] = outs
        s = summarize(outs)
        report["policies"][pol.name] = {"summary": s, "outcomes": [o.__dict__ for o in outs]}
        print_summary(pol.name, s)
    by_voice = sorted({u.voice for u in utts})
    print("\nper voice (p50/p90 ms on complete; cut-offs / incomplete):")
    for pol in pols:
        cells = []
        for v in by_voice:
            names = {u.name for u in utts if u.voice == v}
            s = summarize([o for o in results[pol.name] if o.name in names])
            cells.append(f"{v} {_f(s['p50_ms'], 0)}/{_f(s['p90_ms'], 0)} {s['cut_offs']}/{s['incomplete']}")
        print(f"  {pol.name:<20} " + "; ".join(cells))
    if not args.no_curve:
        for pol in pols + extra_curves(text is not None):
            print(f"\ntrade-off, {pol.name}: {pol.sweep}")
            print(HEADER.replace("policy", pol.sweep[:22].ljust(6), 1))
            curve = []
            for v in pol.sweep_values:
                p2 = pol.with_value(v)
                s = summarize(run_policy(utts, p2, models, costs))
                curve.append({pol.sweep: v, **s})
                print_summary(f"{v:g}", s)
            report["curves"][f"{pol.name}: {pol.sweep}"] = curve
    ms = {k: (round(float(np.median(v)), 1), len(v)) for k, v in models.call_ms.items() if v}
    print("\nmeasured model calls on this machine (median ms, calls): "
          + ", ".join(f"{k} {m} ({n})" for k, (m, n) in ms.items()))
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        report["utterances"] = [{"name": u.name, "text": u.text, "complete": u.complete,
                                 "speech_end_s": round(u.speech_end_s, 3), "pause": u.pause} for u in utts]
        args.json_out.write_text(json.dumps(report, indent=1, default=str))
        print(f"figures written to {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
