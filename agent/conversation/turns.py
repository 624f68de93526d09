"""Turn-taking as a pure state machine: events in, state changes and commands out. No models, no I/O.

Events: VAD frames (`on_vad`, which also serve as the clock), end-of-turn model scores (`on_eou`),
recognised words (`on_words`, `on_final`), and the reply's progress (`on_reply_started`/`on_reply_finished`).

States::

    listening --speech--> user_speaking --pause--> endpoint_pending --EOU/max wait--> thinking
        ^                      ^    <--speech resumes--'                                   |
        |                      |                                               first audio out
        |                      '--words heard-- interrupted <--speech over it-- bot_speaking <-'
        |                        (cancel)            '--no words: resume (pause undone)--^
        '------------reply played------------------------------------------------'

- `decode_after_s` of silence or of quiet frames (one VAD frame; see `quiet_db`) emits
  `SpeechStopped`: the session decodes the utterance so far at once (the decode, ~0.1 s of CPU,
  is the longest stage on the critical path). The session first asks the end-of-turn model (alone, before the decode: beside the
  decode or the LLM they would share the cores), then decodes, and when the decode ends and the
  user is still silent it speculates on the transcript (LLM + TTS, audio held back). A verdict
  that comes before the pause is kept (`on_eou`, `on_transcript`) for this silence, so a
  complete turn ends at the pause. If the user goes on (`min_speech_s` of speech) before the
  pause, `SpeechResumed` cancels the speculation and the early verdicts are dropped; the next
  silence asks anew.
- A *pause* (`pause_s` of silence after speech) emits `SpeechPaused`: the session speculates
  on the transcript if it has not yet, and asks the end-of-turn model unless it did for this
  silence. If speech resumes, `SpeechResumed` cancels the speculation.
- The turn ends (`EndOfTurn`) once Silero's silence reaches the wait that the end-of-turn
  policy (`TurnConfig.endpointing`, agent/conversation/endpointing.py) sets from the verdicts of the
  current silence: smart-turn's (`on_eou`), the transcript's punctuation and the text turn
  model's probability (`on_transcript`). The wait may be shorter than `pause_s` (then
  `SpeechPaused` and `EndOfTurn` come together). The policies: "combined", the default
  (smart-turn + the chat model's end-of-message probability after the transcript + the pause
  length), "rules" (smart-turn at the pause, else 0.5 s after a sentence, else 1.5 s),
  "smart-turn" alone, and "silence" (no turn model).
- Barge-in, in two steps: `barge_in_min_speech_s` of user speech while the bot thinks or speaks
  emits `PauseReply` and enters `interrupted`: the session holds the reply's audio at once (the
  far end drops what it buffered) and the reply waits, paused. Words in the utterance (its final
  transcript, or `partial_words_to_interrupt` of a partial's stable words) make it a real interruption:
  `CancelReply`. An utterance whose final transcript
  holds none (a cough, a click, or only backchannels such as "mm-hmm", see `interrupting_words`)
  was not one: `ResumeReply` plays on from where the audio paused, and the transcript is not a
  turn to answer (`DiscardTranscript`). The early decode of the speech over the bot, as soon
  as it stops (`on_early_words`, the decode its final reuses), decides sooner: words cut the
  reply then, none resume it. Sooner still, its words so far are looked at while it goes on
  (`on_overlap_words`: a greedy decode on a short window, from `look_over_s` of speech on): a
  backchannel, a hum or words calling someone else let the reply go on while the speech is
  still said (other words in `looks_to_pause_again` looks in a row pause it again; the decode at
  the silence and the final still cut it), and a look as the speech stops that hears a
  backchannel lets it go on before that decode. Words a decode hears in place of a backchannel a
  look heard, in speech no longer than one (`BACKCHANNEL_MAX_S`), do not cut it (`_disputed`)
  unless they ask it to stop or wait. Backchannels begun over a reply that then ends are no turn
  to answer unless its last words asked something (`on_reply_finished(asked=...)`).
  Speech over the bot quieter and more reverberant than the user's own turns (`turned_away`: said
  to someone else in the room) lets the reply go on while it is said or in the silence after it,
  before its decode, and its words cut it only if they ask it to stop or wait; so does quieter
  speech whose words a look heard call someone else, though the later decodes lose the name.
  Speech over the bot that lasts `brief_overlap_s` (a "yeah", an "okay") and is followed by
  `brief_overlap_wait_s` of silence resumes the reply even before its words are known; it ends as
  a turn whose final decides later: words that interrupt cut the reply then (`CancelReply`) and
  are answered. Nor is speech followed by `false_interruption_s` of silence with no words and no
  end of turn. The timeout counts from the end of that speech, never while it goes on: on a busy
  CPU the words can take seconds, and a timeout counted from the pause resumed the bot over real
  questions (`duplex bench latency` lost three turns so).

Defaults, and why:
- `speech_threshold` 0.5 / `silence_threshold` 0.35: Silero's own hysteresis pair.
- `min_speech_s` 0.1: three 32 ms frames; shorter blips (clicks) are not speech.
- `decode_after_s` 0.03 (the first silent or quiet 32 ms frame): Silero's end of speech lags
  the true end by ~40 ms, so the audio then holds ~70 ms after the last word, and Whisper's transcript
  is the same from 16 ms of tail on (11 bench and dev clips, tails of 16-300 ms). Pauses inside
  a sentence cost a decode each (at most `max_speculations_per_turn` run), and a speculation
  when they last longer than the decode.
- `quiet_db` -35 / `quiet_max_prob` 0.97: the early-decode hint. Silero's probability stays near
  1.0 for two or three frames after the last word (flite questions: its silence began 88-162 ms
  after the exact end). A frame 35 dB below the utterance's loudest frame, once Silero's
  probability has begun to fall, counts as stopped for `SpeechStopped` (the speculative decode)
  but not for the pause, which counts Silero's silence alone: speculative work starts on the
  eager signal, the turn is committed on the conservative one. On the bench turns and the dev
  clips it starts the decode a frame or two earlier on about a third of them, for a decode or
  two more inside speech; it never fires in noise louder than -35 dB.
- `pause_s` 0.2: pipecat's VAD stop_secs when a turn model follows; the smart-turn model then
  decides, so short pauses cost little.
- The policies' longest wait, 1.5 s: the fallback when the turn model says "incomplete"
  (LiveKit's max_endpointing_delay is 3 s, pipecat's smart-turn stop_secs 3 s); shorter, because
  a wrong "incomplete" is the common failure on terse answers. The rules' 0.5 s after a
  sentence is LiveKit's min_endpointing_delay.
- `barge_in_min_speech_s` 0.1: three 32 ms frames, as for an utterance's start, counting the
  frames over `silence_threshold` that lead up to the first over `speech_threshold` (the
  hysteresis Silero's threshold pair applies to an ending, applied to the onset: flite's kal
  said "Wait" softly at 0.41, 0.55, 0.54, 0.33, and only 0.3 s later did three frames in a row
  pass 0.5). A pause costs
  little when it proves false (the reply resumes at the sample it paused, nothing is lost), and
  the bot must stop within 250 ms of the user's onset: Silero's onset lag plus 0.1 s plus the
  clear's way to the far end. (LiveKit pauses after 0.5 s.)
- `false_interruption_s` 2.0: LiveKit's false-interruption timeout, which also starts when the
  user stops speaking. Longer than the policies' longest wait: the utterance's end of turn and its final
  transcript decide first.
- `partial_words_to_interrupt` 3, of the words the recognizer will not change (a partial's stable
  prefix; Whisper's: the words two partials in a row agree on): on a fragment of a hum Whisper
  guesses a word or two ("you", "I'm", "and image" for the first second of flite's "Mm-hmm.";
  over a phone line three: "and and making"). The bot is silent meanwhile, so waiting for more
  words or the final costs nothing audible.
- `echo_level_db` -12: words over the bot whose loudest frame is that far below the user's own
  (the median loudest frame of their last turns) are the bot's voice leaking through the page's
  echo canceller, which it does in bursts when the capture glitches on a busy machine: no
  interruption. In tests/test_browser_echo.py with one core taken by another process, Chromium's
  page mic gave the user's turns peaks of -3 to -8 dBFS and the leaks that cut the story ("I
  talk.", "Just.") -24 to -37; the real barge-in peaked at -10. Needs a turn of the user's first
  (a greeting's listener has none), and the level of each frame (`on_vad`'s `level`).
- `backchannels` `BACKCHANNELS` ("yeah", "okay", "right", ...) besides non-lexical sounds
  (`NONLEXICAL`; Whisper wrote "MMHMM" for flite's "Mm-hmm.", "Mmh" mid-way): said alone over
  the bot they are a listener following, not taking the turn, so the bot goes on; "okay, stop"
  holds a word that interrupts. `()`: only the sounds let it go on.
- `echo_level_db` also gates the pause: speech over the bot whose loudest frame so far is that
  far below the user's turns neither pauses the bot nor starts an utterance (a voice across the
  room, a TV at -20 dB, the echo's bursts); once it grows to the user's level it pauses it as
  usual. `None`: any speech over the bot pauses it.
- `quiet_voice_carry_s` 2.0: such speech goes on after the reply ends (a TV's weather report
  outlasts the story it talked over): as quiet, within 2 s of the last of it held back over the
  bot, it is no turn either. Quiet speech that begins with the bot silent and no such voice
  before it is a turn as ever: the user may have stepped back from the microphone.
- `brief_overlap_s` (0.2, 0.8), `brief_overlap_wait_s` 0.45: a backchannel over the bot costs a
  silence of itself plus 0.45 s at most (flite's "yeah", "right", "uh-huh": 0.3-0.5 s of Silero
  speech), or less when its words come sooner, instead of itself plus the end of turn's wait and
  the decode (seconds on a busy CPU). The wait is longer than the pause after the first words of
  an interruption ("Wait, what ...", "Sorry, what ...": 0.03-0.22 s of Silero silence in flite's
  voices, 0.19-0.38 s in Piper's), so that the bot does not go on for a moment inside it; the
  lower bound leaves out the shortest lead words for the same reason. Its cost: a short real
  interruption ("Stop.") whose words are slower than the wait hears the bot go on until they
  come. `duplex bench overlap` measures it; agent/conversation/overlap.py has the styles that set it.
- `look_over_s` 0.3, `looks_to_pause_again` 2: the bot pauses 0.12 s into
  speech over it, so a backchannel leaves a silence under 0.5 s only if the reply is back within
  ~0.6 s of its onset, and `duplex bench overlap`'s last 0.27-0.92 s. The decode at the silence
  (beam 5, word times) took 230-430 ms on 2 vCPUs beside the voice; a look (greedy, a 2 s pad)
  50-90 ms. Whisper heard the first 0.25 s of flite's "Wait, ..." as "Mm-hmm." in two of five
  voices, and none of 25 interruptions' lead words as a backchannel at 0.35 s; a fragment of a
  hum can read as words ("in a manner" for Piper's "Mm-hmm."), hence two looks to pause again.
- `max_utterance_s` 25: Whisper decodes at most 30 s at once.
- "combined" (the default): `text_weight` 3, `text_bias` 13, `threshold` 0.5, `min_wait_s` 0.1,
  chosen on `duplex bench turns` (82 complete, 150 incomplete utterances; a grid over weight
  1-3, bias 12-16, threshold 0.3-0.7): the quickest turn ends with the fewest false cut-offs
  (about 0.22/0.25 s p50/p90 from the true end of speech, under 5 % cut-offs, against 0.3/0.6 s
  and three quarters cut off for the rules; docs/turn-taking.md has the table). The text score
  decides (cut fragments: 1e-7-1e-12; complete requests, unpunctuated: 1e-1-1e-7; its bias is
  the trade-off between cut-offs and the p90), so the decode runs first and smart-turn only when
  it could still move the wait (`wants_audio_verdict`): smart-turn calls most cut fragments
  complete in these voices. The cut-offs left are Whisper's: it completes a cut fragment ("Set
  a timer for it.", "some tips for some tips?").
"""
from __future__ import annotations

