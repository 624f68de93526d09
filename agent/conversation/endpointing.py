"""End-of-turn policies as objects: each owns its parameters and its decisions. What is known
about the current silence goes in, the seconds of silence after which the turn ends come out. No
models, no I/O, no clock.

`TurnMachine` (agent/conversation/turns.py) keeps the features of the current silence and asks its policy's
`required_silence` at each VAD frame and at each new verdict; the turn ends once Silero's
silence reaches the answer. The listener asks the policy which models it wants
(`uses_audio_model`, `uses_text_model`) and when (`audio_first`, `wants_audio_verdict`).
`duplex bench turns` compares them.

Features (`Features`), each None until it is known for this silence:
- `audio_p`: smart-turn's probability that the turn is complete (agent/conversation/eou.py);
- `text_complete`: the transcript at the pause ends a sentence (Whisper punctuates);
- `text_p`: the probability of the chat model's end-of-message token right after the user's
  transcript (`TextTurnScorer` in agent/conversation/eou.py: LiveKit's text turn detector, with the
  embedded GGUF).

A new policy is one class with these members (see docs/extending.md) registered in `POLICIES`
for the command line; `TurnConfig(endpointing=MyPolicy())` uses it from Python.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar, Protocol

AUDIO_P_RANGE = (1e-4, 1 - 1e-4)  # smart-turn's verdicts stay inside this
AUDIO_FRAME_S = 0.032  # a VAD frame: a change in the wait smaller than this changes nothing


@dataclass(frozen=True)
class Features:
    audio_p: float | None = None
    text_complete: bool | None = None
    text_p: float | None = None


class EndOfTurnPolicy(Protocol):
    name: ClassVar[str]
    uses_audio_model: ClassVar[bool]  # smart-turn is asked (an audio turn model)
    uses_text_model: ClassVar[bool]  # a text turn model's probability is asked
    # smart-turn is asked at each silence before the decode, rather than after the text score
    audio_first: ClassVar[bool]

    def required_silence(self, f: Features, pause_s: float) -> float:
        """Seconds of Silero silence after which the turn ends, given what is known of it;
        `pause_s`: the machine's pause, the earliest a verdict at the pause can end a turn."""

    def wants_audio_verdict(self, f: Features) -> bool:
        """Whether smart-turn's verdict, whatever it says, could change this silence's wait."""

    def without_text_model(self) -> EndOfTurnPolicy:
        """The policy to use when no text turn model is there (itself if it needs none)."""


class AudioTurnModel(Protocol):
    def probability(self, audio) -> float:
        """P(the turn is complete) from float32 16 kHz audio of the utterance."""


class TextTurnModel(AudioTurnModel, Protocol):
    def text_probability(self, text: str) -> float:
        """P(the transcript ends the turn)."""


@dataclass(frozen=True)
class SilencePolicy:
    """No turn model: `silence_s` of silence ends every turn (pipecat's VAD `stop_secs`)."""

    name: ClassVar[str] = "silence"
    uses_audio_model: ClassVar[bool] = False
    uses_text_model: ClassVar[bool] = False
    audio_first: ClassVar[bool] = True
    silence_s: float = 0.5

    def required_silence(self, f: Features, pause_s: float) -> float:
        return self.silence_s

    def wants_audio_verdict(self, f: Features) -> bool:
        return False

    def without_text_model(self) -> SilencePolicy:
        return self


@dataclass(frozen=True)
class _SmartTurnAtThePause:
    """smart-turn is asked at every silence, and its "done" ends the turn at the pause."""

    uses_audio_model: ClassVar[bool] = True
    uses_text_model: ClassVar[bool] = False
    audio_first: ClassVar[bool] = True
    eou_threshold: float = 0.5
    max_silence_s: float = 1.5

    def _done(self, f: Features) -> bool:
        return f.audio_p is not None and f.audio_p >= self.eou_threshold

    def wants_audio_verdict(self, f: Features) -> bool:
        return True

    def without_text_model(self) -> EndOfTurnPolicy:
        return self


@dataclass(frozen=True)
class RulesPolicy(_SmartTurnAtThePause):
    """smart-turn >= `eou_threshold` ends the turn at the pause; else a transcript that ends a
    sentence after `sentence_silence_s`; else `max_silence_s`."""

    name: ClassVar[str] = "rules"
    sentence_silence_s: float = 0.5

    def required_silence(self, f: Features, pause_s: float) -> float:
        if self._done(f):
            return pause_s
        return self.sentence_silence_s if f.text_complete else self.max_silence_s


