"""The listener's decisions (`ListenMachine`), driven by synthetic VAD frames and scripted model
answers: no asyncio, no audio, no models. Each test asserts the commands the machine gives."""
from agent.conversation.endpointing import CombinedPolicy, RulesPolicy, SilencePolicy, SmartTurnPolicy
from agent.conversation.listening import (
    AwaitAudioCheck, AwaitTextTurn, BeginUtterance, CheckAudioTurn, CheckTextTurn, DecodeEarly, DropWords, Emit,
    EndTurn, FalseInterruption, HeardPartial, ListenerConfig, ListenMachine, LookAtOverlap, Note, PauseTranscript, QueueEarlyDecode, ReadAhead,
    Speaking, SpokeOver, StateChange, StopReadAhead, Transcript, UserBargedIn, UserResumed, UserStarted, UserStopped)
from agent.conversation.turns import State, TurnConfig
from agent.tracing.trace import Ev
from asr.base import Word

F = 0.032


def near(a: float, b: float) -> bool:
    return abs(a - b) < 1e-6


class Driver:
    """The listener's shell, synchronously: one VAD frame a chunk; the work a command starts
    (a decode, a model's check) waits until the test answers it, and a command that waits for
    one parks the machine's iterator until then, as the shell's task would."""

    def __init__(self, audio: bool = True, text: bool = True, listener: dict | None = None, **turns):
        turns.setdefault("endpointing", RulesPolicy())
        self.m = ListenMachine(ListenerConfig(TurnConfig(**turns), **(listener or {})), audio_model=audio,
                               text_model=text)
        self.log: list = []
        self.queued: list[QueueEarlyDecode] = []  # early decodes waiting for their turn
        self.decoding: list[DecodeEarly] = []
        self.audio_checks: list[CheckAudioTurn] = []  # running (one at most)
        self.after_audio: list = []  # iterators waiting for the audio check to end
        self.after_text: list = []  # (the check, the iterator waiting for its verdict)
        self.ended: list[EndTurn] = []  # turns awaiting their final

    def run(self, commands):
        for c in commands:
            if not isinstance(c, Speaking):
                self.log.append(c)
            if isinstance(c, QueueEarlyDecode):
                self.queued.append(c)
            elif isinstance(c, DecodeEarly):
                self.decoding.append(c)
            elif isinstance(c, CheckAudioTurn):
                self.audio_checks.append(c)
            elif isinstance(c, EndTurn):
                self.ended.append(c)
            elif isinstance(c, AwaitAudioCheck) and self.audio_checks:
                self.after_audio.append(commands)
                return self
            elif isinstance(c, (CheckTextTurn, AwaitTextTurn)):
                self.after_text.append((c, commands))
                return self
        return self

    # ---- events -----------------------------------------------------------------------------------
    def frames(self, pattern: str, level: float = 0.3):
        """'#' speech, '.' silence: one 32 ms VAD frame (and chunk) each."""
        for ch in pattern:
            self.m.on_audio(F)
            speech = ch == "#"
            self.run(self.m.on_vad([0.9 if speech else 0.05], [level if speech else 0.001], F, F))
        return self

    def early(self):
        """The next queued early decode's turn comes (the ones before it are done)."""
        c = self.queued.pop(0)
        return self.run(self.m.on_early_turn(c.t_speech_end, c.until))

    def looked(self, text: str = ""):
        """The look at the words of speech over the bot (`LookAtOverlap`) answers, and ends."""
        self.run(self.m.on_overlap_look(text))
        return self.run(self.m.on_overlap_look_ended())

    def decoded(self, text: str):
        c = self.decoding.pop(0)
        return self.run(self.m.on_early_transcript(c.t_speech_end, text))

    def audio(self, p: float):
        c = self.audio_checks.pop(0)
        self.run(self.m.on_audio_verdict(p, c.t_speech_end))
        self.m.on_audio_check_ended()
        waiting, self.after_audio = self.after_audio, []
        for it in waiting:
            self.run(it)
        return self

    def text(self, p: float):
        waiting, self.after_text = self.after_text, []
        for c, it in waiting:
            self.run(self.m.on_text_verdict(c.t_speech_end, c.text, p))
            self.run(it)
        return self

    def final(self, text: str, words: tuple[Word, ...] = (), echo: bool = False):
        self.ended.pop(0)
        return self.run(self.m.on_final(self.m.t_audio, text, words, echo))

    def partial(self, text: str, stable: str, echo: bool = False):
        self.run(self.m.on_partial(text, stable))
        return self.run(self.m.on_words(stable, echo))

    def bot_speaks(self):
        self.run(self.m.on_reply_started(self.m.t_audio))
        return self

    # ---- what came out ------------------------------------------------------------------------------
    def since(self, n: int) -> list:
        return self.log[n:]

    def kinds(self, n: int = 0) -> list:
        return [type(c.event) if isinstance(c, Emit) else type(c) for c in self.log[n:]]

    def of(self, kind) -> list:
        return [c for c in self.log if isinstance(c, kind) or (isinstance(c, Emit) and isinstance(c.event, kind))]


