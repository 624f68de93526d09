"""The turn state machine, driven by synthetic VAD frames and model verdicts (no models).
Each test asserts the exact transitions and the commands emitted."""
from agent.conversation.endpointing import CombinedPolicy, Features, RulesPolicy, SilencePolicy, SmartTurnPolicy, policy_named
from agent.conversation.turns import (
    CancelReply, DiscardTranscript, EndOfTurn, PauseReply, ResumeReply, SpeechPaused, SpeechResumed, SpeechStopped, StartUtterance, State, TurnConfig, TurnMachine)

F = 0.032
L, U, P, T, B, I = (State.LISTENING, State.USER_SPEAKING, State.ENDPOINT_PENDING, State.THINKING,
                    State.BOT_SPEAKING, State.INTERRUPTED)


class Driver:
    def __init__(self, **config):
        # the rules unless told: most of these tests are theirs (the combined policy's below)
        self.m = TurnMachine(TurnConfig(**{"endpointing": RulesPolicy(), **config}))
        self.t = 0.0
        self.log: list = []

    def frames(self, pattern: str, level: float | None = None):
        """'#' speech, '.' silence: one 32 ms VAD frame each; `level`: the speech frames' RMS.
        '~' then '-': speech 12 and 26 dB below `level` (a syllable's end drawn out by a room's
        reverberation), '_': speech 30 dB below it (the same gap said into the microphone), ',':
        silence to Silero 32 dB below it (the room's tail after the last word). With a `level`,
        each frame's two level steps (`turned_away.STEP_S`) are its level."""
        for ch in pattern:
            self.t = round(self.t + F, 6)
            speech = ch in "#~-_"
            lv = 0.001 if ch == "." or level is None else level * {"#": 1.0, "~": 0.25, "-": 0.05, "_": 0.03, ",": 1 / 40}[ch]
            steps = () if level is None else (lv, lv)
            self.log += self.m.on_vad(self.t, 0.9 if speech else 0.05, F, level if ch == "#" else lv, steps)
        return self

    def eou(self, p):
        self.log += self.m.on_eou(self.t, p)
        return self

    def kinds(self):
        return [type(c) for c in self.log]

    def states(self):
        return [s for _, _, s in self.m.transitions]


def test_normal_turn_ends_on_the_turn_model():
    d = Driver().frames("...." + "#" * 30 + "." * 7)
    assert d.kinds() == [StartUtterance, SpeechStopped, SpeechPaused]
    assert abs(d.log[0].t_start - 4 * F) < 1e-6 and abs(d.log[1].t_speech_end - 34 * F) < 1e-6
    assert d.m.state == P
    d.eou(0.93)
    assert d.kinds() == [StartUtterance, SpeechStopped, SpeechPaused, EndOfTurn]
    assert abs(d.log[2].t_speech_end - 34 * F) < 1e-6
    d.m.on_reply_started(d.t)
    d.m.on_reply_finished(d.t + 1)
    assert d.states() == [U, P, T, B, L]


def test_early_speculative_hit_no_resume_between_pause_and_end():
    # the pause that starts speculation is followed by the endpoint, with nothing in between
    d = Driver().frames("#" * 20 + "." * 10).eou(0.8).frames("." * 10)
    assert d.kinds() == [StartUtterance, SpeechStopped, SpeechPaused, EndOfTurn]
    assert d.states() == [U, P, T]


def test_speculative_miss_when_the_user_goes_on():
    d = Driver().frames("#" * 20 + "." * 8)
    assert d.kinds() == [StartUtterance, SpeechStopped, SpeechPaused]
    d.frames("#" * 15)  # the transcript changes after speculation started
    assert d.kinds() == [StartUtterance, SpeechStopped, SpeechPaused, SpeechResumed]
    assert d.m.state == U
    d.frames("." * 8).eou(0.9)
    assert d.kinds() == [StartUtterance, SpeechStopped, SpeechPaused, SpeechResumed, SpeechStopped, SpeechPaused, EndOfTurn]
    assert d.states() == [U, P, U, P, T]


def test_incomplete_verdict_waits_for_the_silence_timeout():
    d = Driver(endpointing=RulesPolicy(max_silence_s=1.0)).frames("#" * 20 + "." * 8).eou(0.1)
    assert d.kinds() == [StartUtterance, SpeechStopped, SpeechPaused] and d.m.state == P
    d.frames("." * 20)  # 28 frames of silence = 0.9 s: still waiting
    assert d.m.state == P
    d.frames("." * 4)
    assert d.kinds() == [StartUtterance, SpeechStopped, SpeechPaused, EndOfTurn] and d.m.state == T


def test_without_a_turn_model_silence_alone_ends_the_turn():
    d = Driver(endpointing=SilencePolicy()).frames("#" * 20 + "." * 15)
    assert d.kinds() == [StartUtterance, SpeechStopped, SpeechPaused] and d.m.state == P
    d.frames("." * 2)  # 17 frames = 0.54 s >= 0.5 s
    assert d.kinds() == [StartUtterance, SpeechStopped, SpeechPaused, EndOfTurn]


def test_barge_in_during_bot_speech_needs_min_speech_then_words_make_it_real():
    d = Driver().frames("#" * 20 + "." * 8).eou(0.9)
    d.m.on_reply_started(d.t)
    d.frames("#" * 2 + "." * 5)  # 64 ms: a click (three frames, 96 ms, are speech)
    assert d.m.state == B and d.kinds() == [StartUtterance, SpeechStopped, SpeechPaused, EndOfTurn]
    d.frames("#" * 10)
    assert d.kinds()[4:] == [PauseReply, StartUtterance]
    assert d.m.state == I
    d.log += d.m.on_words(d.t, "stop that now")  # the recognizer heard words: a real interruption
    assert d.kinds()[-1] == CancelReply and d.m.state == U
    d.frames("#" * 80)  # well past the false-interruption timeout: no resume
    assert ResumeReply not in d.kinds()
    assert d.states() == [U, P, T, B, I, U]