import math
import re
import statistics
from collections import deque
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import NamedTuple

from agent.conversation.addressing import HOLD_WORDS, addressed_elsewhere, may_call_someone
from agent.conversation.endpointing import CombinedPolicy, EndOfTurnPolicy, Features
from agent.conversation.turned_away import SoundOfOverlaps, TurnedAway
from tts.chunking import has_words


# the sounds people make over a speaker to show they listen, and fillers, however a recognizer
# spells them, case and hyphens aside: "Mm-hmm.", "MMHMM", "Mmh" (a partial's), "M-M-H-M-N" and
# "M-H-M-S" (Whisper on cut hums), "hmm", "uh-huh", "um", "ah", "oh", "erm". None of them makes
# speech over the bot an interruption.
NONLEXICAL = re.compile(r"[mhn]+s?|m+h+u+h+|(?:u+h+)+|u+m+|a+h+|o+h+|e+r+m*")


# a recognizer's sound tags: "(coughs)", "[BLANK_AUDIO]", "*laughs*"
SOUND_TAGS = re.compile(r"\([^)]*\)|\[[^\]]*\]|\*[^*]*\*")


def interrupting_words(text: str, backchannels: tuple[str, ...] = ()) -> int:
    """The words of `text` that make speech over the bot an interruption: all but non-lexical
    sounds (`NONLEXICAL`), the `backchannels` given (lowercase words), and a recognizer's sound
    tags ("(coughs)", "[BLANK_AUDIO]")."""
    text = SOUND_TAGS.sub(" ", text)
    words = (re.sub(r"[^\w']", "", w).lower() for w in text.split())
    return sum(1 for w in words
               if has_words(w) and not NONLEXICAL.fullmatch(w) and w not in backchannels)