def test_an_utterance_starts_with_its_preroll_and_drops_the_words_before_it():
    d = Driver().frames("." * 20 + "###")
    t_start = 20 * F
    assert d.kinds() == [DropWords, BeginUtterance, UserStarted, StateChange]
    assert near(d.log[0].before, t_start - 0.3) and near(d.log[1].t_start, t_start - 0.3)
    assert d.log[3] == Emit(StateChange(State.USER_SPEAKING))
    assert Driver().frames("###").log[1] == BeginUtterance(0.0)  # not before the stream's start


def test_a_pause_asks_the_audio_verdict_first_then_one_early_decode():
    d = Driver(endpointing=SmartTurnPolicy()).frames("#" * 20 + ".")
    n = len(d.log)
    assert d.kinds(4) == [StopReadAhead, UserStopped, QueueEarlyDecode]
    (queued,) = d.queued
    assert near(queued.t_speech_end, 20 * F) and near(queued.until, 21 * F)  # the audio heard so far
    d.early()
    # smart-turn alone first (beside the decode it would share the cores); the decode waits for it
    assert d.kinds(n) == [CheckAudioTurn, AwaitAudioCheck] and not d.decoding
    assert d.log[n].t_speech_end == queued.t_speech_end and near(d.log[n].heard_silence_s, F)
    d.audio(0.9)  # kept in the turn machine until the pause
    assert d.kinds(n + 2) == [DecodeEarly] and d.decoding == [DecodeEarly(queued.t_speech_end, queued.until)]
    d.decoded("How many legs does a spider have?")
    assert d.kinds(n + 3) == [PauseTranscript]
    d.frames("." * 6)  # the pause: smart-turn was asked for this silence already, and said "complete"
    assert d.since(n + 4) == [Note(Ev.PAUSE), EndTurn(queued.t_speech_end, queued.until),
                              Emit(StateChange(State.THINKING))]
    assert len(d.of(CheckAudioTurn)) == len(d.of(DecodeEarly)) == len(d.of(PauseTranscript)) == 1


def test_a_decode_that_ends_while_the_pause_is_pending_is_offered_at_once():
    d = Driver(endpointing=SmartTurnPolicy()).frames("#" * 20 + ".").early().audio(0.1).frames("." * 6)
    assert d.of(Note) == [Note(Ev.PAUSE)] and not d.of(PauseTranscript)  # the decode is still running
    d.decoded("I would like")
    assert d.of(PauseTranscript) == [Emit(PauseTranscript("I would like"))]
    assert d.m.state == State.ENDPOINT_PENDING  # "incomplete": the turn waits