def test_false_interruption_resumes_after_the_timeout():
    # a timeout shorter than the end of turn's wait (1.5 s), so that it decides, not the final
    d = Driver(false_interruption_s=1.0).frames("#" * 20 + "." * 8).eou(0.9)
    d.m.on_reply_started(d.t)
    d.frames("#" * 12)  # noise that VAD takes for speech
    assert d.kinds()[-2:] == [PauseReply, StartUtterance]
    d.frames("#" * 20)
    speech_end = d.t
    d.frames("." * 50)  # no words recognised...
    assert ResumeReply in d.kinds()
    resume = next(c for c in d.log if isinstance(c, ResumeReply))
    assert abs(resume.t - speech_end - 1.0) < 2 * F  # counted from the end of the speech
    assert d.m.state == B
    assert d.states() == [U, P, T, B, I, P, B]


def test_false_interruption_resumes_when_the_utterance_has_no_words():
    d = Driver().frames("#" * 20 + "." * 8).eou(0.9)
    d.m.on_reply_started(d.t)
    d.log += d.m.on_final(d.t, "what is it")  # the first turn's words
    d.frames("#" * 30 + "." * 8).eou(0.9)  # a noise (longer than a brief overlap), then the turn ends
    assert d.kinds()[-4:] == [StartUtterance, SpeechStopped, SpeechPaused, EndOfTurn]
    d.log += d.m.on_final(d.t, "")
    assert d.kinds()[-2:] == [DiscardTranscript, ResumeReply] and d.m.state == B


def speaking_bot(user_level: float | None = 0.3) -> Driver:
    """A user turn at `user_level` (None: no turn of theirs yet, as under a greeting), answered;
    the bot is speaking."""
    d = Driver()
    if user_level is not None:
        d.frames("#" * 20 + "." * 8, level=user_level).eou(0.9)
        d.log += d.m.on_final(d.t, "tell me a story")
    else:
        assert d.m.on_bot_initiated(d.t)
    d.m.on_reply_started(d.t)
    assert d.m.state == B
    return d


def test_speech_over_the_bot_far_quieter_than_the_user_neither_pauses_nor_interrupts_it():
    d = speaking_bot(user_level=0.3)
    n = len(d.log)
    # a burst 20 dB below the user's turn: the bot's voice through the canceller, a TV, a voice
    # across the room
    d.frames("#" * 30 + "." * 8, level=0.03).eou(0.9)
    assert d.kinds()[n:] == [] and d.m.state == B, "the bot was not even paused"
    # the user at their own level, over the bot: a real interruption
    d.frames("#" * 8 + "." * 8, level=0.2).eou(0.9)
    d.log += d.m.on_final(d.t, "Stop.")
    assert d.kinds()[-1] == CancelReply and d.m.state == T


def test_a_quiet_voice_that_talked_over_the_bot_and_goes_on_after_it_is_no_turn():
    # a TV 20 dB below the user goes on talking after the story ends: a person would not answer it
    d = speaking_bot(user_level=0.3)
    n = len(d.log)
    d.frames("#" * 20, level=0.03)
    d.m.on_reply_finished(d.t)
    d.frames("#" * 30 + "." * 20 + "#" * 30 + "." * 8, level=0.03)  # a breath between its sentences
    assert d.kinds()[n:] == [] and d.m.state == L
    d.frames("#" * 5, level=0.25)  # the user, at their own level, over it
    assert d.kinds()[n:] == [StartUtterance] and d.m.state == U
    # one that begins once it has been quiet a while is heard as it is today
    d = speaking_bot(user_level=0.3)
    d.m.on_reply_finished(d.t)
    d.frames("#" * 20, level=0.03)
    assert d.kinds()[-1] == StartUtterance, "no voice was held back: it may be the user's"
    d = speaking_bot(user_level=0.3)
    d.frames("#" * 20, level=0.03)
    d.m.on_reply_finished(d.t)
    d.frames("." * 70 + "#" * 10, level=0.03)  # 2.2 s later
    assert d.kinds()[-1] == StartUtterance
    # today's behaviour is one setting away
    d = speaking_bot(user_level=0.3)
    d.m.config.quiet_voice_carry_s = None
    d.frames("#" * 20, level=0.03)
    d.m.on_reply_finished(d.t)
    d.frames("#" * 10, level=0.03)
    assert d.kinds()[-1] == StartUtterance


def test_quiet_speech_that_grows_to_the_users_level_pauses_the_bot_then_and_its_words_interrupt():
    d = speaking_bot(user_level=0.3)
    n = len(d.log)
    d.frames("#" * 10, level=0.03)
    assert d.kinds()[n:] == [] and d.m.state == B
    d.frames("#" * 3, level=0.25)  # the user's own voice follows
    assert d.kinds()[n:] == [PauseReply, StartUtterance] and d.m.state == I
    d.log += d.m.on_words(d.t, "once upon a time")
    assert d.kinds()[-1] == CancelReply


def test_a_backchannel_word_over_the_bot_lets_it_go_on_and_a_real_one_stops_it():
    # (longer than a brief overlap, after which the reply goes on before the words: test_barge_in)
    for said in ("Yeah.", "Okay.", "Right, right.", "Uh-huh, yeah."):
        d = speaking_bot(user_level=0.3)
        d.frames("#" * 30 + "." * 8, level=0.3).eou(0.9)
        d.log += d.m.on_final(d.t, said)
        assert d.kinds()[-2:] == [DiscardTranscript, ResumeReply] and d.m.state == B, said
    d = speaking_bot(user_level=0.3)
    d.frames("#" * 30 + "." * 8, level=0.3).eou(0.9)
    d.log += d.m.on_final(d.t, "Okay, stop.")
    assert d.kinds()[-1] == CancelReply
    # today's behaviour is one setting away
    d = speaking_bot(user_level=0.3)
    d.m.config.backchannels = ()
    d.frames("#" * 30 + "." * 8, level=0.3).eou(0.9)
    d.log += d.m.on_final(d.t, "Yeah.")
    assert d.kinds()[-1] == CancelReply