def only_backchannels(text: str, backchannels: tuple[str, ...] = ()) -> bool:
    """`text` holds words, and all of them are non-lexical sounds or `backchannels`."""
    return has_words(text) and interrupting_words(text, backchannels) == 0


def opens_with_backchannel(text: str, backchannels: tuple[str, ...] = ()) -> bool:
    """`text`'s first word is a non-lexical sound or one of the `backchannels`."""
    words = SOUND_TAGS.sub(" ", text).split()
    return bool(words) and interrupting_words(words[0], backchannels) == 0


# words that open an interruption and ask the bot to wait for what follows ("Hold on, how many
# ...", "Wait, what ...", "Sorry, what ..."): said alone before a pause, the user is going on
LEAD_WORDS = re.compile(r"\b(?:stop|wait|hold on|hang on|hold up|sorry|excuse me|pause)\b", re.IGNORECASE)


def only_lead_words(text: str, backchannels: tuple[str, ...] = ()) -> bool:
    """`text` holds lead words (`LEAD_WORDS`) and nothing else but sounds and backchannels."""
    return bool(LEAD_WORDS.search(text)) and interrupting_words(LEAD_WORDS.sub(" ", text), backchannels) == 0


# the longest a backchannel lasts (flite's "Mm-hmm." runs 1.0-1.2 s): speech over the bot no
# longer than this that a look heard as one is one, whatever a later decode makes of it
BACKCHANNEL_MAX_S = 1.2

# words a listener says over a speaker to show they follow, not to take the turn: over the bot,
# an utterance of these alone (and `NONLEXICAL` sounds) lets it go on
BACKCHANNELS = ("yeah", "yep", "yup", "yes", "right", "okay", "ok", "sure", "alright", "cool", "wow", "nice",
                "exactly", "indeed", "true", "gotcha", "uh", "huh")



class State(str, Enum):
    LISTENING = "listening"
    USER_SPEAKING = "user_speaking"
    ENDPOINT_PENDING = "endpoint_pending"
    THINKING = "thinking"
    BOT_SPEAKING = "bot_speaking"
    INTERRUPTED = "interrupted"


@dataclass
class TurnConfig:
    speech_threshold: float = 0.5
    silence_threshold: float = 0.35
    min_speech_s: float = 0.1
    decode_after_s: float = 0.03
    pause_s: float = 0.2
    barge_in_min_speech_s: float = 0.1  # speech over the bot that pauses it
    false_interruption_s: float = 2.0  # silence after speech over the bot with no words: it resumes
    partial_words_to_interrupt: int = 3  # stable words of a partial that make speech over the bot an interruption
    backchannels: tuple[str, ...] = BACKCHANNELS  # words besides `NONLEXICAL` sounds that do not interrupt
    # speech over the bot this far below the user's own level neither pauses nor interrupts it:
    # the bot's echo, a TV, a voice across the room (None: any speech pauses it)
    echo_level_db: float | None = -12.0
    # ... and with the bot silent too, speech as quiet that goes on within this long of speech
    # held back so: the TV that talked over the reply goes on after it ends, and is no turn
    # (None: only speech over the bot is held back)
    quiet_voice_carry_s: float | None = 2.0
    # speech over the bot lasting between these (seconds) lets it go on the moment it ends, before
    # its words are known: a backchannel costs a silence as long as itself, not its decode too;
    # words in its final still cut the reply then (None: the reply waits for the words)
    brief_overlap_s: tuple[float, float] | None = (0.2, 0.8)
    # ... once this much silence follows it (longer than a comma's pause inside an interruption)
    brief_overlap_wait_s: float = 0.45
    # speech over the paused bot is looked at while it is said (a quick decode of its words so
    # far) once it has lasted this long: a backchannel, a hum or words calling someone else let
    # the reply go on at once, before the speech ends (None: only its end decides). Sooner, a
    # fragment misleads: Whisper heard the first 0.25 s of "Wait, ..." as "Mm-hmm." in two voices
    look_over_s: float | None = 0.3
    # ... and this many looks in a row with other words pause it again (a fragment of a hum can
    # read as a word: "in a manner" for Piper's "Mm-hmm.")
    looks_to_pause_again: int = 2
    # ... and none is looked at after this much of it: a name is called first, a backchannel is
    # over by then, and each look decodes all of it again (the decode at its end still decides)
    look_until_s: float = 2.0
    # words over the bot that open by calling someone else ("Honey, ...") are side talk: they do
    # not cut it (`addressed_elsewhere`); `own_names`: the names the bot answers to
    side_talk: bool = True
    own_names: tuple[str, ...] = ()
    # speech over the bot quieter and more reverberant than the user's own turns is said to
    # someone else in the room: it lets the reply go on and is no turn, unless its words ask the
    # bot to stop or wait (agent/conversation/turned_away.py; None: the sound is not judged)
    turned_away: TurnedAway | None = field(default_factory=TurnedAway)
    max_utterance_s: float = 25.0
    preroll_s: float = 0.3  # audio before the detected speech start that the recognizer gets
    quiet_db: float | None = -35.0  # the early-decode hint (None: off), below the utterance's peak
    quiet_max_prob: float = 0.97  # ... counted only once Silero's probability has begun to fall
    # the end-of-turn policy (agent/conversation/endpointing.py): when the silence after speech ends the turn
    endpointing: EndOfTurnPolicy = field(default_factory=CombinedPolicy)