def test_a_transcript_decoded_before_the_pause_is_offered_once():
    d = Driver(audio=False, endpointing=SilencePolicy()).frames("#" * 20 + ".").early().decoded("hello there")
    d.frames("." * 8)  # the pause comes: its transcript was offered already
    assert d.of(PauseTranscript) == [Emit(PauseTranscript("hello there"))]


def test_a_turns_early_decodes_are_capped_and_a_new_turn_gets_its_own():
    d = Driver(audio=False, endpointing=SilencePolicy(), listener={"max_speculations_per_turn": 2})
    d.frames("#" * 10 + ".").early().decoded("one")
    d.frames("####.").early().decoded("one two")
    d.frames("####.").early()
    assert len(d.of(QueueEarlyDecode)) == 3 and len(d.of(DecodeEarly)) == 2  # the third is spent
    assert d.kinds().count(UserResumed) == 2
    d.frames("." * 16)
    assert len(d.ended) == 1 and d.m.state == State.THINKING
    d.final("one two three").frames("#" * 10 + ".").looked("four").early()  # over the thinking bot: a look first
    assert len(d.of(DecodeEarly)) == 3


def test_a_stale_early_transcript_is_dropped():
    d = Driver(audio=False, endpointing=SilencePolicy()).frames("#" * 10 + ".").early()
    d.frames("####")  # the user went on while it decoded
    n = len(d.log)
    d.decoded("I'd like")
    assert d.since(n) == [], "not offered: the words go on"
    # one queued for a silence the user has ended since is skipped, not counted
    d.frames("..").frames("####").early()
    assert len(d.of(DecodeEarly)) == 1
    # and a transcript of an earlier silence is not this pause's
    d.frames(".").early()
    d.frames("." * 7)
    assert d.m.state == State.ENDPOINT_PENDING and not d.of(PauseTranscript)
    d.decoded("I'd like a table")
    assert d.of(PauseTranscript) == [Emit(PauseTranscript("I'd like a table"))]


def test_one_audio_check_at_a_time_and_once_per_silence():
    d = Driver(endpointing=SmartTurnPolicy()).frames("#" * 10 + ".").early()
    first = d.audio_checks[0]
    d.frames("####.")  # a new silence while the first one's check still runs
    d.early()
    assert d.of(CheckAudioTurn) == [first] and len(d.of(DecodeEarly)) == 1, "the decode did not wait for it"
    d.audio(0.2)
    d.decoded("so I was")  # the model is free now: this silence's check
    assert len(d.of(CheckAudioTurn)) == 2 and d.of(CheckAudioTurn)[1].t_speech_end > first.t_speech_end
    d.audio(0.2).frames("." * 7)  # the pause: asked for this silence already
    assert len(d.of(CheckAudioTurn)) == 2


def text_turn(before: bool) -> Driver:
    return Driver(endpointing=CombinedPolicy(), listener={"speculate_before_verdict": before})


def test_the_text_model_judges_once_per_silence_and_text_after_the_offer():
    d = text_turn(before=True).frames("#" * 20 + ".").early()
    assert d.of(CheckAudioTurn) == [], "the combined policy asks smart-turn after the text score"
    d.decoded("What is the capital of France")
    assert d.kinds(-2) == [PauseTranscript, CheckTextTurn]
    d.frames("." * 6)  # the pause asks for the same silence and text: it waits for that check
    assert d.kinds().count(CheckTextTurn) == 1 and d.kinds()[-1] == AwaitTextTurn
    d.text(0.9)
    assert d.m.state == State.THINKING and len(d.ended) == 1
    assert len(d.of(PauseTranscript)) == 1


def test_on_one_core_the_transcript_is_offered_after_the_verdict():
    d = text_turn(before=False).frames("#" * 20 + ".").early().decoded("What is the capital of")
    assert d.kinds()[-1] == CheckTextTurn and not d.of(PauseTranscript)
    n = len(d.log)
    d.text(1e-6)  # unsure: the turn waits, and smart-turn could still move the wait
    assert d.kinds(n) == [PauseTranscript, CheckAudioTurn]
    assert d.of(PauseTranscript) == [Emit(PauseTranscript("What is the capital of"))]