def test_speech_over_the_bot_quieter_and_more_reverberant_than_the_user_is_side_talk():
    # the user turned away from the microphone to ask someone else: 3.5 dB below their turn, the
    # gaps between syllables filled by the room (falls of 12 dB where their turn fell 50 dB)
    d = speaking_bot(user_level=0.3)
    n = len(d.log)
    d.frames("#~-" * 4, level=0.2)  # 0.38 s: paused, not judged yet
    assert d.kinds()[n:] == [PauseReply, StartUtterance] and d.m.overlap_undecided
    d.frames("#", level=0.2)  # 0.4 s: the reply goes on while it is said
    assert d.log[-1] == ResumeReply(d.t, words_due=True) and d.m.going_on
    assert d.m.judged == (-3.5, 0.28, True)  # for the trace: level and fall against the user's
    assert d.m.on_overlap_words(d.t, "Can you close the window") == []  # by words, a request
    assert d.m.on_words(d.t, "Can you close the window") == []
    d.frames("#~-" * 13 + "." * 8, level=0.2).eou(0.9)
    assert d.kinds()[-1] == EndOfTurn and d.m.state == B
    d.log += d.m.on_final(d.t, "Can you close the window? It's getting cold in here.")
    assert d.kinds()[-1] == DiscardTranscript and d.m.state == B, "it was taken for a turn"
    # words that ask the bot to stop or wait are for it, wherever the user faces
    d = speaking_bot(user_level=0.3)
    d.frames("#~-" * 5, level=0.2)
    assert d.m.going_on
    start = next(c for c in d.log if isinstance(c, PauseReply)).t_speech_start
    assert d.m.on_overlap_words(d.t, "Wait, stop") == []
    d.frames("#", level=0.2)
    assert d.m.on_overlap_words(d.t, "Wait, stop the story") == [PauseReply(d.t, start)]
    n = len(d.log)
    d.frames("#~-" * 3, level=0.2)
    assert not any(isinstance(c, ResumeReply) for c in d.log[n:]) and d.m.overlap_undecided, "its sound let it go on again"
    d.frames("." * 8, level=0.2).eou(0.9)
    d.log += d.m.on_final(d.t, "Wait, stop the story.")
    assert d.kinds()[-1] == CancelReply and d.m.state == T


def test_quieter_speech_over_the_bot_that_ends_no_syllable_for_0_6_s_is_side_talk():
    # said away in a room that draws every syllable's end out (falls of 12 dB within 128 ms where
    # the user's turn fell 50 dB): no syllable's end to judge its falls by, and by 0.6 s of it
    # that is itself the room's sign (`TurnedAway.unbroken_s`)
    d = speaking_bot(user_level=0.3)
    n = len(d.log)
    d.frames("#~" * 9, level=0.2)  # 0.58 s
    assert d.kinds()[n:] == [PauseReply, StartUtterance] and d.m.overlap_undecided
    d.frames("#", level=0.2)  # 0.61 s
    assert d.log[-1] == ResumeReply(d.t, words_due=True) and d.m.going_on
    # as quiet, said into the microphone: a syllable ends in a sharp fall, and it stays paused
    d = speaking_bot(user_level=0.3)
    d.frames("#~" * 4 + "#_" + "#~" * 10, level=0.2)
    assert d.m.overlap_undecided and not d.m.going_on
    # ... as does the same unbroken speech at the user's own level
    d = speaking_bot(user_level=0.3)
    d.frames("#~" * 15, level=0.3)
    assert d.m.overlap_undecided and not d.m.going_on


