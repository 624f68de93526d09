"""Turn-taking as a pure state machine: events in, state changes and commands out. No models, no I/O.

States: listening -> user_speaking -> thinking -> bot_speaking -> listening, with barge-in
(bot_speaking or thinking -> user_speaking) when the user talks over the bot for long enough.

Defaults, and why:
- `speech_threshold` 0.5 / `silence_threshold` 0.35: Silero's own hysteresis pair.
- `min_speech_s` 0.1: three 32 ms frames; shorter blips (clicks) are not speech.
- `endpoint_silence_s` 0.5: LiveKit's min_endpointing_delay is 0.5 s; pipecat's VAD stop_secs is
  0.2 s when a turn model follows and 0.8 s without one. 0.5 s ends turns promptly without cutting
  users who pause between clauses.
- `barge_in_min_speech_s` 0.3: like LiveKit's min_interruption_duration (0.5 s) but quicker;
  a cough or a click is shorter than this.
- `max_utterance_s` 25: Whisper decodes at most 30 s at once.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class State(str, Enum):
    LISTENING = "listening"
    USER_SPEAKING = "user_speaking"
    THINKING = "thinking"
    BOT_SPEAKING = "bot_speaking"


@dataclass
class TurnConfig:
    speech_threshold: float = 0.5
    silence_threshold: float = 0.35
    min_speech_s: float = 0.1
    endpoint_silence_s: float = 0.5
    barge_in_min_speech_s: float = 0.3
    max_utterance_s: float = 25.0
    preroll_s: float = 0.3  # audio before the detected speech start that the recognizer gets


# Commands the machine asks the session to carry out.
@dataclass(frozen=True)
class StartUtterance:
    t_start: float  # stream time of the first speech frame


@dataclass(frozen=True)
class EndOfTurn:
    t_speech_end: float  # stream time at which the user stopped speaking


@dataclass(frozen=True)
class BargeIn:
    t: float  # the reply in progress must be cancelled and its audio flushed


Command = StartUtterance | EndOfTurn | BargeIn


class TurnMachine:
    def __init__(self, config: TurnConfig | None = None):
        self.config = config or TurnConfig()
        self.state = State.LISTENING
        self.transitions: list[tuple[float, State, State]] = []
        self._speech_run = 0.0  # seconds of consecutive speech frames
        self._silence_run = 0.0
        self._last_speech_end = 0.0
        self._in_speech = False
        self._utterance_start = 0.0

    def _go(self, t: float, state: State) -> None:
        if state != self.state:
            self.transitions.append((t, self.state, state))
            self.state = state

    def on_vad(self, t: float, prob: float, frame_s: float) -> list[Command]:
        """One VAD frame ending at stream time `t` (seconds) with speech probability `prob`."""
        c = self.config
        if prob >= c.speech_threshold or (self._in_speech and prob > c.silence_threshold):
            self._in_speech = True
            self._speech_run += frame_s
            self._silence_run = 0.0
        else:
            if self._in_speech:
                self._last_speech_end = t - frame_s
            self._in_speech = False
            self._silence_run += frame_s
            self._speech_run = 0.0

        out: list[Command] = []
        if self.state == State.LISTENING:
            if self._speech_run >= c.min_speech_s:
                out.append(self._start_user(t))
        elif self.state == State.USER_SPEAKING:
            too_long = t - self._utterance_start >= c.max_utterance_s
            if (not self._in_speech and self._silence_run >= c.endpoint_silence_s) or too_long:
                end = t if (too_long and self._in_speech) else self._last_speech_end
                self._speech_run = 0.0  # speech that goes on after a forced end must build up anew
                self._go(t, State.THINKING)
                out.append(EndOfTurn(end))
        elif self.state in (State.THINKING, State.BOT_SPEAKING):
            if self._speech_run >= c.barge_in_min_speech_s:
                out.append(BargeIn(t))
                out.append(self._start_user(t))
        return out

    def _start_user(self, t: float) -> StartUtterance:
        self._go(t, State.USER_SPEAKING)
        self._utterance_start = t - self._speech_run  # start of the speech run that opened it
        return StartUtterance(self._utterance_start)

    def on_reply_started(self, t: float) -> None:
        """The first reply audio went out."""
        if self.state == State.THINKING:
            self._go(t, State.BOT_SPEAKING)

    def on_reply_finished(self, t: float) -> None:
        """The reply was fully played, or there was nothing to say (empty transcript)."""
        if self.state in (State.THINKING, State.BOT_SPEAKING):
            self._go(t, State.LISTENING)