# Commands the machine asks the session to carry out.
@dataclass(frozen=True)
class StartUtterance:
    t_start: float  # stream time of the first speech frame


@dataclass(frozen=True)
class SpeechStopped:
    t_speech_end: float  # decode the utterance so far now, ahead of the pause


@dataclass(frozen=True)
class SpeechPaused:
    t_speech_end: float  # speculate on the transcript so far; score end-of-turn


@dataclass(frozen=True)
class SpeechResumed:
    t: float  # the user went on: cancel the speculation


@dataclass(frozen=True)
class EndOfTurn:
    t_speech_end: float  # stream time at which the user stopped speaking


@dataclass(frozen=True)
class PauseReply:
    t: float  # the user speaks over the bot: hold the reply's audio now (nothing is lost yet)
    t_speech_start: float  # stream time of that speech's first frame


@dataclass(frozen=True)
class CancelReply:
    t: float  # words over the bot: a real interruption; cancel the paused reply


@dataclass(frozen=True)
class ResumeReply:
    t: float  # the interruption was noise or a backchannel: play on from where the audio paused
    words_due: bool = False  # a brief overlap's, or one still said: its words may still cut the reply


@dataclass(frozen=True)
class DiscardTranscript:
    t: float  # the utterance that ended was that false interruption: not a turn to answer
    echo: bool = False  # its words were too quiet to be the user's (`TurnConfig.echo_level_db`)


Command = (StartUtterance | SpeechStopped | SpeechPaused | SpeechResumed | EndOfTurn | PauseReply | CancelReply
           | ResumeReply | DiscardTranscript)


class _Ended(NamedTuple):
    """A turn that ended and awaits its final."""

    own: bool  # the utterance of an interruption (speech over the bot)
    resumed: bool  # ... a brief one, after which the reply went on
    peak: float  # its loudest frame (RMS)
    hum: bool = False  # ... as long as a backchannel, and a look heard one in it
    fall: float = 0.0  # its sharpest fall in level, dB (`SharpestFall`)
    away: bool = False  # ... said away from the microphone (`TurnConfig.turned_away`)
    over_bot: bool = False  # ... begun over the bot (whose reply may have ended since)