def test_side_talk_stays_no_turn_when_the_reply_ends_while_it_is_said_and_is_judged_at_a_silence():
    # by its sound: the story ends while the user still talks to someone else
    d = speaking_bot(user_level=0.3)
    d.frames("#~-" * 5, level=0.2)
    assert d.m.going_on
    d.m.on_reply_finished(d.t)
    d.frames("#~-" * 13 + "." * 8, level=0.2).eou(0.9)
    assert d.kinds()[-1] == EndOfTurn and d.m.state == T
    d.log += d.m.on_final(d.t, "Can you close the window? It's getting cold in here.")
    assert d.kinds()[-1] == DiscardTranscript and d.m.state == L
    # by a name a look heard (at the user's own level and voice)
    d = speaking_bot(user_level=0.3)
    d.frames("#" * 10, level=0.3)
    assert d.m.on_overlap_words(d.t, "Kids") == [ResumeReply(d.t, words_due=True)]
    d.m.on_reply_finished(d.t)
    d.frames("#" * 30 + "." * 8, level=0.3).eou(0.9)
    d.log += d.m.on_final(d.t, "Kids, it's time to brush your teeth.")
    assert d.kinds()[-1] == DiscardTranscript and d.m.state == L
    # words for the bot begun over it are answered as before when the reply ends meanwhile
    d = speaking_bot(user_level=0.3)
    d.frames("#" * 10, level=0.3)
    d.m.on_reply_finished(d.t)
    d.frames("#" * 30 + "." * 8, level=0.3).eou(0.9)
    d.log += d.m.on_final(d.t, "Can you close the window?")
    assert d.kinds()[-1] == EndOfTurn and d.m.state == T
    # "Hey," then a breath, said away: judged in the room's tail, the reply goes on before the
    # decode at the silence has heard its words
    d = speaking_bot(user_level=0.3)
    d.frames("#~-" * 4, level=0.2)  # 0.38 s of speech
    assert d.m.overlap_undecided
    d.frames(",", level=0.2)  # the room's tail
    assert ResumeReply(d.t, words_due=True) in d.log[-2:] and d.m.going_on
    d.frames(",,", level=0.2)
    t_end = next(c for c in reversed(d.log) if isinstance(c, SpeechStopped)).t_speech_end
    assert d.m.on_early_words(d.t, "Hey.", t_end) == [EndOfTurn(t_end)]
    d.log += d.m.on_final(d.t, "Hey.")
    assert d.kinds()[-1] == DiscardTranscript and d.m.state == B
    # "could you turn the oven off", as quiet, begun 0.2 s later: the user has not turned back,
    # though a consonant at its onset falls as sharply as into the microphone
    d.frames("......" + "#_" * 6 + "#", level=0.2)  # 0.4 s of it
    assert d.log[-1] == ResumeReply(d.t, words_due=True) and d.m.going_on
    d.frames("_#" * 10 + "." * 8, level=0.2).eou(0.9)
    d.log += d.m.on_final(d.t, "Could you turn the oven off for me?")
    assert d.kinds()[-1] == DiscardTranscript and d.m.state == B
    # ... but not 2 s after it (`TurnedAway.carry_s`), nor at the user's level
    for gap, level in ((70, 0.2), (6, 0.3)):
        n = len(d.log)
        d.frames("." * gap + "#_" * 8, level=level)
        assert d.kinds()[n:] == [PauseReply, StartUtterance] and d.m.overlap_undecided, (gap, level)
        d.frames("." * 8, level=level).eou(0.9)
        d.log += d.m.on_final(d.t, "Could you turn the oven off for me?")
        assert d.kinds()[-1] == CancelReply
        d.m.on_reply_started(d.t)
    # "Babe," then a pause long enough for the end of turn to be weighed, then the rest of it:
    # the reply goes on in the pause, 0.4 s from its onset, and on over the rest
    d = speaking_bot(user_level=0.3)
    d.frames("#~-#~-" + "," * 6, level=0.2)
    assert d.m.overlap_undecided
    d.frames(",", level=0.2)
    assert d.m.state == P and ResumeReply(d.t, words_due=True) in d.log[-2:] and d.m.going_on
    d.frames("#~-#", level=0.2)
    assert d.m.state == U and d.m.going_on and not any(isinstance(c, PauseReply) for c in d.log[-4:])



def test_a_backchannel_over_a_reply_that_ends_meanwhile_is_no_turn_unless_the_reply_asked():
    def hum_as_the_reply_ends(asked: bool, final: str):
        d = speaking_bot(user_level=0.3)
        d.frames("#" * 10, level=0.3)
        assert d.m.on_overlap_words(d.t, "Mm-hmm.") == [ResumeReply(d.t, words_due=True)]
        d.m.on_reply_finished(d.t, asked=asked)
        d.frames("#" * 10 + "." * 8, level=0.3).eou(0.9)
        assert d.kinds()[-1] == EndOfTurn and d.m.state == T
        d.log += d.m.on_final(d.t, final)
        return d

    # "Mm-hmm." as the story ends: acknowledged, not answered
    d = hum_as_the_reply_ends(asked=False, final="Mm-hmm.")
    assert d.kinds()[-1] == DiscardTranscript and d.m.state == L
    # "... Shall I go on?" with "Yeah." over its end: an answer, and answered
    d = hum_as_the_reply_ends(asked=True, final="Yeah.")
    assert d.kinds()[-1] == EndOfTurn and d.m.state == T
    # words after it are a turn, asked or not
    d = hum_as_the_reply_ends(asked=False, final="Mm-hmm, and then what?")
    assert d.kinds()[-1] == EndOfTurn and d.m.state == T

def test_a_name_a_look_heard_in_quieter_speech_keeps_it_side_talk_when_the_decodes_lose_it():
    # rms's "Kids, it's time to brush your teeth." 4.7 dB below the user, its sound not judged
    # away: the first look heard "kids", the next ones and the final did not
    d = speaking_bot(user_level=0.3)
    d.frames("#" * 10, level=0.18)
    assert d.m.overlap_undecided
    assert d.m.on_overlap_words(d.t, "kids") == [ResumeReply(d.t, words_due=True)]
    assert d.m.on_overlap_words(d.t, "Can this video") == []
    d.frames("#", level=0.18)
    assert d.m.on_overlap_words(d.t, "Can this video? Can this") == [] and d.m.going_on
    d.frames("#" * 30 + "." * 8, level=0.18).eou(0.9)
    d.log += d.m.on_final(d.t, "It's time to brush your teeth.")
    assert d.kinds()[-1] == DiscardTranscript and d.m.state == B
    # words that ask the bot to stop still pause it
    d = speaking_bot(user_level=0.3)
    d.frames("#" * 10, level=0.18)
    start = d.log[-2].t_speech_start
    d.m.on_overlap_words(d.t, "Kids")
    d.frames("#", level=0.18)
    assert d.m.on_overlap_words(d.t, "Kids, stop") == []
    d.frames("#", level=0.18)
    assert d.m.on_overlap_words(d.t, "Kids, stop the story") == [PauseReply(d.t, start)]
    # at the user's own level a misheard name ("Harry" for "Sorry") holds nothing
    d = speaking_bot(user_level=0.3)
    d.frames("#" * 10, level=0.3)
    start = d.log[-2].t_speech_start
    assert d.m.on_overlap_words(d.t, "Harry") == [ResumeReply(d.t, words_due=True)]
    d.frames("#", level=0.3)
    assert d.m.on_overlap_words(d.t, "Sorry, what animal") == []
    d.frames("#", level=0.3)
    assert d.m.on_overlap_words(d.t, "Sorry, what animal says") == [PauseReply(d.t, start)]
    d.frames("#" * 20 + "." * 8, level=0.3).eou(0.9)
    d.log += d.m.on_final(d.t, "Sorry, what animal says moo?")
    assert d.kinds()[-1] == CancelReply