def test_the_combined_policy_asks_smart_turn_after_an_earlier_silences_check():
    d = text_turn(before=True).frames("#" * 20 + ".").early().decoded("What is the capital of").text(1e-6)
    first = d.audio_checks[0]
    d.frames("####.").early().decoded("What is the capital of France").text(1e-6)
    assert d.kinds()[-1] == AwaitAudioCheck, "the policy waits for this silence's verdict, not the last one's"
    d.audio(0.5)
    second = d.audio_checks[0]
    assert second.t_speech_end > first.t_speech_end


def test_without_a_text_model_the_combined_policy_falls_back():
    d = Driver(text=False, endpointing=CombinedPolicy())
    assert d.m.fell_back_from == "combined" and d.m.policy.name == "rules"
    assert Driver(endpointing=CombinedPolicy()).m.fell_back_from is None


def test_the_end_of_turn_asks_the_final_with_the_early_decodes_until():
    d = Driver(audio=False, endpointing=SilencePolicy()).frames("#" * 20 + ".")
    (queued,) = d.queued
    d.frames("." * 20)
    (ended,) = d.ended
    assert ended == EndTurn(queued.t_speech_end, queued.until)
    assert ended.until < d.m.t_audio - 0.5  # not the audio heard since: the same decode
    # a turn cut at `max_utterance_s` mid-speech: up to the audio heard
    d = Driver(audio=False, endpointing=SilencePolicy(), max_utterance_s=1.0).frames("#" * 40)
    (ended,) = d.ended
    assert near(ended.t_speech_end, d.m.t_audio - 8 * F) and near(ended.until, ended.t_speech_end)


def ended_turn(**config) -> Driver:
    d = Driver(audio=False, endpointing=SilencePolicy(), **config).frames("#" * 20 + "." * 17)
    assert len(d.ended) == 1
    return d


def test_the_final_gives_the_turns_transcript():
    words = (Word("hello", 0.1, 0.4), Word("there", 0.4, 0.6))
    d = ended_turn()
    n = len(d.log)
    assert d.final("hello there", words).since(n) == [Transcript("hello there", words)]
    d = ended_turn()
    n = len(d.log)
    d.final("")  # noise: a turn with no words, and no reply to go back to
    assert d.since(n) == [Transcript("", ()), Emit(StateChange(State.LISTENING))]


def test_an_echo_final_gives_an_empty_transcript():
    d = ended_turn().final("once upon a time", (Word("once", 0.1, 0.3),), echo=True)
    assert d.of(Transcript) == [Transcript("", ())]


def speaking_bot(**config) -> Driver:
    d = ended_turn(**config).final("tell me a story").bot_speaks()
    assert d.m.state == State.BOT_SPEAKING
    return d


def test_speech_over_the_bot_holds_it_and_words_make_it_an_interruption():
    d = speaking_bot()
    n = len(d.log)
    d.frames("###")
    assert d.kinds(n) == [SpokeOver, DropWords, BeginUtterance, UserStarted, StateChange]
    assert near(d.log[n].t_speech_start, d.m.t_audio - 3 * F)
    d.partial("stop stop", "stop stop")  # two words: not yet
    assert UserBargedIn not in d.kinds(n)
    d.partial("stop stop stop it", "stop stop stop", echo=True)  # the bot's own words
    assert UserBargedIn not in d.kinds(n)
    d.partial("stop stop stop it", "stop stop stop")
    assert d.kinds()[-2:] == [UserBargedIn, StateChange] and d.m.state == State.USER_SPEAKING


