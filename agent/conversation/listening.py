"""What the listener decides, as a pure machine: events in, commands out. No models, no I/O, no
tasks, no clock of its own (the stream time comes in with `on_audio`; the events the turn machine
stamps with the wall clock carry it as `now`).

The turn machine (agent/conversation/turns.py) decides who has the floor; `ListenMachine` holds
it and decides what the listener does about each of its commands: when to decode the words so
far and which silence a transcript or a verdict belongs to, when to ask the end-of-turn models and
which first, when to offer a pause's transcript to speculate on, where an utterance starts, which
words to drop, whether a final is a turn to answer, when the text turn model reads ahead. The
listener (agent/conversation/listener.py) is its shell: it carries out the commands with the
recognizer, the models and tasks, and feeds what they answer back as events.

Events: `on_audio` (the stream clock), `on_vad` (a chunk's VAD frames), `on_early_turn` (the
early decodes queued before this one are done), `on_early_transcript`, `on_audio_verdict` and
`on_audio_check_ended` (smart-turn), `on_overlap_look` and `on_overlap_look_ended` (a look at the
words of speech over the bot), `on_text_verdict` (the text turn model), `on_partial` and
`on_words` (a partial and its stable words), `on_final` (the final transcript), and the reply's
progress (`on_bot_initiated`, `on_reply_started`, `on_reply_finished`).

Each event returns its commands as an iterator: the shell carries each one out before it asks
for the next, so a decision sees what the commands before it did (an `Emit`'s handler in the
session may call back, e.g. `reply_finished`; a task may have run while the shell waited).
`QueueEarlyDecode`, `LookAtOverlap`, `CheckAudioTurn` and `EndTurn` start work that answers later, in a task
(`on_early_turn`, `on_audio_verdict`, `on_final`). `DecodeEarly`, `CheckTextTurn` and
`AwaitTextTurn` are waited for, and their answer's commands (`on_early_transcript`,
`on_text_verdict`) carried out, before the iterator goes on; so is `ReadAhead`. `AwaitAudioCheck`
waits until the running smart-turn check has ended.

The rules, and why:
- The first silent frame (`SpeechStopped`) queues an early decode of the words so far, up to
  `final_pad_s` after the end of speech (the final asks the same `until`, so it reuses that
  decode). It waits for the early decodes queued before it, and is skipped when the user spoke
  again meanwhile (their next silence asks anew) or the turn's `max_speculations_per_turn` are
  spent. The text turn model's read-ahead stops first: beside the decode both are slower.
- Speech over the bot is looked at (`LookAtOverlap`, a quick decode of the words so far) while
  the turn machine wants it (`wants_overlap_words`), one look at a time, each on `look_every_s`
  of new audio; and once as it stops, before its early decode, while the bot is paused for it
  (unless the last look heard nothing): a look takes a fraction of the decode's time, and a
  backchannel then goes on sooner. A look's words never cut the reply: its window is short, and
  it hears words in quiet side talk that the decode hears as none.
- Words that cut the reply at a silence (the early decode of speech over the bot) make it a
  turn of the user's own, whose end that silence then judges as any other's (else the
  interruption's question waited the policy's longest wait), unless they are only an
  interruption's lead words ("Hold on.", `only_lead_words`): the text model calls those
  complete, and the user goes on after them. A transcript of lead words alone is never judged
  (not at that silence, nor at its pause: Piper's comma after "Hold on," runs to 0.38 s, and
  "Hold on." is no turn to answer on its own): the turn waits the policy's longest wait.
- An `audio_first` policy asks smart-turn at that silence, alone, before the decode (beside it
  or the LLM's prompt it would take the cores they need), and again at the pause unless asked for
  this silence; one check runs at a time. The combined policy asks it after the text score, and
  only when it could still move the wait (`TurnMachine.wants_audio_verdict`).
- The early transcript, while the user is still silent and the turn is open, is offered to
  speculate on (`PauseTranscript`, once per silence) and judged: ends a sentence, and the text
  turn model's probability, asked once per silence and text however many callers ask (the early
  transcript and the pause both may). `speculate_before_verdict` offers it before the verdict
  (the reply's prompt runs beside the check), else after (on one core's hyperthreads both would
  run at half speed; a turn the verdict ends has its final next, the same decode).
- An utterance starts `preroll_s` before its first speech frame; the words that ended before it
  are dropped (noise the bot talked over), and so are the words of a false interruption.
- A final that is the bot's own voice heard back (`echo`) is no words: no interruption, no turn
  to answer; noise and the false interruption's words give an empty `UserTranscript`.
- The text turn model reads each partial ahead while the user speaks a turn (not over the bot).
"""
from __future__ import annotations