def test_quiet_dry_or_reverberant_loud_speech_over_the_bot_is_the_users():
    for level, said in ((0.2, "#_" * 7), (0.3, "#~-" * 5)):  # quieter but said into the mic; as loud as the user
        d = speaking_bot(user_level=0.3)
        n = len(d.log)
        d.frames(said + "#" * 10, level=level)
        assert d.kinds()[n:] == [PauseReply, StartUtterance] and d.m.overlap_undecided, said
        d.frames("." * 8, level=level).eou(0.9)
        d.log += d.m.on_final(d.t, "Can you close the window?")
        assert d.kinds()[-1] == CancelReply, said
    # nothing to compare with (a greeting), or the judgement off: the bot waits for the words
    for d in (speaking_bot(user_level=None), Driver(turned_away=None)):
        if d.m.state != B:
            d.frames("#" * 20 + "." * 8, level=0.3).eou(0.9)
            d.log += d.m.on_final(d.t, "tell me a story")
            d.m.on_reply_started(d.t)
        n = len(d.log)
        d.frames("#~-" * 8, level=0.2)
        assert d.kinds()[n:] == [PauseReply, StartUtterance] and d.m.overlap_undecided


def test_without_a_turn_of_the_users_any_words_over_the_bot_interrupt():
    d = speaking_bot(user_level=None)  # a greeting: nothing to compare with
    d.frames("#" * 8 + "." * 8, level=0.01).eou(0.9)
    d.log += d.m.on_final(d.t, "Hello?")
    assert d.kinds()[-1] == CancelReply
    # and with the gate off, quiet words after a loud turn interrupt too
    d = Driver(echo_level_db=None)
    d.frames("#" * 20 + "." * 8, level=0.3).eou(0.9)
    d.log += d.m.on_final(d.t, "tell me a story")
    d.m.on_reply_started(d.t)
    d.frames("#" * 8 + "." * 8, level=0.03).eou(0.9)
    d.log += d.m.on_final(d.t, "I talk.")
    assert d.kinds()[-1] == CancelReply


def test_empty_transcript_without_interruption_returns_to_listening():
    d = Driver().frames("#" * 20 + "." * 8).eou(0.9)
    d.log += d.m.on_final(d.t, "")
    assert d.m.state == L and ResumeReply not in d.kinds()


def test_rapid_successive_turns():
    d = Driver()
    for _ in range(3):
        d.frames("#" * 12 + "." * 7).eou(0.9)
        d.m.on_reply_started(d.t)
        d.m.on_reply_finished(d.t)
        d.frames("..")
    assert d.kinds() == [StartUtterance, SpeechStopped, SpeechPaused, EndOfTurn] * 3
    assert d.states() == [U, P, T, B, L] * 3
    # the user talking while the bot is still thinking barges in too
    d.frames("#" * 12 + "." * 7).eou(0.9).frames("#" * 10)
    assert d.kinds()[-2:] == [PauseReply, StartUtterance] and d.m.state == I


def test_short_blip_is_not_speech():
    d = Driver().frames("..#..#..")
    assert d.log == [] and d.m.state == L


def test_max_utterance_forces_endpoint_once():
    d = Driver(max_utterance_s=1.0).frames("#" * 34)
    assert d.kinds() == [StartUtterance, EndOfTurn] and d.m.state == T
    d.frames("#" * 20)  # the user keeps talking: one interruption, a new utterance
    assert d.kinds() == [StartUtterance, EndOfTurn, PauseReply, StartUtterance]


def test_a_complete_sentence_ends_the_turn_after_the_short_silence():
    d = Driver(endpointing=RulesPolicy(max_silence_s=1.5, sentence_silence_s=0.5)).frames("#" * 20 + "." * 8).eou(0.1)
    d.log += d.m.on_transcript(d.t, complete=True)  # too early: only 0.26 s of silence
    assert d.m.state == P
    d.frames("." * 8)  # 16 frames = 0.51 s
    assert d.kinds() == [StartUtterance, SpeechStopped, SpeechPaused, EndOfTurn]
    d2 = Driver(endpointing=RulesPolicy(max_silence_s=1.5)).frames("#" * 20 + "." * 8).eou(0.1)
    d2.log += d2.m.on_transcript(d2.t, complete=False)
    d2.frames("." * 16)
    assert d2.m.state == P  # an unfinished sentence waits for the long timeout


def test_decode_starts_at_the_first_silent_frame_and_going_on_resumes():
    # one silent frame asks for a decode (once per silence); the pause itself comes at 0.2 s
    d = Driver().frames("#" * 20)
    assert d.kinds() == [StartUtterance]
    d.frames(".")
    assert d.kinds() == [StartUtterance, SpeechStopped] and d.m.state == U
    assert abs(d.log[1].t_speech_end - 20 * F) < 1e-6
    d.frames("...")  # still the same silence: nothing new
    assert d.kinds() == [StartUtterance, SpeechStopped]
    d.frames("##")  # 2 frames < min_speech_s (three): not yet "going on"
    assert d.kinds() == [StartUtterance, SpeechStopped]
    d.frames("#")  # the user went on before the pause: the speculation on that silence goes
    assert d.kinds() == [StartUtterance, SpeechStopped, SpeechResumed] and d.m.state == U
    d.frames("###.")  # a new silence, a new decode
    assert d.kinds() == [StartUtterance, SpeechStopped, SpeechResumed, SpeechStopped]
    assert abs(d.log[3].t_speech_end - 30 * F) < 1e-6
    d.frames("......")
    assert d.kinds() == [StartUtterance, SpeechStopped, SpeechResumed, SpeechStopped, SpeechPaused]
    assert d.log[4].t_speech_end == d.log[3].t_speech_end and d.states() == [U, P]