@dataclass(frozen=True)
class SmartTurnPolicy(_SmartTurnAtThePause):
    """smart-turn alone: >= `eou_threshold` at the pause, else `max_silence_s`."""

    name: ClassVar[str] = "smart-turn"

    def required_silence(self, f: Features, pause_s: float) -> float:
        return pause_s if self._done(f) else self.max_silence_s


def _logit(p: float) -> float:
    p = min(max(p, 1e-15), 1 - 1e-15)  # the text model's probabilities go down to 1e-12
    return math.log(p / (1 - p))


@dataclass(frozen=True)
class CombinedPolicy:
    """One probability from both models, and a wait that shrinks as it grows. With
    p = `probability(f)`: p >= `threshold` ends the turn after `min_wait_s` of silence; below
    it the wait grows linearly in (threshold - p) / threshold up to `max_wait_s` at p = 0. With
    no score yet it is `max_wait_s` (a later verdict shortens it). `punctuation_wait_s`: a
    transcript ending a sentence caps the wait at this (None: no cap). `needs_text`: no decision
    before the text score is known (smart-turn alone calls many cut fragments complete: "Can you
    explain how" 0.98 in flite's and Piper's voices). smart-turn is asked after the text score,
    and only when its verdict could still change the wait: the text score decides most turns,
    and the decode it needs starts sooner without smart-turn ahead of it on the cores."""

    name: ClassVar[str] = "combined"
    uses_audio_model: ClassVar[bool] = True
    uses_text_model: ClassVar[bool] = True
    audio_first: ClassVar[bool] = False
    threshold: float = 0.5
    min_wait_s: float = 0.1
    max_wait_s: float = 1.5
    text_weight: float = 3.0  # the text score's weight (logits added)
    text_bias: float = 13.0  # added to the text score's logit
    punctuation_wait_s: float | None = None
    needs_text: bool = True

    def probability(self, f: Features) -> float | None:
        """P(done) from the audio score and the text score: their logits added, the text's
        scaled by `text_weight` and shifted by `text_bias` (the chat model's end-of-message
        probability is calibrated for chat, not for turns: unpunctuated complete requests score
        1e-3-1e-6, cut fragments 1e-9-1e-10). None when neither is known."""
        if f.audio_p is None and f.text_p is None:
            return None
        z = 0.0
        if f.audio_p is not None:
            z += _logit(f.audio_p)
        if f.text_p is not None:
            z += self.text_weight * (_logit(f.text_p) + self.text_bias)
        return 1.0 / (1.0 + math.exp(-z))

    def wait(self, f: Features) -> float:
        """The wait for these features as they are, smart-turn's verdict or not."""
        if self.needs_text and f.text_p is None:
            return self.max_wait_s
        p = self.probability(f)
        wait = self.max_wait_s
        if p is not None:
            wait = (self.min_wait_s if p >= self.threshold
                    else self.min_wait_s + (self.max_wait_s - self.min_wait_s) * (self.threshold - p) / self.threshold)
        if self.punctuation_wait_s is not None and f.text_complete:
            wait = min(wait, self.punctuation_wait_s)
        return wait

    def required_silence(self, f: Features, pause_s: float) -> float:
        if f.audio_p is None and f.text_p is not None and self.wants_audio_verdict(f):
            return self.max_wait_s  # smart-turn is asked now, and its verdict could change the wait
        return self.wait(f)

    def wants_audio_verdict(self, f: Features) -> bool:
        if f.audio_p is not None:
            return False
        waits = [self.wait(replace(f, audio_p=p)) for p in AUDIO_P_RANGE]
        return max(waits) - min(waits) > AUDIO_FRAME_S

    def without_text_model(self) -> RulesPolicy:
        return RulesPolicy(max_silence_s=self.max_wait_s)


# the command line's names; a policy defined elsewhere is passed as an object
POLICIES: dict[str, type] = {p.name: p for p in (CombinedPolicy, RulesPolicy, SmartTurnPolicy, SilencePolicy)}
DEFAULT_POLICY = CombinedPolicy.name  # the fewest cut-offs, and the quickest turn ends (`duplex bench turns`)


def policy_named(name: str, silence_s: float | None = None) -> EndOfTurnPolicy:
    """A policy by its command-line name; `silence_s` sets the silence after a sentence ("rules")
    or after every turn ("silence")."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"end-of-turn policy must be one of {', '.join(POLICIES)}, not {name!r}") from None
    if silence_s is None:
        return cls()
    if cls is RulesPolicy:
        return RulesPolicy(sentence_silence_s=silence_s)
    if cls is SilencePolicy:
        return SilencePolicy(silence_s)
    raise ValueError(f"a silence is set only for the rules and silence policies, not {name!r}")