class TurnMachine:
    def __init__(self, config: TurnConfig | None = None):
        self.config = config or TurnConfig()
        self.state = State.LISTENING
        self.transitions: deque[tuple[float, State, State]] = deque(maxlen=1024)  # recent, bounded
        self.in_speech = False  # the user is talking: speech to Silero, and not a quiet frame
        self._vad_speech = False  # Silero's own speech state (with its hysteresis)
        self._speech_run = 0.0  # seconds of consecutive speech frames
        self._lead_run = 0.0  # ... of frames over `silence_threshold` that no speech frame came before
        self._silence_run = 0.0
        self._stop_run = 0.0  # seconds of consecutive silent or quiet frames (the decode trigger)
        self._peak_level = 0.0  # loudest speech frame of the current utterance (RMS)
        self._run_peak = 0.0  # ... of the current run of speech frames (an utterance's first ones)
        self._quiet_voice_at = -math.inf  # speech the level gate last held back (`quiet_voice_carry_s`)
        self._last_speech_end = 0.0
        self._utterance_start = 0.0
        self._stopped = False  # SpeechStopped sent for the current silence
        self._paused = False  # SpeechPaused sent for the current silence
        self._features = Features()  # what the policy knows of this silence
        self._resumable = False  # SpeechStopped sent in user_speaking: speech that goes on resumes
        self._interrupted_at: float | None = None  # the pause's time while the interruption's words are unknown
        self._going_on = False  # the reply plays on over the speech still said: its words so far let it
        self._looks_against = 0  # looks in a row that heard words go on from what let it go on
        self._went_on_hum = False  # it went on for a backchannel's words (not a name, not no words)
        self._called = False  # a look heard it open by calling someone else (`_away`)
        self._resume_to = State.BOT_SPEAKING  # the state a false interruption returns to
        self._finals: deque[_Ended] = deque(maxlen=16)  # the ended turns awaiting their finals
        self._user_peaks: deque[float] = deque(maxlen=8)  # the loudest frame of the user's last turns
        self._sound = SoundOfOverlaps()  # is the speech over the bot said away from the microphone?
        self._over_bot = False  # the current utterance began over the bot
        self._reply_asked = False  # the last reply that finished ended asking something

    @property
    def judged(self) -> tuple[float, float, bool] | None:
        """The speech over the bot judged by its sound (`SoundOfOverlaps.judged`), for the trace."""
        return self._sound.judged

    @property
    def _away(self) -> bool:
        """The speech over the bot is said to someone else in the room: judged so by its sound,
        or quieter than the user's turns (`TurnedAway.quieter`) once a look heard it call someone
        else. The call counts after the decodes lose it: they heard rms's "Kids, it's time to
        brush your teeth." as "Can this video" and "It's time to brush your teeth."; the level
        keeps a misheard name from holding a real interruption, which comes at the user's level."""
        c = self.config.turned_away
        return self._sound.away or (self._called and c is not None and c.quieter(self._peak_level, self._user_level))

    @property
    def _user_level(self) -> float:
        """The user's own level: the median loudest frame of their last turns (RMS; 0.0: none yet)."""
        return statistics.median(self._user_peaks) if self._user_peaks else 0.0

    @property
    def overlap_undecided(self) -> bool:
        """The bot is paused for speech over it whose words are not known yet."""
        return self._interrupted_at is not None

    @property
    def going_on(self) -> bool:
        """The reply plays on over speech still being said, whose words so far let it."""
        return self._going_on

    @property
    def overlap_open(self) -> bool:
        """Speech over the bot whose words still decide: the bot paused for it, or going on over it."""
        return self._interrupted_at is not None or self._going_on

    def wants_overlap_words(self, t: float) -> bool:
        """A look at the words so far of the speech over the bot would decide something now."""
        c = self.config
        return (c.look_over_s is not None and self.overlap_open and self.in_speech and self.state == State.INTERRUPTED
                and c.look_over_s - 1e-9 <= t - self._utterance_start <= c.look_until_s)

    @property
    def vad_silence_s(self) -> float:
        """Seconds of silence Silero has heard up to now (the pause counts these)."""
        return self._silence_run

    def _go(self, t: float, state: State) -> None:
        if state != self.state:
            self.transitions.append((t, self.state, state))
            self.state = state

    # ---- events ---------------------------------------------------------------------------
    def on_vad(self, t: float, prob: float, frame_s: float, level: float | None = None,
               steps: tuple[float, ...] = ()) -> list[Command]:
        """One VAD frame ending at stream time `t` (seconds) with speech probability `prob`;
        `level`: the frame's RMS (optional; it feeds the early-decode hint and the level
        comparisons); `steps`: the RMS of its `turned_away.STEP_S` steps, in order (optional; they
        feed the reverberation comparison)."""
        c = self.config
        self._sound.feed(steps)
        speech = prob >= c.speech_threshold or (self._vad_speech and prob > c.silence_threshold)
        self._vad_speech = speech
        quiet = speech and self._is_quiet(prob, level)
        if speech and not quiet:
            if self._speech_run == 0.0 and self.state in (State.LISTENING, State.THINKING, State.BOT_SPEAKING):
                self._sound.fall.restart()  # an utterance's falls count from its first speech frame on
            if self._speech_run == 0.0 and self.state in (State.THINKING, State.BOT_SPEAKING):
                # Silero's hysteresis, backwards: the frames over its silence threshold that led
                # up to this one were the onset ("Wait" said softly: 0.41, then 0.55, 0.54)
                self._speech_run = self._lead_run
            self._lead_run = 0.0
            self.in_speech = True
            self._speech_run += frame_s
            self._silence_run = self._stop_run = 0.0
            self._stopped = False
            if self.state != State.ENDPOINT_PENDING:  # a blip in the pause does not void them
                self._features = Features()
            if level is not None and prob >= c.speech_threshold:
                self._peak_level = max(self._peak_level, level)
                self._run_peak = max(self._run_peak, level)
        else:
            self._lead_run = self._lead_run + frame_s if not speech and prob > c.silence_threshold else 0.0
            self._run_peak = 0.0
            if self._stop_run == 0.0:  # the speech ended where this run of stopped frames began
                self._last_speech_end = t - frame_s
            self._stop_run += frame_s
            self._speech_run = 0.0
            self.in_speech = False
            # a quiet frame is still speech to Silero: the pause counts Silero's silence only
            self._silence_run = 0.0 if speech else self._silence_run + frame_s

        def spoke(seconds: float) -> bool:  # to the nearest frame: 0.1 s is three 32 ms frames, not four
            return self._speech_run >= seconds - frame_s / 2

        out: list[Command] = []
        s = self.state
        if (self._interrupted_at is not None and not self.in_speech and self._stop_run >= c.brief_overlap_wait_s
                and s in (State.INTERRUPTED, State.ENDPOINT_PENDING) and self._brief_overlap()):
            return self._go_on(t)  # its words are not known yet: its final decides later
        if s == State.LISTENING:
            if spoke(c.min_speech_s) and not self._held_back(t):
                out.append(self._start_user(t, State.USER_SPEAKING))
        elif s in (State.USER_SPEAKING, State.INTERRUPTED):
            if (resume := self._check_false_interruption(t)):
                return resume
            out += self._check_turned_away(t)
            if self._resumable and spoke(c.min_speech_s):
                self._resumable = False  # they went on after a short silence: drop its speculation
                out.append(SpeechResumed(t))
            if t - self._utterance_start >= c.max_utterance_s:
                out += self._end_turn(t, self._speech_end_by(t))
                return out
            if self._stop_run >= c.decode_after_s and not self._stopped:
                self._stopped = True
                self._resumable = s == State.USER_SPEAKING
                out.append(SpeechStopped(self._last_speech_end))
            if not self.in_speech and self._silence_run >= c.pause_s and not self._paused:
                self._paused = True
                self._go(t, State.ENDPOINT_PENDING)
                out.append(SpeechPaused(self._last_speech_end))
            out += self._policy_check(t)
        elif s == State.ENDPOINT_PENDING:
            if (resume := self._check_false_interruption(t)):
                return resume
            out += self._check_turned_away(t)
            if spoke(c.min_speech_s):
                self._paused = False
                self._resumable = False
                self._features = Features()
                self._go(t, State.USER_SPEAKING)
                out.append(SpeechResumed(t))
            else:
                out += self._policy_check(t)
        elif s in (State.THINKING, State.BOT_SPEAKING) and self.in_speech:
            if self._below_the_user(self._run_peak):  # a quieter voice is not the user's
                self._quiet_voice_at = t
            elif spoke(c.barge_in_min_speech_s):
                if self._interrupted_at is None:  # else the reply is paused already (its final is due)
                    self._interrupted_at, self._resume_to = t, s
                    out.append(PauseReply(t, t - self._speech_run))
                out.append(self._start_user(t, State.INTERRUPTED))
        return out

    def on_eou(self, t: float, probability: float, t_speech_end: float | None = None) -> list[Command]:
        """The end-of-turn model's verdict on the utterance up to the current silence. Before the
        pause it is kept until the pause is confirmed. `t_speech_end`: the silence it was asked
        about (the `SpeechStopped`/`SpeechPaused` time); a late verdict on an earlier silence is
        not kept for this one. (Once the pause is confirmed any verdict on the utterance counts:
        a blip of noise during the pause must not void it.)"""
        if self.in_speech:
            return []
        if self._current(t_speech_end):
            self._features = replace(self._features, audio_p=probability)
        return self._policy_check(t)

    def on_transcript(self, t: float, complete: bool, text_p: float | None = None,
                      t_speech_end: float | None = None) -> list[Command]:
        """The transcript up to the current pause; `complete` if it ends a sentence; `text_p`:
        the text turn model's probability that it ends the turn (None: not asked). It counts
        before the pause too (for the silence `t_speech_end`)."""
        if self.in_speech or not self._current(t_speech_end):
            return []
        self._features = replace(self._features, text_complete=complete,
                                 text_p=self._features.text_p if text_p is None else text_p)
        return self._policy_check(t)

    def on_words(self, t: float, text: str) -> list[Command]:
        """The words of the user's current utterance that the recognizer will not change (a
        partial's stable prefix): enough of them over the bot (not backchannels) make the
        interruption real."""
        c = self.config
        if (not self.overlap_open or interrupting_words(text, c.backchannels) < c.partial_words_to_interrupt
                or self._below_the_user(self._peak_level) or (c.side_talk and may_call_someone(text, c.own_names))
                or self._disputed(text, t - self._utterance_start) or self._side_talk(text, self._away)):
            return []  # a too quiet one, or one that may call someone else, waits for its final
        return self._confirm_interruption(t)

    def on_overlap_words(self, t: float, text: str) -> list[Command]:
        """The words so far of the speech over the bot (a quick look, `wants_overlap_words`). While
        it is said, a look that hears a backchannel, a hum or words calling someone else lets the
        paused reply go on now (its words may still cut it), and `looks_to_pause_again` looks in a
        row that hear other words pause it again. Once it has stopped, one look that hears a backchannel or a hum lets it go on before the decode
        at the silence (which its final reuses) has decided: that decode takes 2-4 times longer."""
        c = self.config
        if c.look_over_s is None or not self.overlap_open:
            return []
        if not self.in_speech:
            if self._interrupted_at is None or self.state not in (State.INTERRUPTED, State.ENDPOINT_PENDING):
                return []
            if only_backchannels(text, c.backchannels):
                self._went_on_hum = True
                return self._go_on(t)
            return []  # no words is no backchannel yet: flite's kal "Wait, ..." is heard as none
        if self.state != State.INTERRUPTED:
            return []
        self._called = self._called or (c.side_talk and may_call_someone(text, c.own_names))
        lets = self._lets_go_on(text)  # None: nothing heard
        if lets and not self._going_on:
            self._interrupted_at, self._going_on = None, True
            self._went_on_hum = only_backchannels(text, c.backchannels)
            return [ResumeReply(t, words_due=True)]
        # after a backchannel, only words that go on from it or ask the bot to stop count
        counts = not self._went_on_hum or self._after_hum_counts(text)
        self._looks_against = self._looks_against + 1 if lets is False and counts and self._going_on else 0
        if self._looks_against < c.looks_to_pause_again:
            return []
        self._looks_against = 0
        self._going_on, self._went_on_hum, self._interrupted_at = False, False, t
        return [PauseReply(t, self._utterance_start)]

    def on_early_words(self, t: float, text: str, t_speech_end: float) -> list[Command]:
        """The words of the speech over the bot up to the silence that began at `t_speech_end`
        (the early decode, which its final will reuse), while that silence goes on: words that
        interrupt cut the reply now; none (a backchannel, a cough) let it go on now (or on, if it
        went on while they were said), and its final only confirms it."""
        if (not self.overlap_open or self.in_speech or t_speech_end != self._last_speech_end
                or self.state not in (State.INTERRUPTED, State.ENDPOINT_PENDING)):
            return []
        self._judge_turned_away(t)  # "Hey," then a breath: the fall into that silence tells too
        if (self._interrupts(text, self._away) and not self._below_the_user(self._peak_level)
                and not self._disputed(text, self._last_speech_end - self._utterance_start)):
            if self.config.side_talk and may_call_someone(text, self.config.own_names):
                return []  # "Honey." at the pause after a name: the words after it tell
            return self._confirm_interruption(t)
        return self._go_on(t)

    def on_final(self, t: float, text: str) -> list[Command]:
        """The final transcript of the turn that ended first of those awaiting theirs."""
        ended = self._finals.popleft() if self._finals else _Ended(False, False, 0.0)
        own, peak, away = ended.own, ended.peak, ended.away
        if own and ended.resumed:  # a brief overlap the reply went on after, or speech it went on over
            words = self._interrupts(text, away)
            echo = bool(words) and self._below_the_user(peak)
            if words and not echo and not (ended.hum and not self._after_hum_counts(text)):
                return self._cut_resumed(t)
            return [DiscardTranscript(t, echo=echo)]
        if own and self._interrupted_at is not None:
            words = self._interrupts(text, away)
            echo = bool(words) and self._below_the_user(peak)
            if words and not echo:
                return self._confirm_interruption(t)
            out: list[Command] = [DiscardTranscript(t, echo=echo)]
            if self.state == State.THINKING:  # else the user speaks again: that utterance decides
                out += self._resume(t)
            return out
        if not own and ended.over_bot and (self._side_talk(text, away) or self._acknowledged(text)):
            # said to someone else over the bot, whose reply ended meanwhile, or a backchannel to
            # a reply that ended without asking anything: no turn either
            if self.state == State.THINKING:
                self._go(t, State.LISTENING)
            return [DiscardTranscript(t)]
        if not own and not away and peak > 0.0 and interrupting_words(text, self.config.backchannels):
            self._user_peaks.append(peak)  # the user's own voice, as this line delivers it
            self._sound.user_turn(ended.fall)
        if (self.state == State.THINKING and self._interrupted_at is None
                and not has_words(text)):
            self._go(t, State.LISTENING)  # noise, with no reply to go back to
        return []

    def on_bot_initiated(self, t: float) -> bool:
        """The bot speaks first (a greeting): listening -> thinking, so that speech over it is a
        barge-in like any other. False (nothing changes) unless the line is quiet and idle."""
        if self.state != State.LISTENING:
            return False
        self._go(t, State.THINKING)
        return True

    def on_reply_started(self, t: float) -> None:
        """The first reply audio went out (or, paused, waits to)."""
        if self._interrupted_at is not None:
            self._resume_to = State.BOT_SPEAKING
        elif self.state == State.THINKING:
            self._go(t, State.BOT_SPEAKING)

    def on_reply_finished(self, t: float, asked: bool = False) -> None:
        """The reply was fully played, or it failed: a paused one has nothing left to resume.
        `asked`: its last words asked the user something (a "yeah" said over them answers it)."""
        self._reply_asked = asked
        if self.overlap_open:
            self._interrupted_at, self._going_on = None, False
            if self.state == State.INTERRUPTED:
                self._go(t, State.USER_SPEAKING)  # the speech over it is an utterance like any other
        if self.state in (State.THINKING, State.BOT_SPEAKING):
            self._go(t, State.LISTENING)

    # ---- helpers --------------------------------------------------------------------------
    def _current(self, t_speech_end: float | None) -> bool:
        """A verdict about `t_speech_end` counts for the policy now: in the pause any verdict on
        the utterance does; before it, one on this silence (after its `SpeechStopped`)."""
        if self.state == State.ENDPOINT_PENDING:
            return True
        return (self.state in (State.USER_SPEAKING, State.INTERRUPTED) and self._stopped
                and (t_speech_end is None or t_speech_end == self._last_speech_end))

    @property
    def policy(self) -> EndOfTurnPolicy:
        return self.config.endpointing

    def required_silence(self) -> float:
        """Seconds of Silero silence after which the policy ends the turn, from what it knows."""
        return self.policy.required_silence(self._features, self.config.pause_s)

    def wants_audio_verdict(self) -> bool:
        """Whether smart-turn's verdict, whatever it says, could change this silence's wait by
        more than a VAD frame, given what is known already."""
        return self.policy.wants_audio_verdict(self._features)

    def _policy_check(self, t: float) -> list[Command]:
        """End the turn once the silence reaches the policy's wait (confirming the pause first
        when the wait is shorter than `pause_s`)."""
        if self.in_speech or self.state not in (State.USER_SPEAKING, State.INTERRUPTED, State.ENDPOINT_PENDING):
            return []
        if self.state != State.ENDPOINT_PENDING and not self._stopped:
            return []
        required = self.required_silence()
        # a confirmed pause is the silence a wait up to `pause_s` asks for, even if a blip of
        # noise in it (too short for speech) has restarted Silero's count since
        if self.state == State.ENDPOINT_PENDING and required <= self.config.pause_s:
            required = 0.0
        if self._silence_run + 1e-9 < required:
            return []
        out: list[Command] = []
        if self.state != State.ENDPOINT_PENDING:
            self._paused = True
            self._go(t, State.ENDPOINT_PENDING)
            out.append(SpeechPaused(self._last_speech_end))
        return out + self._end_turn(t, self._last_speech_end)

    def _is_quiet(self, prob: float, level: float | None) -> bool:
        """The early-decode hint: Silero still says speech (it lags the true end by 2-3 frames)
        but the frame is `quiet_db` below the utterance's loudest frame and Silero's probability
        has begun to fall. Only inside an utterance the user is speaking."""
        c = self.config
        return (c.quiet_db is not None and level is not None and self._peak_level > 0.0
                and self.state in (State.USER_SPEAKING, State.INTERRUPTED) and prob < c.quiet_max_prob
                and level < self._peak_level * 10.0 ** (c.quiet_db / 20.0))

    def _below_the_user(self, peak: float) -> bool:
        """Speech whose loudest frame is `echo_level_db` below the user's own turns' (median)."""
        db = self.config.echo_level_db
        if db is None or not self._user_peaks or peak <= 0.0:
            return False
        return peak < self._user_level * 10.0 ** (db / 20.0)

    def _held_back(self, t: float) -> bool:
        """Speech as quiet as the level gate holds back over the bot, going on within
        `quiet_voice_carry_s` of speech it held back: the same voice, not the user's."""
        carry = self.config.quiet_voice_carry_s
        if carry is None or t - self._quiet_voice_at > carry or not self._below_the_user(self._run_peak):
            return False
        self._quiet_voice_at = t
        return True

    def _check_false_interruption(self, t: float) -> list[Command]:
        """`false_interruption_s` of silence after the speech over the bot, with no words and
        no end of turn yet: drop the utterance, resume."""
        if (self._interrupted_at is not None and not self.in_speech
                and self._silence_run >= self.config.false_interruption_s):
            self._paused = False
            return self._resume(t)
        return []

    def _side_talk(self, text: str, away: bool = False) -> bool:
        """Words said to someone else: they open by calling someone else, or they were said away
        from the microphone (`away`) and do not ask the bot to stop or wait."""
        return ((self.config.side_talk and addressed_elsewhere(text, self.config.own_names))
                or (away and not HOLD_WORDS.search(text)))

    def _check_turned_away(self, t: float) -> list[Command]:
        """Speech over the bot judged said away from the microphone (`TurnConfig.turned_away`)
        lets the paused reply go on while it is said, or in the silence after it as soon as the
        room's tail has fallen far enough to be judged (before its decode); its words decide no
        more unless they ask the bot to stop or wait."""
        c = self.config.turned_away
        if (c is None or self._away or self.state not in (State.INTERRUPTED, State.USER_SPEAKING, State.ENDPOINT_PENDING)
                or t - self._utterance_start < c.after_s - 1e-9 or not self._judge_turned_away(t)):
            return []  # (judged away before: its words have paused it again since, or a look let it go on)
        if self._going_on:  # a look let it go on already
            return []
        self._interrupted_at, self._going_on = None, True
        return [ResumeReply(t, words_due=True)]

    def _judge_turned_away(self, t: float) -> bool:
        """Judge the speech over the bot up to stream time `t` (once it is judged away, it stays so)."""
        c = self.config.turned_away
        if c is None or not self.overlap_open or not self._user_peaks:
            return self._away
        spoken = self._speech_end_by(t) - self._utterance_start
        return self._sound.judge(c, self._peak_level, self._user_level, self._utterance_start, spoken)

    def _speech_end_by(self, t: float) -> float:
        """Where the speech heard by stream time `t` ends: `t` while it goes on."""
        return t if self.in_speech else self._last_speech_end

    def _lets_go_on(self, text: str) -> bool | None:
        """The words so far of speech over the bot let it go on (None: no words heard). No words is
        no sign: a look hears none in a caller's "Wait, wait. Stop ..." over a phone line, in turns
        with "Wait"."""
        c = self.config
        if not has_words(text):
            return None
        if (c.side_talk and may_call_someone(text, c.own_names)) or self._side_talk(text, self._away):
            return True
        return interrupting_words(text, c.backchannels) == 0

    def _disputed(self, text: str, spoken_s: float) -> bool:
        """Words of a decode that a look heard as a backchannel, in speech no longer than one,
        that do not go on from a backchannel: two hearings of a brief sound disagree ("Go key." and
        "Okay" for awb's "Okay."; "in a month." and "N m m" for Piper's "Mm-hmm."), and the bot
        keeps the floor. Words after a backchannel ("Okay, stop.") are no dispute, nor words
        that ask the bot to stop or wait (`_after_hum_counts`)."""
        return self._went_on_hum and spoken_s <= BACKCHANNEL_MAX_S and not self._after_hum_counts(text)

    def _after_hum_counts(self, text: str) -> bool:
        """Words heard where a look heard a backchannel that count all the same: words going on
        from it ("Okay, but what ..."), and words asking the bot to stop or wait. Whisper makes
        other words up over a hum ("I am here", "I am a major"), not these; and a look at the first
        0.3 s of "Stop, stop. Wait ..." hears "Mm-hmm." in flite's kal and awb voices."""
        return opens_with_backchannel(text, self.config.backchannels) or bool(HOLD_WORDS.search(text))

    def _acknowledged(self, text: str) -> bool:
        """Only backchannels, said over a reply that has since ended without asking anything: the
        user acknowledged it ("Mm-hmm." as a story ends), and a person would not answer that."""
        return not self._reply_asked and only_backchannels(text, self.config.backchannels)

    def _interrupts(self, text: str, away: bool = False) -> int:
        """The words of speech over the bot that make it an interruption: none for backchannels
        and sounds, none for side talk (`away`: said away from the microphone)."""
        return 0 if self._side_talk(text, away) else interrupting_words(text, self.config.backchannels)

    def _brief_overlap(self) -> bool:
        """The speech over the paused bot that just stopped was brief enough to go on after."""
        brief = self.config.brief_overlap_s
        return (brief is not None and self._interrupted_at is not None
                and brief[0] - 1e-9 <= self._last_speech_end - self._utterance_start <= brief[1] + 1e-9)

    def _go_on(self, t: float) -> list[Command]:
        """End the speech over the bot as a turn whose final decides later, and resume the reply
        (unless it went on while the speech was said)."""
        if self._going_on:
            return self._end_turn(t, self._last_speech_end)
        out = self._end_turn(t, self._last_speech_end, resumed=True)
        return out + self._resume(t, words_due=True)

    def _resume(self, t: float, words_due: bool = False) -> list[Command]:
        self._interrupted_at = None
        self._go(t, self._resume_to)
        return [ResumeReply(t, words_due)]

    def _cut_resumed(self, t: float) -> list[Command]:
        """A brief overlap's final held words: cut the reply it went on with, and answer them."""
        if self._interrupted_at is not None:  # the user speaks over it again: paused already
            return self._confirm_interruption(t)
        if self.state in (State.THINKING, State.BOT_SPEAKING):
            self._go(t, State.THINKING)
            return [CancelReply(t)]
        if self.state == State.LISTENING:  # the reply ended meanwhile: the words are a turn to answer
            self._go(t, State.THINKING)
        return []

    def _confirm_interruption(self, t: float) -> list[Command]:
        self._interrupted_at, self._going_on, self._went_on_hum = None, False, False
        if self.state == State.INTERRUPTED:
            self._go(t, State.USER_SPEAKING)
        return [CancelReply(t)]

    def _end_turn(self, t: float, t_speech_end: float, resumed: bool = False) -> list[Command]:
        self._speech_run = 0.0  # speech that goes on after a forced end must build up anew
        self._paused = False
        self._resumable = False
        self._features = Features()
        hum = self._went_on_hum and t_speech_end - self._utterance_start <= BACKCHANNEL_MAX_S
        self._finals.append(_Ended(self.overlap_open, resumed or self._going_on, self._peak_level, hum,
                                   self._sound.fall.db, self._away, self._over_bot))
        self._sound.end(t_speech_end)
        # the reply that went on over the speech plays on; else the bot has the turn to think
        self._go(t, self._resume_to if self._going_on else State.THINKING)
        self._going_on = self._went_on_hum = False
        return [EndOfTurn(t_speech_end)]

    def _start_user(self, t: float, state: State) -> StartUtterance:
        self._go(t, state)
        self._peak_level = self._run_peak  # the frames that opened it count
        self._looks_against = 0
        self._went_on_hum = self._called = False
        self._sound.begin()
        self._over_bot = state == State.INTERRUPTED
        self._paused = False
        self._features = Features()
        self._utterance_start = t - self._speech_run  # start of the speech run that opened it
        return StartUtterance(self._utterance_start)