from collections.abc import Generator, Iterator
from dataclasses import dataclass, replace

from agent.conversation.endpointing import EndOfTurnPolicy
from agent.conversation.turns import (
    CancelReply, DiscardTranscript, EndOfTurn, PauseReply, ResumeReply, SpeechPaused, SpeechResumed, SpeechStopped,
    StartUtterance, State, TurnConfig, TurnMachine, only_lead_words)
from agent.tracing.trace import Ev
from asr.base import Word
from tts.chunking import ends_sentence, has_words


# ---- what the listener tells the session ------------------------------------------------------
@dataclass(frozen=True)
class StateChange:
    state: State


@dataclass(frozen=True)
class UserStarted:
    """The user began an utterance (not yet a turn: it may be a pause's continuation)."""


@dataclass(frozen=True)
class UserSpokeOver:
    """The user began speaking over the bot: hold its audio now (words will tell whether it
    was an interruption)."""

    speech_start: float  # perf_counter time of that speech's first VAD frame


@dataclass(frozen=True)
class UserBargedIn:
    """Words over the bot: a real interruption; the paused reply is cancelled."""


@dataclass(frozen=True)
class HeardPartial:
    text: str
    stable: str


@dataclass(frozen=True)
class PauseTranscript:
    """The transcript up to the current pause, while the user is still silent: speculate on it."""

    text: str


@dataclass(frozen=True)
class UserStopped:
    """The user stopped speaking (maybe only for a moment): their words are being decoded now,
    and read-aheads of the words so far give the decode the cores."""


@dataclass(frozen=True)
class UserResumed:
    """The user went on speaking after a pause: a speculation on it is void."""


@dataclass(frozen=True)
class TurnEnded:
    """The user's turn ended; its transcript follows (`UserTranscript`)."""

    t_speech_end: float  # stream time
    speech_end: float  # perf_counter time of the end of speech
    endpoint: float  # perf_counter time the end of turn was decided


@dataclass(frozen=True)
class UserTranscript:
    """The words of the turn that ended last; empty when it held none (noise)."""

    text: str
    words: tuple[Word, ...]
    at: float  # perf_counter time


@dataclass(frozen=True)
class FalseInterruption:
    """The speech over the bot held no words (noise, a backchannel): play on from the pause.
    `words_due`: it was brief, and the reply goes on before its words are known (they may
    still cut it: `UserBargedIn`)."""

    words_due: bool = False


@dataclass(frozen=True)
class RecognizerLost:
    message: str


ListenerEvent = (StateChange | UserStarted | UserSpokeOver | UserBargedIn | HeardPartial | PauseTranscript | UserStopped
                 | UserResumed | TurnEnded | UserTranscript | FalseInterruption | RecognizerLost)


@dataclass
class ListenerConfig:
    turns: TurnConfig
    # early decodes run (and speculated on) per user turn; pauses inside a sentence use some
    max_speculations_per_turn: int = 5
    # audio after the end of speech given to the final decode; at most the turn machine's
    # decode_after_s plus one VAD frame, so the early decode and the final see the same audio
    final_pad_s: float = 0.12
    max_words: int = 512  # recognized words not yet taken by a turn (bounded)
    # offer a pause's transcript to speculate on before the text model judges it, so the reply's
    # prompt and first words are computed meanwhile (with two cores or more; on one core's two
    # hyperthreads both would run at half speed, and the end of the turn waits for the verdict)
    speculate_before_verdict: bool = True
    # new audio between two looks at the words of speech over the bot (`TurnConfig.look_over_s`)
    look_every_s: float = 0.1