def test_a_false_interruption_resumes_and_drops_its_words():
    # no words over the bot: the final of that utterance resumes it
    d = speaking_bot().frames("####" + "." * 17)
    assert d.m.state == State.THINKING
    n = len(d.log)
    d.final("")
    assert d.kinds(n) == [DropWords, FalseInterruption, Transcript, StateChange]
    assert d.log[n] == DropWords(d.m.t_audio) and d.log[n + 2] == Transcript("", ())
    # no end of turn before the timeout (rules: smart-turn said "incomplete", 1.5 s): the timeout
    d = Driver(endpointing=RulesPolicy(), false_interruption_s=1.0).frames("#" * 20 + ".").early().audio(0.9)
    d.decoded("tell me a story").frames("." * 7)
    d.final("tell me a story").bot_speaks().frames("####.").looked().early().audio(0.05)
    n = len(d.log)
    d.frames("." * 31)
    assert d.kinds(n)[-3:] == [DropWords, FalseInterruption, StateChange] and d.m.state == State.BOT_SPEAKING
    assert d.since(n)[-3] == DropWords(d.m.t_audio)


def test_the_text_model_reads_ahead_only_while_the_user_speaks_a_turn():
    d = text_turn(before=True).frames("#" * 5)
    n = len(d.log)
    d.partial("what is", "what")
    assert d.kinds(n) == [ReadAhead, HeardPartial] and d.log[n] == ReadAhead("what is")
    d.frames(".")  # the decode goes first
    assert StopReadAhead in d.kinds(n)
    n = len(d.log)
    d.partial("what is the", "what is")
    assert d.kinds(n) == [HeardPartial]
    d = Driver(endpointing=RulesPolicy()).frames("#" * 5)  # no text model asked for: no read-ahead
    n = len(d.log)
    d.partial("what is", "what")
    assert d.kinds(n) == [HeardPartial]


def test_the_state_is_reported_once_per_change():
    d = Driver(audio=False, endpointing=SilencePolicy()).frames("#" * 20 + "." * 17).final("hi")
    d.bot_speaks()
    d.run(d.m.on_reply_finished(d.m.t_audio))
    states = [c.event.state for c in d.of(StateChange)]
    assert states == [State.USER_SPEAKING, State.ENDPOINT_PENDING, State.THINKING, State.BOT_SPEAKING,
                      State.LISTENING]
    assert d.m.on_bot_initiated(d.m.t_audio) and list(d.m.report_state()) == [Emit(StateChange(State.THINKING))]
    assert not d.m.on_bot_initiated(d.m.t_audio) and list(d.m.report_state()) == []


def test_speech_resumed_after_a_pause_voids_it():
    d = Driver(audio=False, endpointing=SilencePolicy()).frames("#" * 20 + "." * 8).frames("###")
    assert d.kinds()[-2:] == [UserResumed, StateChange]
    assert [type(c.event) for c in d.log if isinstance(c, Emit)][:3] == [UserStarted, StateChange, UserStopped]


def test_speech_over_the_bot_is_decoded_quick_and_a_turn_of_its_own_is_not():
    """The words over the paused bot cut or resume it as soon as they are known: that decode
    takes no second look when unsure (Whisper's full-window recheck); a turn's own pause does."""
    d = Driver(endpointing=RulesPolicy()).frames("#" * 20 + ".").early().audio(0.9)
    (own,) = d.decoding
    assert not own.quick
    d.decoded("tell me a story").frames("." * 7)
    d.final("tell me a story").bot_speaks().frames("####.")
    assert d.m.turns.overlap_undecided
    d.looked().early().audio(0.05)
    (over,) = d.decoding
    assert over.quick