def test_a_blip_in_a_silence_neither_resumes_nor_asks_twice_for_the_same_silence():
    d = Driver().frames("#" * 20 + "..." + "#" + "....")  # one speech frame: not speech going on
    assert d.kinds() == [StartUtterance, SpeechStopped, SpeechStopped]  # the blip split the silence
    assert d.log[2].t_speech_end > d.log[1].t_speech_end


def test_a_verdict_before_the_pause_ends_the_turn_when_the_pause_comes():
    # the session asks the turn model at SpeechStopped (0.1 s); the verdict is kept until the
    # pause (0.2 s) and then ends the turn at once
    d = Driver().frames("#" * 20 + "....").eou(0.9)
    assert d.kinds() == [StartUtterance, SpeechStopped] and d.m.state == U
    d.frames("..")
    assert d.kinds() == [StartUtterance, SpeechStopped] and d.m.state == U
    d.frames(".")  # 7 frames = 0.224 s: the pause, and the kept verdict ends the turn
    assert d.kinds() == [StartUtterance, SpeechStopped, SpeechPaused, EndOfTurn]
    assert abs(d.log[3].t_speech_end - 20 * F) < 1e-6 and d.states() == [U, P, T]


def test_an_early_verdict_is_dropped_when_the_user_goes_on():
    d = Driver().frames("#" * 20 + "....").eou(0.9).frames("#" * 6 + "." * 7)
    assert d.kinds() == [StartUtterance, SpeechStopped, SpeechResumed, SpeechStopped, SpeechPaused]
    assert d.m.state == P
    d.eou(0.2)  # the verdict on the new silence: incomplete, so the turn goes on waiting
    assert d.m.state == P
    # an "incomplete" early verdict does not end the turn at the pause either
    d2 = Driver().frames("#" * 20 + "....").eou(0.2).frames("...")
    assert d2.kinds() == [StartUtterance, SpeechStopped, SpeechPaused] and d2.m.state == P


def test_a_late_verdict_on_an_earlier_silence_is_ignored():
    # asked about the first silence; the user went on and stopped again before it came back
    d = Driver().frames("#" * 20 + ".")
    first = d.log[-1].t_speech_end
    d.frames("#" * 6 + ".")
    second = d.log[-1].t_speech_end
    assert second > first
    d.log += d.m.on_eou(d.t, 0.95, first)  # stale: not kept for this silence
    d.frames("......")
    assert d.kinds() == [StartUtterance, SpeechStopped, SpeechResumed, SpeechStopped, SpeechPaused]
    assert d.m.state == P
    d.log += d.m.on_eou(d.t, 0.95, second)  # the verdict on this silence ends the turn
    assert d.kinds()[-1] == EndOfTurn and d.m.state == T


def test_a_blip_during_the_pause_does_not_void_the_verdict():
    d = Driver().frames("#" * 20 + ".......")
    asked = d.log[-1].t_speech_end  # SpeechPaused: the session asks about this silence
    assert d.kinds() == [StartUtterance, SpeechStopped, SpeechPaused] and d.m.state == P
    d.frames("#.")  # one frame of noise: not speech (min_speech_s), the pause goes on
    assert d.m.state == P
    d.log += d.m.on_eou(d.t, 0.9, asked)
    assert d.kinds() == [StartUtterance, SpeechStopped, SpeechPaused, EndOfTurn]


# ---- the early-decode hint: a quiet frame while Silero still says speech ----------------------
def _frames_with_levels(d: Driver, frames: list[tuple[float, float]]) -> Driver:
    """(Silero probability, frame RMS) per 32 ms frame."""
    for prob, level in frames:
        d.t = round(d.t + F, 6)
        d.log += d.m.on_vad(d.t, prob, F, level)
    return d


LOUD, QUIET = (0.999, 0.1), (0.8, 0.001)  # QUIET: 40 dB below the loud frames, Silero falling
SILENT = (0.05, 0.0005)


def test_a_quiet_frame_starts_the_early_decode_a_frame_before_silero_but_not_the_pause():
    d = _frames_with_levels(Driver(), [SILENT] * 4 + [LOUD] * 30 + [QUIET] + [SILENT] * 6)
    assert d.kinds() == [StartUtterance, SpeechStopped]
    stop = d.log[1]
    # the speech ended where the quiet frame began; the decode is asked for right after it
    assert abs(stop.t_speech_end - 34 * F) < 1e-6
    assert d.m.state == U  # the pause counts Silero's silence only: 6 frames < 0.2 s
    _frames_with_levels(d, [SILENT]).eou(0.9)
    assert d.kinds() == [StartUtterance, SpeechStopped, SpeechPaused, EndOfTurn]
    assert d.log[2].t_speech_end == d.log[3].t_speech_end == stop.t_speech_end  # one silence
    # without the level, the same probabilities stop one frame later
    plain = Driver().frames("...." + "#" * 31 + "." * 7)
    assert plain.kinds()[:2] == [StartUtterance, SpeechStopped]
    assert abs(plain.log[1].t_speech_end - 35 * F) < 1e-6