# ---- what the machine asks the listener to do -------------------------------------------------
@dataclass(frozen=True)
class Emit:
    event: ListenerEvent  # tell the session (in order)


@dataclass(frozen=True)
class SpokeOver:
    t_speech_start: float  # emit `UserSpokeOver` with the wall time of this stream time


@dataclass(frozen=True)
class EndTurn:
    """Emit `TurnEnded` (wall times: the end of speech's, and now), then queue the turn's final
    decode: the words that end by `until`, taken from the buffer, after the finals before it."""

    t_speech_end: float
    until: float


@dataclass(frozen=True)
class Transcript:
    text: str  # emit `UserTranscript` of these, stamped now
    words: tuple[Word, ...]


@dataclass(frozen=True)
class DropWords:
    before: float  # forget the recognized words that ended by this stream time


@dataclass(frozen=True)
class BeginUtterance:
    t_start: float  # the recognizer decodes from here (preroll included), where it takes hints


@dataclass(frozen=True)
class Speaking:
    active: bool  # the recognizer decodes partials only while the user speaks (the VAD's view)


@dataclass(frozen=True)
class ReadAhead:
    text: str  # the text turn model reads these words now, if it can (waited for)


@dataclass(frozen=True)
class StopReadAhead:
    """Stop the text turn model's read-ahead under way."""


@dataclass(frozen=True)
class QueueEarlyDecode:
    """After the early decodes queued before it: `on_early_turn(t_speech_end, until)`."""

    t_speech_end: float
    until: float


@dataclass(frozen=True)
class DecodeEarly:
    """The words said by `until`, left in the buffer for the final: `on_early_transcript`.
    `quick`: speech over the paused bot, whose words decide now: no second look when unsure."""

    t_speech_end: float
    until: float
    quick: bool = False


@dataclass(frozen=True)
class LookAtOverlap:
    """A quick look at the words said by `until` of the speech over the bot that goes on (no
    word times, no second look): `on_overlap_look`, then `on_overlap_look_ended` however it ends."""

    until: float


@dataclass(frozen=True)
class CheckAudioTurn:
    """Start smart-turn on the last audio up to the last whole VAD frame, as it will be at the
    pause (`heard_silence_s` of silence padded to `pause_s`: eou.as_of_pause): `on_audio_verdict`
    with its probability, then `on_audio_check_ended` however it ends."""

    t_speech_end: float
    heard_silence_s: float
    pause_s: float


@dataclass(frozen=True)
class AwaitAudioCheck:
    """Wait until the running smart-turn check (if any) has ended."""


@dataclass(frozen=True)
class CheckTextTurn:
    """Start the text turn model on `text`, wait for it, then `on_text_verdict`."""

    t_speech_end: float
    text: str


@dataclass(frozen=True)
class AwaitTextTurn:
    """The check started for this silence and text: wait for it, then `on_text_verdict`."""

    t_speech_end: float
    text: str


@dataclass(frozen=True)
class Note:
    """A trace mark of the turn's (agent/tracing/trace.py `Ev`), with its fields."""

    ev: str
    fields: tuple[tuple[str, object], ...] = ()


Command = (Emit | SpokeOver | EndTurn | Transcript | DropWords | BeginUtterance | Speaking | ReadAhead | StopReadAhead
           | QueueEarlyDecode | DecodeEarly | LookAtOverlap | CheckAudioTurn | AwaitAudioCheck | CheckTextTurn | AwaitTextTurn | Note)
Commands = Iterator[Command]