def test_speech_over_the_bot_is_looked_at_while_it_is_said_one_look_at_a_time():
    """The words so far of speech over the paused bot are decoded as it goes on (a quick look,
    one at a time, each on new audio): a backchannel lets the reply go on before it ends."""
    d = Driver(endpointing=RulesPolicy()).frames("#" * 20 + ".").early().audio(0.9)
    d.decoded("tell me a story").frames("." * 7).final("tell me a story").bot_speaks()
    d.frames("#" * 9)  # 0.29 s over the bot: paused, not looked at yet
    assert d.of(SpokeOver) and not d.of(LookAtOverlap)
    d.frames("#")
    (look,) = d.of(LookAtOverlap)
    assert near(look.until, d.m.t_audio)
    d.frames("###")  # one look at a time
    assert len(d.of(LookAtOverlap)) == 1
    d.run(d.m.on_overlap_look(""))  # nothing heard yet
    d.run(d.m.on_overlap_look_ended())
    d.frames("#")  # the next look, on the audio since
    assert len(d.of(LookAtOverlap)) == 2
    n = len(d.log)
    d.run(d.m.on_overlap_look("Mm-hmm.", echo=False))  # a hum: it goes on
    d.run(d.m.on_overlap_look_ended())
    assert d.since(n) == [Emit(FalseInterruption(words_due=True))]
    d.frames("..")  # silent: no more looks; the decode at the silence is quick, and only confirms
    assert len(d.of(LookAtOverlap)) == 2
    d.early().audio(0.05)
    assert d.decoding[-1].quick
    n = len(d.log)
    d.decoded("Mm-hmm.")
    assert d.kinds(n) == [EndTurn, StateChange] and d.m.state == State.BOT_SPEAKING
    assert len(d.of(FalseInterruption)) == 1 and not d.of(PauseTranscript)[1:]
    d.final("Mm-hmm.")
    assert d.log[-1] == Transcript("", ())
    # the bot's own voice heard back is no words: it stays paused
    d = Driver(endpointing=RulesPolicy()).frames("#" * 20 + ".").early().audio(0.9)
    d.decoded("tell me a story").frames("." * 7).final("tell me a story").bot_speaks().frames("#" * 8)
    n = len(d.log)
    for _ in range(3):
        d.run(d.m.on_overlap_look("Once upon a time", echo=True))
    assert d.since(n) == [] and d.m.turns.overlap_undecided


def test_a_brief_overlap_is_looked_at_as_it_stops_before_its_decode():
    d = Driver(endpointing=RulesPolicy()).frames("#" * 20 + ".").early().audio(0.9)
    d.decoded("tell me a story").frames("." * 7).final("tell me a story").bot_speaks()
    d.frames("#" * 6)  # 0.19 s: too short to be looked at while said
    n = len(d.log)
    d.frames(".")
    (look,) = [c for c in d.since(n) if isinstance(c, (LookAtOverlap, QueueEarlyDecode))]  # the decode waits
    assert isinstance(look, LookAtOverlap)
    n = len(d.log)
    d.run(d.m.on_overlap_look("Yeah."))
    d.run(d.m.on_overlap_look_ended())
    assert d.kinds(n) == [EndTurn, FalseInterruption, StateChange, QueueEarlyDecode] and d.m.state == State.BOT_SPEAKING
    assert near(d.log[-1].until, look.until)
    # a quiet frame inside the word ended the silence: the user speaks again, and no decode is queued
    d = Driver(endpointing=RulesPolicy()).frames("#" * 20 + ".").early().audio(0.9)
    d.decoded("tell me a story").frames("." * 7).final("tell me a story").bot_speaks()
    d.frames("#" * 6 + "." + "###")
    n = len(d.log)
    d.run(d.m.on_overlap_look("Go"))
    d.run(d.m.on_overlap_look_ended())
    assert not [c for c in d.since(n) if isinstance(c, QueueEarlyDecode)]
    # a turn of the user's own is not looked at
    d = Driver(endpointing=RulesPolicy()).frames("#" * 20 + ".")
    assert not d.of(LookAtOverlap)