def test_a_quiet_frame_does_not_count_while_silero_is_sure_or_when_the_hint_is_off():
    sure = _frames_with_levels(Driver(), [LOUD] * 30 + [(0.99, 0.001)] + [LOUD] * 10)
    assert sure.kinds() == [StartUtterance]
    off = _frames_with_levels(Driver(quiet_db=None), [LOUD] * 30 + [QUIET] + [LOUD] * 10)
    assert off.kinds() == [StartUtterance]
    # a frame only 20 dB down is not quiet at -35 dB
    mild = _frames_with_levels(Driver(), [LOUD] * 30 + [(0.8, 0.01)] + [LOUD] * 10)
    assert mild.kinds() == [StartUtterance]


def test_speech_after_a_quiet_frame_resumes_the_utterance():
    d = _frames_with_levels(Driver(), [LOUD] * 30 + [QUIET] + [LOUD] * 2)
    assert d.kinds() == [StartUtterance, SpeechStopped]
    _frames_with_levels(d, [LOUD] * 2)  # 4 loud frames >= min_speech_s: they went on
    assert d.kinds() == [StartUtterance, SpeechStopped, SpeechResumed]
    _frames_with_levels(d, [LOUD] * 10 + [SILENT] * 8).eou(0.9)
    assert d.kinds() == [StartUtterance, SpeechStopped, SpeechResumed, SpeechStopped, SpeechPaused, EndOfTurn]
    assert d.states() == [U, P, T]


def test_a_verdict_asked_at_the_quiet_frame_is_kept_for_the_pause():
    d = _frames_with_levels(Driver(), [LOUD] * 30 + [QUIET]).eou(0.9)  # Silero: still speech
    assert d.kinds() == [StartUtterance, SpeechStopped]
    _frames_with_levels(d, [SILENT] * 7)
    assert d.kinds() == [StartUtterance, SpeechStopped, SpeechPaused, EndOfTurn]


def test_a_greeting_is_a_reply_the_user_can_talk_over():
    d = Driver().frames("...")
    assert d.m.on_bot_initiated(d.t) and d.m.state == T
    d.m.on_reply_started(d.t)
    d.frames("#" * 2 + ".")  # a click: the greeting goes on
    assert d.m.state == B and d.kinds() == []
    d.frames("#" * 5)
    assert d.kinds() == [PauseReply, StartUtterance] and d.m.state == I
    assert d.states() == [T, B, I]


def test_no_greeting_once_the_user_is_speaking():
    d = Driver().frames("#" * 5)
    assert d.m.state == U
    assert not d.m.on_bot_initiated(d.t) and d.m.state == U
    d.m.on_reply_finished(d.t)
    assert d.m.state == U


# ---- the end-of-turn policies other than today's rules (agent/conversation/endpointing.py) ----------------
def _combined(**kw):
    return Driver(endpointing=CombinedPolicy(**kw))


def test_combined_ends_before_the_pause_when_both_models_say_done():
    d = _combined(min_wait_s=0.1).frames("#" * 20 + ".").eou(0.9)
    assert d.kinds() == [StartUtterance, SpeechStopped]  # one frame of silence: not yet 0.1 s
    d.log += d.m.on_transcript(d.t, True, 0.9)
    d.frames("...")  # 4 frames = 0.128 s >= 0.1 s: pause confirmed and the turn ended together
    assert d.kinds() == [StartUtterance, SpeechStopped, SpeechPaused, EndOfTurn]
    assert abs(d.log[-1].t_speech_end - 20 * F) < 1e-6 and d.states() == [U, P, T]


def test_combined_waits_long_on_a_fragment_whatever_the_audio_says():
    d = _combined(max_wait_s=1.5).frames("#" * 20 + "..").eou(0.95)
    d.log += d.m.on_transcript(d.t, False, 1e-9)  # "what is the capital of": the text says no
    d.frames("." * 30)  # ~1 s of silence: still waiting
    assert d.m.state == P and EndOfTurn not in d.kinds()
    d.frames("." * 16)
    assert d.kinds()[-1] == EndOfTurn


def test_combined_forgets_a_silence_s_verdicts_when_the_user_goes_on():
    d = _combined().frames("#" * 20 + "..").eou(0.99)
    d.log += d.m.on_transcript(d.t, True, 0.99)  # not yet 0.1 s of Silero silence
    d.frames("#" * 6)  # they went on
    assert d.kinds() == [StartUtterance, SpeechStopped, SpeechResumed]
    d.frames("." * 7)  # the new silence has no verdicts: the pause, then the long wait
    assert d.kinds()[-2:] == [SpeechStopped, SpeechPaused] and d.m.state == P


def test_a_late_verdict_on_an_earlier_silence_does_not_count_for_combined():
    d = _combined().frames("#" * 20 + "." + "#" * 6 + ".")
    first = d.log[1].t_speech_end
    d.log += d.m.on_eou(d.t, 0.99, first)
    d.log += d.m.on_transcript(d.t, True, 0.99, first)
    d.frames("....")
    assert EndOfTurn not in d.kinds()


def test_combined_waits_for_smart_turn_only_when_the_text_leaves_the_wait_open():
    d = _combined(min_wait_s=0.1).frames("#" * 20 + "....")
    assert not d.m.policy.audio_first and not d.m.wants_audio_verdict()  # nothing known: the text decides first
    d.log += d.m.on_transcript(d.t, True, 0.999)  # decided by the text alone: ended, no smart-turn
    assert d.kinds()[-1] == EndOfTurn
    fence = _combined(min_wait_s=0.1).frames("#" * 20 + "....")
    fence.log += fence.m.on_transcript(fence.t, False, 1e-6)  # on the fence: P(done) 0.64 on the text alone
    assert fence.m.wants_audio_verdict() and EndOfTurn not in fence.kinds()
    fence.frames("." * 10)
    assert fence.m.state == P  # waiting for smart-turn, not ending on the text
    fence.eou(0.05)  # "not done": the long wait, now with both verdicts
    assert not fence.m.wants_audio_verdict() and EndOfTurn not in fence.kinds()
    assert Driver().m.policy.audio_first and Driver().m.wants_audio_verdict()  # "rules" asks it at every silence