class ListenMachine:
    """The listener's decisions (see the module doc). `audio_model`: smart-turn is there;
    `text_model`: a text turn model is (without it a policy that needs one falls back,
    `EndOfTurnPolicy.without_text_model`, and `fell_back_from` names the policy asked for)."""

    def __init__(self, config: ListenerConfig, audio_model: bool = True, text_model: bool = True):
        self.config = config
        self.audio_model = audio_model
        turns = config.turns
        self.fell_back_from: str | None = None
        if turns.endpointing.uses_text_model and not text_model:
            self.fell_back_from = turns.endpointing.name
            turns = replace(turns, endpointing=turns.endpointing.without_text_model())
        self.turns = TurnMachine(turns)
        self.t_audio = 0.0  # stream time: seconds of audio received
        self._early_decodes = 0  # this turn's
        self._early: tuple[float, float] | None = None  # the last early decode queued: (speech end, until)
        self._early_text: tuple[float, str] | None = None  # the last early transcript: (speech end, text)
        self._offered: float | None = None  # the silence whose transcript was offered to speculate on
        self._audio_asked: float | None = None  # the silence smart-turn was last asked about
        self._audio_checking = False  # a smart-turn check runs (until `on_audio_check_ended`)
        self._text_asked: tuple[float, str] | None = None  # (silence, text) of the last text check
        self._looking = False  # a look at the words of speech over the bot runs
        self._after_look: QueueEarlyDecode | None = None  # the early decode that waits for it
        self._looked_until = 0.0  # the stream time the last one heard up to
        self._look_heard_nothing = False  # ... and it heard no words
        self._judged: tuple | None = None  # the turn machine's judgement by sound last traced
        self._reported = self.turns.state  # the state the session was last told of

    @property
    def state(self) -> State:
        return self.turns.state

    @property
    def in_speech(self) -> bool:
        return self.turns.in_speech

    @property
    def policy(self) -> EndOfTurnPolicy:
        return self.turns.policy

    # ---- events -----------------------------------------------------------------------------------
    def on_audio(self, seconds: float) -> None:
        """`seconds` more audio arrived (at the VAD's rate): the stream clock."""
        self.t_audio += seconds

    def on_vad(self, probs, levels, chunk_s: float, frame_s: float, steps=()) -> Commands:
        """The VAD frames of the last `chunk_s` of audio (`on_audio`'d already): their speech
        probabilities and levels (RMS; fewer levels than frames: the last go without), and the
        levels of their `turned_away.STEP_S` steps (`steps`, in order, a whole number per frame).
        """
        t_first = self.t_audio - chunk_s
        per = len(steps) // len(probs) if probs else 0
        commands = []
        for i, p in enumerate(probs):
            # frames complete at roughly the end of this chunk; spread them back over it
            t = max(t_first, self.t_audio - (len(probs) - 1 - i) * frame_s)
            commands += self.turns.on_vad(t, p, frame_s, levels[i] if i < len(levels) else None,
                                          tuple(steps[i * per:(i + 1) * per]))
        if self.turns.judged is not None and self.turns.judged != self._judged:
            self._judged = self.turns.judged
            yield Note(Ev.TURNED_AWAY, tuple(zip(("level_db", "fall", "away"), self._judged)))
        for c in commands:
            yield from self._carry(c)
        yield Speaking(self.turns.in_speech)
        if (not self._looking and self.turns.wants_overlap_words(self.t_audio)
                and self.t_audio - self._looked_until >= self.config.look_every_s - 1e-9):
            self._looking, self._looked_until = True, self.t_audio
            yield LookAtOverlap(self.t_audio)
        yield from self.report_state()

    def on_early_turn(self, t_speech_end: float, until: float) -> Commands:
        """The early decodes queued before this one (`QueueEarlyDecode`) are done."""
        if not self._silent_since(t_speech_end) or self._early_decodes >= self.config.max_speculations_per_turn:
            return
        self._early_decodes += 1
        if self.policy.audio_first and (yield from self._ask_audio(t_speech_end)):
            # its verdict waits in the turn machine for the pause
            yield AwaitAudioCheck()
            if not self._silent_since(t_speech_end):
                return  # the user went on meanwhile: their next silence decodes
        yield DecodeEarly(t_speech_end, until, quick=self.turns.overlap_open)

    def on_early_transcript(self, t_speech_end: float, text: str, echo: bool = False) -> Commands:
        """The early decode's words (`DecodeEarly`); `echo`: they are the bot's own heard back."""
        self._early_text = (t_speech_end, text)
        if self._silent_since(t_speech_end) and self.turns.overlap_open:
            # speech over the bot: its words decide now whether it was an interruption
            for c in self.turns.on_early_words(self.t_audio, "" if echo else text, t_speech_end):
                yield from self._carry(c)
            yield from self.report_state()
            if self.turns.overlap_open or not self._open_turn() or only_lead_words(text, self.config.turns.backchannels):
                return  # (after "Hold on," alone the user goes on: the longest wait, not a verdict)
            # they cut the reply: a turn of the user's own now, whose end is judged as any other's
        if self._silent_since(t_speech_end):
            if self.policy.audio_first:
                yield from self._ask_audio(t_speech_end)  # if the model was busy with an earlier silence
            yield from self._pause_transcript(t_speech_end, text)

    def _heard_nothing_lately(self, t_speech_end: float) -> bool:
        """The last look heard no words in the speech up to `look_every_s` before its end. Another
        look at its silence would hear the same sound again, and nothing heard decides nothing: the
        decode goes first. (Whisper hears flite's "Uh-huh." as nothing: on `duplex bench overlap`'s
        backchannels none of 22 looks at such a silence heard a backchannel, and the look before
        the decode made the bot's silence 0.43-0.58 s.)"""
        return (not self._looking and self._look_heard_nothing
                and self._looked_until >= t_speech_end - self.config.look_every_s - 1e-9)

    def on_overlap_look(self, text: str, echo: bool = False) -> Commands:
        """The words so far of the speech over the bot (`LookAtOverlap`); `echo`: they are the
        bot's own heard back (no words of the user's)."""
        self._look_heard_nothing = echo or not has_words(text)
        for c in self.turns.on_overlap_words(self.t_audio, "" if echo else text):
            yield from self._carry(c)
        yield from self.report_state()

    def on_overlap_look_ended(self) -> Commands:
        """The look has ended (its words carried out, or it failed): the early decode that waits
        for it is queued, if the user is still silent."""
        self._looking = False
        after, self._after_look = self._after_look, None
        if after is not None and self._silent_since(after.t_speech_end):
            yield after

    def on_audio_verdict(self, probability: float, t_speech_end: float) -> Commands:
        """Smart-turn's probability that the turn is complete, asked about `t_speech_end`."""
        for c in self.turns.on_eou(self.t_audio, probability, t_speech_end):
            yield from self._carry(c)
        yield from self.report_state()

    def on_audio_check_ended(self) -> None:
        """The smart-turn check has ended (its verdict's commands carried out, or it failed)."""
        self._audio_checking = False

    def on_text_verdict(self, t_speech_end: float, text: str, probability: float) -> Commands:
        """The text turn model's probability that `text` ends the turn (`CheckTextTurn`)."""
        if self._open_turn():  # else the user went on meanwhile
            yield from self._judge(t_speech_end, text, probability)

    def on_partial(self, text: str, stable: str) -> Commands:
        """A partial transcript and its stable prefix."""
        # the text turn model reads the words so far while the user speaks a turn, so that the
        # check at the pause, which the turn's end waits for, reads only the words after them
        # (one token: ~20 ms instead of ~40-60). Before the session hears of the partial: the
        # LLM's own read-ahead of it then runs alone, and both end sooner than side by side.
        if self.policy.uses_text_model and self.turns.in_speech and self.turns.state == State.USER_SPEAKING:
            yield ReadAhead(text)
        yield Emit(HeardPartial(text, stable))

    def on_words(self, stable: str, echo: bool = False) -> Commands:
        """A partial's stable words (only words the recognizer will not take back make an
        interruption: a partial's tail can be a guess); `echo`: its text is the bot's own."""
        for c in self.turns.on_words(self.t_audio, "" if echo else stable):
            yield from self._carry(c)
        yield from self.report_state()

    def on_final(self, now: float, text: str, words: tuple[Word, ...] = (), echo: bool = False) -> Commands:
        """The final transcript of the turn that ended first of those awaiting theirs; `echo`:
        it is the bot's own words heard back (no interruption, no turn to answer)."""
        if echo:
            text, words = "", ()
        commands = self.turns.on_final(now, text)
        if any(isinstance(c, DiscardTranscript) and c.echo for c in commands):
            yield Note(Ev.ECHO, (("text", text), ("quiet", True)))
        # noise or backchannels over the bot are no turn to answer
        keep = has_words(text) and not any(isinstance(c, DiscardTranscript) for c in commands)
        # a cancel or a resume first: the reply it decides on goes before a new one starts
        for c in commands:
            yield from self._carry(c)
        yield Transcript(text, words) if keep else Transcript("", ())
        yield from self.report_state()

    def on_bot_initiated(self, now: float) -> bool:
        """The bot speaks first (a greeting); False if the line is not quiet and idle. The
        shell reports the state next (`report_state`)."""
        return self.turns.on_bot_initiated(now)

    def on_reply_started(self, now: float) -> Commands:
        self.turns.on_reply_started(now)
        yield from self.report_state()

    def on_reply_finished(self, now: float, asked: bool = False) -> Commands:
        self.turns.on_reply_finished(now, asked)
        yield from self.report_state()

    def report_state(self) -> Commands:
        """Tell the session of the turn machine's state, if it changed since it was last told."""
        if self.turns.state != self._reported:
            self._reported = self.turns.state
            yield Emit(StateChange(self.turns.state))

    # ---- the turn machine's commands ------------------------------------------------------------
    def _carry(self, c) -> Commands:
        if isinstance(c, PauseReply):
            yield SpokeOver(c.t_speech_start)
        elif isinstance(c, CancelReply):
            yield Emit(UserBargedIn())
        elif isinstance(c, StartUtterance):
            self._early_decodes = 0
            self._early = self._early_text = None
            self._looked_until, self._look_heard_nothing = 0.0, False
            self._after_look = None
            speech_so_far = self.t_audio - c.t_start
            t0 = max(0.0, self.t_audio - speech_so_far - self.config.turns.preroll_s)
            yield DropWords(t0)  # words before the utterance (noise the bot talked over)
            yield BeginUtterance(t0)
            yield Emit(UserStarted())
        elif isinstance(c, SpeechStopped):
            yield StopReadAhead()  # the decode goes first: beside it, both are slower
            yield Emit(UserStopped())
            until = min(c.t_speech_end + self.config.final_pad_s, self.t_audio)
            self._early = (c.t_speech_end, until)
            if (self.turns.overlap_undecided and self.config.turns.look_over_s is not None
                    and not self._heard_nothing_lately(c.t_speech_end)):
                # a look first (2-4 times quicker than the decode), and the decode after it (beside
                # it, both are slower; and a quiet frame inside a word often ends the silence)
                self._after_look = QueueEarlyDecode(c.t_speech_end, until)
                if not self._looking:
                    self._looking, self._looked_until = True, until
                    yield LookAtOverlap(until)
                return
            yield QueueEarlyDecode(c.t_speech_end, until)
        elif isinstance(c, SpeechPaused):
            yield Note(Ev.PAUSE)
            if self.policy.audio_first:
                yield from self._ask_audio(c.t_speech_end)  # unless asked already in this silence
            if self._early_text is not None and self._early_text[0] == c.t_speech_end:
                yield from self._pause_transcript(*self._early_text)  # decoded before the pause
        elif isinstance(c, SpeechResumed):
            yield Emit(UserResumed())
        elif isinstance(c, EndOfTurn):
            early = self._early
            until = early[1] if early is not None and early[0] == c.t_speech_end else min(
                c.t_speech_end + self.config.final_pad_s, self.t_audio)
            yield EndTurn(c.t_speech_end, until)
        elif isinstance(c, ResumeReply):
            if not c.words_due:  # (a brief overlap's words are its final's, already due)
                yield DropWords(self.t_audio)  # the noise that interrupted holds no words worth keeping
            yield Emit(FalseInterruption(c.words_due))
        # DiscardTranscript: `on_final` leaves that transcript empty

    # ---- transcripts and verdicts ---------------------------------------------------------------
    def _silent_since(self, t_speech_end: float) -> bool:
        """The user has said nothing since the silence that began at `t_speech_end` (the one the
        last early decode was queued for)."""
        return not self.turns.in_speech and self._early is not None and self._early[0] == t_speech_end

    def _open_turn(self) -> bool:
        """The user is silent and the turn not taken."""
        return not self.turns.in_speech and self.turns.state in (State.USER_SPEAKING, State.ENDPOINT_PENDING)

    def _pause_transcript(self, t_speech_end: float, text: str) -> Commands:
        """Offer the transcript to speculate on (the session decides whether) and judge whether
        it ends the turn. Only while the turn is open."""
        if not self._open_turn() or not has_words(text):
            return
        if only_lead_words(text, self.config.turns.backchannels):
            return  # "Hold on," alone: the user goes on; the turn waits the policy's longest
        if self.config.speculate_before_verdict:  # a verdict that ends the turn commits it
            yield from self._offer(t_speech_end, text)
        if self.policy.uses_text_model:  # one text turn check per silence and text
            if self._text_asked != (t_speech_end, text):
                self._text_asked = (t_speech_end, text)
                yield CheckTextTurn(t_speech_end, text)
            else:
                yield AwaitTextTurn(t_speech_end, text)
            return  # on in `on_text_verdict`
        yield from self._judge(t_speech_end, text, None)

    def _judge(self, t_speech_end: float, text: str, text_p: float | None) -> Commands:
        for c in self.turns.on_transcript(self.t_audio, ends_sentence(text), text_p, t_speech_end):
            yield from self._carry(c)
        # (judged first: a turn this verdict ended has its final next, the same decode, cached)
        if self._open_turn():
            yield from self._offer(t_speech_end, text)
        if not self.policy.audio_first and self._open_turn() and self.turns.wants_audio_verdict():
            if self._audio_checking:
                yield AwaitAudioCheck()  # an earlier silence's: the policy waits for this one's
            if self._open_turn():
                yield from self._ask_audio(t_speech_end)

    def _offer(self, t_speech_end: float, text: str) -> Commands:
        if self.turns.going_on:
            return  # the words said over the reply that plays on are no turn to speculate on
        if self._offered != t_speech_end:  # once per silence (before the pause, or at it)
            self._offered = t_speech_end
            yield Emit(PauseTranscript(text))

    def _ask_audio(self, t_speech_end: float) -> Generator[Command, None, bool]:
        """Ask smart-turn about the utterance up to this silence: once per silence, one check at
        a time. Whether it was asked."""
        if (not self.audio_model or not self.policy.uses_audio_model or self._audio_asked == t_speech_end
                or self._audio_checking):
            return False
        self._audio_asked = t_speech_end
        self._audio_checking = True
        # the verdict counts once the pause is confirmed: ask about the audio as it will be then
        # (the pause is Silero's silence; a quiet frame before it is still part of the audio)
        yield CheckAudioTurn(t_speech_end, self.turns.vad_silence_s, self.config.turns.pause_s)
        return True