def test_after_a_look_that_heard_nothing_the_decode_at_the_silence_goes_first():
    """A look at the silence would hear the same sound as the look just before it (Whisper hears
    "Uh-huh." as nothing), and nothing heard decides nothing: the decode is queued at once."""
    def over_the_bot(heard: str, frames_after: int) -> list:
        d = Driver(endpointing=RulesPolicy()).frames("#" * 20 + ".").early().audio(0.9)
        d.decoded("tell me a story").frames("." * 7).final("tell me a story").bot_speaks()
        d.frames("#" * 10)  # 0.32 s: looked at
        d.run(d.m.on_overlap_look(heard))
        d.run(d.m.on_overlap_look_ended())
        d.frames("#" * frames_after)
        n = len(d.log)
        d.frames(".")
        return [type(c) for c in d.since(n) if isinstance(c, (LookAtOverlap, QueueEarlyDecode))]

    assert over_the_bot("", 2) == [QueueEarlyDecode]
    # words heard: the look goes first
    assert over_the_bot("the what", 2) == [LookAtOverlap]
    # the speech went on past the next look's worth of audio, and that look runs: the decode waits for it
    assert over_the_bot("", 5) == []

def test_words_that_cut_the_reply_at_a_silence_are_judged_as_the_end_of_a_turn():
    """The decode at the silence after "Wait, what is the capital of France?" cuts the reply;
    the same silence then ends the turn as any other (no waiting for the longest wait)."""
    d = Driver(endpointing=RulesPolicy()).frames("#" * 20 + ".").early().audio(0.9)
    d.decoded("tell me a story").frames("." * 7).final("tell me a story").bot_speaks()
    d.frames("#" * 60 + ".").looked("Wait, what is the capital").early().audio(0.9)
    n = len(d.log)
    d.decoded("Wait, what is the capital of France?")
    assert d.kinds(n)[:2] == [UserBargedIn, StateChange]
    assert PauseTranscript in d.kinds(n), "the interruption's words are offered to speculate on"
    d.frames("." * 7)
    assert d.ended, "the turn ended at the pause, on smart-turn's verdict"
    # the combined policy asks the text turn model about them
    d = Driver(endpointing=CombinedPolicy()).frames("#" * 20 + ".").early().decoded("tell me a story").text(0.9)
    d.frames("." * 7).final("tell me a story").bot_speaks()
    d.frames("#" * 60 + ".").looked("Wait, what is the capital").early()
    n = len(d.log)
    d.decoded("Wait, what is the capital of France?")
    assert d.kinds(n)[:2] == [UserBargedIn, StateChange] and CheckTextTurn in d.kinds(n)
    # "Hold on," alone at a comma's pause: cut, but no verdict on it (the user goes on)
    d = Driver(endpointing=CombinedPolicy()).frames("#" * 20 + ".").early().decoded("tell me a story").text(0.9)
    d.frames("." * 7).final("tell me a story").bot_speaks()
    d.frames("#" * 14 + ".").looked("Hold on").early()
    n = len(d.log)
    d.decoded("Hold on.")
    assert UserBargedIn in d.kinds(n) and CheckTextTurn not in d.kinds(n) and PauseTranscript not in d.kinds(n)
    d.frames("." * 11)  # Piper's comma pause runs to 0.38 s: the pause comes, and still no verdict
    assert CheckTextTurn not in d.kinds(n) and PauseTranscript not in d.kinds(n) and not d.ended
    d.frames("#" * 20 + ".")  # "... what is the opposite of hot?": one turn with its lead words
    assert not d.ended
    # said alone, "Hold on." ends its turn after the policy's longest wait (1.5 s)
    d = Driver(endpointing=CombinedPolicy()).frames("#" * 20 + ".").early().decoded("tell me a story").text(0.9)
    d.frames("." * 7).final("tell me a story").bot_speaks()
    d.frames("#" * 14 + ".").looked("Hold on").early().decoded("Hold on.")
    d.frames("." * 44)
    assert not d.ended
    d.frames("." * 3)
    assert d.ended