def test_smart_turn_alone_ignores_the_punctuation_rule():
    d = Driver(endpointing=SmartTurnPolicy(max_silence_s=1.5)).frames("#" * 20 + "." * 8).eou(0.1)
    d.log += d.m.on_transcript(d.t, complete=True)
    d.frames("." * 16)  # 0.77 s: today's rules would have ended it at 0.5 s
    assert d.m.state == P
    d.frames("." * 24)
    assert d.kinds()[-1] == EndOfTurn
    d2 = Driver(endpointing=SmartTurnPolicy()).frames("#" * 20 + "....").eou(0.9).frames("...")
    assert d2.kinds() == [StartUtterance, SpeechStopped, SpeechPaused, EndOfTurn]  # at the pause


def test_an_unknown_policy_is_refused():
    import pytest

    with pytest.raises(ValueError):
        policy_named("magic")
    with pytest.raises(ValueError):
        policy_named("combined", silence_s=0.3)  # the combined policy has no fixed silence
    assert policy_named("rules", 0.7) == RulesPolicy(sentence_silence_s=0.7)
    assert policy_named("silence", 0.7) == SilencePolicy(0.7)


def test_the_combined_wait_shrinks_as_the_verdicts_grow_surer():
    policy = CombinedPolicy(threshold=0.5, min_wait_s=0.1, max_wait_s=1.5, text_weight=1.0, text_bias=16.0,
                            needs_text=False)
    assert policy.wait(Features()) == 1.5  # nothing known yet
    assert CombinedPolicy(needs_text=True).wait(Features(audio_p=0.99)) == 1.5  # audio alone: no
    done = Features(audio_p=0.5, text_p=1e-5)  # a complete request: the text says yes
    fragment = Features(audio_p=0.98, text_p=1e-10)  # "what is the capital of": no
    assert policy.probability(done) > 0.5 > policy.probability(fragment)
    assert policy.wait(done) == 0.1
    assert policy.wait(fragment) > 1.3
    waits = [policy.wait(Features(audio_p=0.5, text_p=10.0 ** -k)) for k in range(4, 12)]
    assert waits == sorted(waits)  # less likely text, longer wait
    capped = CombinedPolicy(text_weight=1.0, text_bias=16.0, punctuation_wait_s=0.5)
    assert capped.wait(Features(text_complete=True, text_p=1e-10)) == 0.5
    assert policy.without_text_model() == RulesPolicy(max_silence_s=1.5)


def test_the_text_turn_model_sees_the_words_without_whisper_s_punctuation():
    from agent.conversation.eou import TextTurnScorer

    assert TextTurnScorer.normalize("What is the capital of?") == "what is the capital of"
    assert TextTurnScorer.normalize("I'd like... four, please.") == "i'd like four please"


def test_the_baselines_as_policies():
    rules = RulesPolicy(eou_threshold=0.5, sentence_silence_s=0.5, max_silence_s=1.5)
    assert rules.required_silence(Features(audio_p=0.9), 0.2) == 0.2
    assert rules.required_silence(Features(audio_p=0.1, text_complete=True), 0.2) == 0.5
    assert rules.required_silence(Features(audio_p=0.1, text_complete=False), 0.2) == 1.5
    assert SmartTurnPolicy().required_silence(Features(audio_p=0.1, text_complete=True), 0.2) == 1.5
    assert SilencePolicy(0.7).required_silence(Features(audio_p=0.99), 0.2) == 0.7
    assert not SilencePolicy.uses_audio_model and CombinedPolicy.uses_text_model and not RulesPolicy.uses_text_model


# ---- a policy of one's own (docs/extending.md) ------------------------------------------------
class PunctuationPolicy:
    """No turn model: a transcript that ends a sentence ends the turn after `sentence_s` of
    silence, anything else after `other_s`."""

    name = "punctuation"
    uses_audio_model = uses_text_model = False
    audio_first = True

    def __init__(self, sentence_s: float = 0.3, other_s: float = 1.0):
        self.sentence_s, self.other_s = sentence_s, other_s

    def required_silence(self, f: Features, pause_s: float) -> float:
        return self.sentence_s if f.text_complete else self.other_s

    def wants_audio_verdict(self, f: Features) -> bool:
        return False

    def without_text_model(self):
        return self


def test_a_policy_of_one_s_own_drives_the_machine():
    d = Driver(endpointing=PunctuationPolicy()).frames("#" * 20 + "." * 8)
    d.log += d.m.on_transcript(d.t, complete=True)  # "What time is it?" after 0.26 s of silence
    assert d.kinds()[-1] == SpeechPaused
    d.frames("..")  # 0.32 s
    assert d.kinds()[-1] == EndOfTurn
    d2 = Driver(endpointing=PunctuationPolicy()).frames("#" * 20 + "." * 8)
    d2.log += d2.m.on_transcript(d2.t, complete=False)  # "What time is"
    d2.frames("." * 20)  # 0.9 s: still waiting
    assert EndOfTurn not in d2.kinds()
    d2.frames("." * 4)
    assert d2.kinds()[-1] == EndOfTurn


def test_an_interruptions_lead_words_alone_are_told():
    from agent.conversation.turns import BACKCHANNELS, only_lead_words

    for lead in ("Hold on.", "Wait.", "Sorry,", "Okay, stop.", "Um, wait, wait.", "Excuse me."):
        assert only_lead_words(lead, BACKCHANNELS), lead
    for words in ("Hold on, how many legs?", "Wait, what is it?", "Yeah.", "", "The stop sign."):
        assert not only_lead_words(words, BACKCHANNELS), words
