"""Barge-in that stops at once: the turn machine pauses the reply at the first frames of speech
over the bot, cancels it on words, and resumes it on noise or a backchannel (Driver style, no
models); then the real Session with the test doubles (tests/doubles.py): the far end is cleared
at the onset, a resumed reply goes on from the sample where it stopped and loses none, and the
history keeps exactly what was heard."""
from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from doubles import EnergyVAD, ScriptedLLM, ScriptedRecognizer, ToneVoice, burst
from helpers import await_until, is_word_prefix
from test_turns import B, Driver, F, I, L, P, T, U

from agent.conversation.endpointing import SilencePolicy
from agent.conversation.session import Models, Session, SessionConfig
from agent.tracing.trace import Ev, Tracer
from agent.conversation.turns import (
    CancelReply,
    DiscardTranscript,
    EndOfTurn,
    PauseReply,
    ResumeReply,
    SpeechPaused,
    SpeechStopped,
    StartUtterance,
    interrupting_words,
)
from transport.wavfile import ScriptedTurn, WavConversationTransport

pytestmark = pytest.mark.usefixtures("virtual_clock")

RATE = 16000
LONG = ("Once upon a time there was a small fox who lived in a quiet wood, and every morning "
        "the fox went down to the river to drink and to watch the fish jump in the sun.")


# ---- the turn machine ----------------------------------------------------------------------------
def speaking(**config) -> Driver:
    """A turn answered; the bot's reply is playing."""
    d = Driver(**config).frames("#" * 20 + "." * 8).eou(0.9)
    d.log += d.m.on_final(d.t, "tell me a story")
    d.m.on_reply_started(d.t)
    return d


def test_the_first_frames_of_speech_over_the_bot_pause_it():
    d = speaking()
    n = len(d.log)
    d.frames("##")  # 64 ms: not yet
    assert d.log[n:] == [] and d.m.state == B
    onset = round(d.t - F, 6)  # the first of those frames ended here
    d.frames("#")
    pause, start = d.log[n:]
    assert isinstance(pause, PauseReply) and isinstance(start, StartUtterance)
    assert abs(pause.t_speech_start - (onset - F)) < 1e-6 and abs(pause.t - d.t) < 1e-6
    assert d.m.state == I
    d.frames("#" * 20)  # more speech does not pause it again
    assert [type(c) for c in d.log[n:]].count(PauseReply) == 1


def test_a_soft_onset_over_the_bot_pauses_it_as_soon_as_three_frames_pass_the_silence_threshold():
    def probs(d: Driver, *ps: float) -> Driver:
        for p in ps:
            d.t = round(d.t + F, 6)
            d.log += d.m.on_vad(d.t, p, F, None)
        return d

    # flite's kal, "Wait, who wrote ...": Silero's first frames 0.41, 0.55, 0.54, then 0.33
    d = probs(speaking(), 0.2, 0.41, 0.55, 0.54)
    assert isinstance(d.log[-2], PauseReply) and abs(d.log[-2].t_speech_start - (d.t - 3 * F)) < 1e-6
    assert d.m.state == I
    # frames under the silence threshold before it, or frames that never pass 0.5, do not count
    d = probs(speaking(), 0.34, 0.34, 0.55, 0.54)
    assert not any(isinstance(c, PauseReply) for c in d.log) and d.m.state == B
    d = probs(speaking(), 0.45, 0.45, 0.45, 0.45, 0.2)
    assert not any(isinstance(c, PauseReply) for c in d.log) and d.m.state == B
    # an utterance's start with the bot silent counts as before (clicks are not speech)
    d = probs(Driver(), 0.41, 0.55, 0.54, 0.2)
    assert d.log == [] and d.m.state == L


def test_words_over_the_bot_cancel_it_but_backchannels_do_not():
    d = speaking().frames("#" * 6)
    assert d.m.on_words(d.t, "Mm-hmm.") == [] and d.m.state == I
    assert d.m.on_words(d.t, "(coughs)") == []
    assert d.m.on_words(d.t, "you") == []  # a word or two of a partial: Whisper's guess on a fragment, often
    assert d.m.on_words(d.t, "and image") == []
    assert d.m.on_words(d.t, "mm-hmm wait stop please") == [CancelReply(d.t)]
    assert d.m.state == U
    d.frames("#" * 80)  # past the false-interruption timeout: decided, nothing resumes
    assert ResumeReply not in d.kinds() and d.states()[-2:] == [I, U]


def test_a_backchannel_over_the_bot_resumes_it_and_is_no_turn():
    d = speaking()
    n = len(d.log)
    d.frames("#" * 8 + "." * 14)  # "yeah", then 0.45 s of silence less a frame: still paused
    assert [type(c) for c in d.log[n:]] == [PauseReply, StartUtterance, SpeechStopped, SpeechPaused]
    d.frames(".")  # its words unknown yet, the reply goes on
    assert [type(c) for c in d.log[n:]][4:] == [EndOfTurn, ResumeReply] and d.log[-1].words_due
    assert d.m.state == B
    d.frames("." * 8).eou(0.9)
    assert len(d.log) == n + 6 and d.m.state == B  # nothing more: no second end of turn
    assert d.m.on_final(d.t, "Yeah.") == [DiscardTranscript(d.t)] and d.m.state == B
    assert d.states()[-4:] == [I, P, T, B]


def test_the_early_decode_of_speech_over_the_bot_decides_as_soon_as_it_comes():
    # none but backchannels: the reply goes on at once, however long the hum
    d = speaking().frames("#" * 35 + "..")
    stopped = next(c for c in d.log if isinstance(c, SpeechStopped) and c.t_speech_end > 1.0)
    out = d.m.on_early_words(d.t, "Mm-hmm.", stopped.t_speech_end)
    assert [type(c) for c in out] == [EndOfTurn, ResumeReply] and d.m.state == B
    assert d.m.on_final(d.t, "Mm-hmm.") == [DiscardTranscript(d.t)]
    # words: cut at once, and the utterance goes on to be a turn of its own, answered
    d = speaking().frames("#" * 12 + "..")
    stopped = next(c for c in d.log if isinstance(c, SpeechStopped) and c.t_speech_end > 1.0)
    assert d.m.on_early_words(d.t, "Stop.", stopped.t_speech_end) == [CancelReply(d.t)] and d.m.state == U
    d.frames("." * 8).eou(0.9)
    assert d.m.state == T and d.m.on_final(d.t, "Stop.") == []
    # words of an earlier silence, or come after the user went on, decide nothing
    d = speaking().frames("#" * 12 + ".." + "#" * 5)
    assert d.m.on_early_words(d.t, "Stop.", stopped.t_speech_end) == [] and d.m.state == I


def looks(d: Driver, *texts: str) -> list:
    """Looks at the words so far of the speech over the bot, one 32 ms frame of speech apart."""
    out = []
    for i, text in enumerate(texts):
        if i:
            d.frames("#")
        out += d.m.on_overlap_words(d.t, text)
    return out


def test_a_backchannel_lets_the_reply_go_on_while_it_is_still_said():
    d = speaking().frames("#" * 9)  # 0.29 s over the bot: paused, too soon to look at its words
    assert d.m.overlap_undecided and not d.m.wants_overlap_words(d.t)
    d.frames("#")  # 0.32 s: a look at the words so far
    assert d.m.wants_overlap_words(d.t)
    # nothing heard yet, or an interruption's lead word: still paused
    assert looks(d, "", "Wait", "Sorry,") == [] and d.m.overlap_undecided
    assert looks(d, "Mm-hmm.") == [ResumeReply(d.t, words_due=True)]
    assert d.m.going_on and not d.m.overlap_undecided and d.m.state == I
    d.frames("###")  # the rest of it: one look with words, or none, does not pause it again
    assert looks(d, "Mm-hmm, what", "", "in a manner", "Mm-hmm.") == [] and d.kinds().count(PauseReply) == 1
    # nor do words in place of the hum, however many: Whisper makes them up over a long one
    assert looks(d, "I am here...", "I am a major", "I am a very charming.") == [] and d.m.going_on
    n = len(d.log)
    d.frames("..")
    stopped = d.log[-1]
    assert isinstance(stopped, SpeechStopped)
    # its end: the decode at the silence confirms it, and the reply plays on (no second resume)
    assert d.m.on_early_words(d.t, "Yeah.", stopped.t_speech_end) == [EndOfTurn(stopped.t_speech_end)]
    assert d.m.state == B and not d.m.going_on and d.log[n:] == [stopped]
    assert d.m.on_final(d.t, "Yeah.") == [DiscardTranscript(d.t)] and d.m.state == B
    d.frames("." * 70)  # past the false-interruption timeout: nothing more
    assert d.kinds().count(ResumeReply) == 0 and d.kinds().count(PauseReply) == 1


def test_words_after_the_reply_went_on_over_them_pause_it_again_and_cut_it():
    # words going on from the backchannel ("Okay, but what ..."), and words that ask the bot to
    # stop though a look heard a hum in their first syllable (a look at the first 0.3 s of
    # "Stop, stop. Wait ..." hears "Mm-hmm." in flite's kal and awb)
    for went_on, heard, said in (("Okay,", ("Okay, but", "Okay, but what"), "Okay, but what about the dragon?"),
                                 ("Mm-hmm.", ("Stop, stop.", "Stop, stop. Wait"), "Stop, stop. Wait a moment please.")):
        d = speaking().frames("#" * 10)
        start = next(c for c in d.log if isinstance(c, PauseReply)).t_speech_start
        assert looks(d, went_on) == [ResumeReply(d.t, words_due=True)]
        d.frames("#" * 6)
        assert looks(d, *heard) == [PauseReply(d.t, start)], went_on  # as soon as two looks hear them
        assert d.m.overlap_undecided and not d.m.going_on
        d.frames("#" * 20 + "..")
        stopped = d.log[-1]
        assert d.m.on_early_words(d.t, said, stopped.t_speech_end) == [CancelReply(d.t)]
        assert d.m.state == U  # a turn of its own, answered
    # words the decode at the silence hears, after the looks heard none, cut it at once
    d = speaking().frames("#" * 10)
    looks(d, "Okay.")
    d.frames("###..")
    assert d.m.on_early_words(d.t, "Okay, stop.", d.log[-1].t_speech_end) == [CancelReply(d.t)]
    assert d.m.state == U and not d.m.going_on
    d.frames("." * 8).eou(0.9)
    assert d.m.on_final(d.t, "Okay, stop.") == [] and d.m.state == T
    # and a partial's stable words do too
    d = speaking().frames("#" * 10)
    looks(d, "Yeah.")
    assert d.m.on_words(d.t, "yeah but why did the king") == [CancelReply(d.t)]


def test_side_talk_lets_the_reply_go_on_while_it_is_said_and_no_words_do_not():
    d = speaking().frames("#" * 10)
    start = next(c for c in d.log if isinstance(c, PauseReply)).t_speech_start
    assert looks(d, "Honey can") == [ResumeReply(d.t, words_due=True)]  # calls someone else
    d.frames("#" * 30)
    assert looks(d, "Honey, can you grab my keys", "Honey, can you grab my keys") == [] and d.m.going_on
    assert looks(d, "Honey, stop", "Honey, stop the music") == [PauseReply(d.t, start)]  # for the bot after all
    assert d.m.overlap_undecided and d.m.wants_overlap_words(d.t)
    d.frames("#" * 24)  # 2.0 s: no more looks (its decode at the silence decides)
    assert not d.m.wants_overlap_words(d.t)
    # the decode at the pause after the name ("Honey," then a breath) hears "Honey.": no cut yet
    d = speaking().frames("#" * 10)
    looks(d, "Honey")
    d.frames("##..")
    assert d.m.on_early_words(d.t, "Honey.", d.log[-1].t_speech_end) == [] and d.m.going_on
    d.frames("#" * 30 + "..")
    assert d.m.on_early_words(d.t, "Honey, can you grab my keys?", d.log[-1].t_speech_end) == [
        EndOfTurn(d.log[-1].t_speech_end)] and d.m.state == B
    # speech heard as no words, however long, stays paused: over a phone line a look hears none in
    # a caller's "Wait, wait. Stop ..." in turns with "Wait"
    d = speaking().frames("#" * 10)
    assert looks(d, "", "", "") == []
    d.frames("#" * 15)  # 0.83 s
    assert looks(d, "", "Wait, wait", "") == [] and d.m.overlap_undecided
    # none of it with looks off
    d = speaking(look_over_s=None).frames("#" * 30)
    assert not d.m.wants_overlap_words(d.t) and looks(d, "Yeah.", "Yeah.") == []


def test_a_look_at_a_brief_overlap_as_it_stops_lets_the_reply_go_on_before_the_decode():
    # "Right." (0.29 s): too short for two looks while said; the look at its silence hears it
    d = speaking().frames("#" * 9 + "..")
    stopped = d.log[-1]
    assert not d.m.wants_overlap_words(d.t)
    for heard in ("Stop.", "Honey,", "Wait wait wait"):  # words, a name: the decode decides
        assert d.m.on_overlap_words(d.t, heard) == [] and d.m.overlap_undecided
    assert d.m.on_overlap_words(d.t, "Right. Right. Right.") == [EndOfTurn(stopped.t_speech_end),
                                                                  ResumeReply(d.t, words_due=True)]
    assert d.m.state == B and not d.m.overlap_open
    # the decode at the silence comes after: it decides nothing now, its final does
    assert d.m.on_early_words(d.t, "Right.", stopped.t_speech_end) == []
    assert d.m.on_final(d.t, "Right.") == [DiscardTranscript(d.t)] and d.m.state == B
    # its final holds words going on from it: they cut the reply that went on, and are answered
    d = speaking().frames("#" * 9 + "..")
    d.m.on_overlap_words(d.t, "Mm-hmm.")
    assert d.m.on_final(d.t, "Mm-hmm, stop.") == [CancelReply(d.t)] and d.m.state == T
    # no words is no backchannel: the look at the comma's pause of kal's "Wait, who ..." hears none
    d = speaking().frames("#" * 9 + "..")
    assert d.m.on_overlap_words(d.t, "") == [] and d.m.overlap_undecided


def test_words_a_decode_hears_in_place_of_the_backchannel_a_look_heard_do_not_cut_it():
    # awb's "Okay.": a look heard "Okay", the decode at the silence "Go key."
    d = speaking().frames("#" * 10)
    assert looks(d, "Okay") == [ResumeReply(d.t, words_due=True)]
    d.frames("#" * 4 + "..")
    assert d.m.on_early_words(d.t, "Go key.", d.log[-1].t_speech_end) == [EndOfTurn(d.log[-1].t_speech_end)]
    assert d.m.state == B and d.m.on_final(d.t, "Go key.") == [DiscardTranscript(d.t)]
    # Piper's "Mm-hmm.": the look at its silence heard "N m m", the final "in a month."
    d = speaking().frames("#" * 12 + "..")
    assert [type(c) for c in d.m.on_overlap_words(d.t, "N m m")] == [EndOfTurn, ResumeReply]
    assert d.m.on_final(d.t, "in a month.") == [DiscardTranscript(d.t)] and d.m.state == B
    # words after the backchannel, or speech longer than one, are no dispute
    d = speaking().frames("#" * 12 + "..")
    d.m.on_overlap_words(d.t, "Okay")
    assert d.m.on_final(d.t, "Okay, stop.") == [CancelReply(d.t)]
    d = speaking().frames("#" * 10)
    looks(d, "Mm-hmm.")
    d.frames("#" * 35 + "..")  # 1.5 s
    assert d.m.on_early_words(d.t, "I want the dragon story.", d.log[-1].t_speech_end) == [CancelReply(d.t)]
    # a look that heard a name is no hearing of a backchannel
    d = speaking().frames("#" * 10)
    looks(d, "Tom,")
    d.frames("###..")
    assert d.m.on_early_words(d.t, "Tom. Stop.", d.log[-1].t_speech_end) == [CancelReply(d.t)]


def test_a_longer_backchannel_waits_for_its_final_to_resume():
    d = speaking().frames("#" * 30 + "." * 8).eou(0.9)  # a long "mm-hmm" (0.96 s), then its utterance ends
    assert d.m.state == T and ResumeReply not in d.kinds()[-6:]
    out = d.m.on_final(d.t, "Mm-hmm.")
    assert [type(c) for c in out] == [DiscardTranscript, ResumeReply] and d.m.state == B
    assert d.states()[-4:] == [I, P, T, B]


def test_a_brief_overlap_with_words_cuts_the_reply_that_went_on_and_is_answered():
    d = speaking().frames("#" * 12 + "." * 15)  # "Stop." (0.38 s), its words slower than the wait
    assert d.m.state == B and isinstance(d.log[-1], ResumeReply)
    assert d.m.on_final(d.t, "Stop.") == [CancelReply(d.t)] and d.m.state == T  # the turn's to answer
    # the reply ended before the words came: they are a turn of their own
    d = speaking().frames("#" * 12 + "." * 15)
    d.m.on_reply_finished(d.t)
    assert d.m.on_final(d.t, "Stop.") == [] and d.m.state == T
    # the user spoke over it again meanwhile: it is paused, and cut as before
    d = speaking().frames("#" * 12 + "." * 15 + "#" * 4)
    assert d.m.state == I
    assert d.m.on_final(d.t, "Wait.") == [CancelReply(d.t)] and d.m.state == U


def test_a_pause_inside_an_interruption_is_not_a_brief_overlap():
    # "Wait, what is ...": the lead words, a comma's silence (up to 0.38 s in Piper's voice), words;
    # the bot stays paused
    for lead in ("###", "#" * 10):
        d = speaking()
        n = len(d.log)
        d.frames(lead + "." * 12 + "#" * 40)
        assert ResumeReply not in d.kinds()[n:] and d.m.state in (I, U) and d.m.overlap_undecided
    # and with brief overlaps off, a backchannel waits for its final as it did
    d = Driver(brief_overlap_s=None).frames("#" * 20 + "." * 8).eou(0.9)
    d.log += d.m.on_final(d.t, "tell me a story")
    d.m.on_reply_started(d.t)
    d.frames("#" * 8 + "." * 8).eou(0.9)
    assert d.m.state == T
    assert [type(c) for c in d.m.on_final(d.t, "Yeah.")] == [DiscardTranscript, ResumeReply]


def test_a_final_with_words_makes_the_interruption_real():
    d = speaking().frames("#" * 30 + "." * 8).eou(0.9)
    assert d.m.on_final(d.t, "stop") == [CancelReply(d.t)] and d.m.state == T  # the new turn's to answer


def test_noise_keeps_the_bot_paused_while_it_lasts_and_the_timeout_counts_from_its_end():
    d = Driver(false_interruption_s=1.0)  # shorter than the end of turn's wait: the timeout decides
    d.frames("#" * 20 + "." * 8).eou(0.9)
    d.log += d.m.on_final(d.t, "tell me a story")
    d.m.on_reply_started(d.t)
    n = len(d.log)
    d.frames("#" * 120)  # 3.8 s of wordless noise (or words the recognizer is slow to find)
    assert [type(c) for c in d.log[n:]] == [PauseReply, StartUtterance] and d.m.state == I
    noise_end = d.t
    d.frames("." * 40)
    assert [type(c) for c in d.log[n:]] == [PauseReply, StartUtterance, SpeechStopped, SpeechPaused, ResumeReply]
    assert abs(d.log[-1].t - noise_end - 1.0) < 1.5 * F and d.m.state == B
    d.frames("####")  # new speech pauses the bot again
    assert [type(c) for c in d.log[-2:]] == [PauseReply, StartUtterance]


def test_slow_words_still_make_it_an_interruption():
    d = speaking().frames("#" * 100 + "." * 47)  # 3.2 s of speech, then the end of turn's wait
    assert d.m.state == T and ResumeReply not in d.kinds()  # no timeout while they spoke
    assert d.m.on_final(d.t, "why is the sky blue") == [CancelReply(d.t)]


def test_speech_over_the_thinking_bot_resumes_to_the_reply_that_started_meanwhile():
    d = Driver().frames("#" * 20 + "." * 8).eou(0.9)  # turn ended, its transcript not yet in
    d.frames("#" * 5)
    assert d.kinds()[-2:] == [PauseReply, StartUtterance] and d.m.state == I
    assert d.m.on_final(d.t, "what time is it") == []  # the earlier turn's words decide nothing
    d.m.on_reply_started(d.t)  # its reply started, paused
    assert d.m.state == I
    d.frames("." * 8).eou(0.9)
    assert [type(c) for c in d.m.on_final(d.t, "")] == [DiscardTranscript, ResumeReply]
    assert d.m.state == B


def test_a_reply_that_ends_while_paused_leaves_nothing_to_resume():
    d = speaking().frames("#" * 6)
    d.m.on_reply_finished(d.t)  # it failed: the speech over it is an utterance like any other
    assert d.m.state == U
    d.frames("#" * 80)
    assert ResumeReply not in d.kinds()


def test_interrupting_words_leave_out_backchannels_and_sound_tags():
    quiet = ["Mm-hmm.", "MMHMM", "Mm-huh.", "Mmh", "mhm", "M-M-H-M-N", "M-H-M-S", "uh-huh", "Um,", "oh", "[BLANK_AUDIO]",
             "(coughs)", ""]
    assert [interrupting_words(t) for t in quiet] == [0] * len(quiet)
    assert [interrupting_words(t) for t in ["Hmm, wait.", "Yeah.", "stop please", "home", "Oh no", "man"]] == [1, 1, 2, 1, 1, 1]
    assert interrupting_words("yeah okay", backchannels=("yeah", "okay")) == 0


# ---- the Session, with the test doubles --------------------------------------------------------------
class Recording:
    """The WAV far end, recording the audio sent to it (timeline time, id, samples, perf_counter
    time) and its clears."""

    def __init__(self, inner: WavConversationTransport):
        self.inner = inner
        self.reports_playout = inner.reports_playout
        self.sent: list[tuple[float, int, np.ndarray, float]] = []
        self.clears: list[float] = []

    async def send_audio(self, chunk):
        self.sent.append((self.inner.now(), chunk.chunk_id, chunk.pcm.copy(), time.perf_counter()))
        await self.inner.send_audio(chunk)

    async def clear(self):
        self.clears.append(self.inner.now())
        await self.inner.clear()

    def __getattr__(self, name):
        return getattr(self.inner, name)


class RecordingVoice(ToneVoice):
    """The tone voice, keeping each chunk it made: the reply's whole audio, in order."""

    def __init__(self):
        super().__init__()
        self.chunks = []

    async def stream(self, text_chunks):
        async for chunk in super().stream(text_chunks):
            self.chunks.append(chunk)
            yield chunk


async def converse(tmp_path, turns, script, llm, guesses=None, flush_s=0.0):
    wav = WavConversationTransport(turns, RATE, str(tmp_path / "out.wav"), gap_s=0.3, reply_timeout_s=8.0)
    far, voice = Recording(wav), RecordingVoice()
    cfg = SessionConfig(speculate=False)
    cfg.turns.endpointing = SilencePolicy()  # silence alone ends turns (0.5 s)
    tracer = Tracer("t", capacity=1 << 14)
    asr = ScriptedRecognizer(script, guesses=guesses, flush_s=flush_s)
    session = Session(Models(asr=asr, llm=llm, tts=voice, vad_factory=EnergyVAD), far, cfg, tracer=tracer)
    await asyncio.wait_for(session.run(), timeout=40)
    wav.close()
    return session, far, voice, tracer


def story_then(over: np.ndarray, words: str):
    """A question answered with a long story, and `over` spoken 2 s into it (with `words`)."""
    question = np.concatenate([np.zeros(int(0.3 * RATE), np.float32), burst(0.6)])
    return [ScriptedTurn(question, RATE, "ask"), ScriptedTurn(over, RATE, "over", start_after_s=2.0)], \
        ["tell me a story", words]


def trace(tracer, name):
    return [e for e in tracer.events() if e.name == name]


def log(far, kind):
    return [e for e in far.inner.events_log if e["type"] == kind]


async def test_a_cough_pauses_the_reply_at_once_and_it_resumes_from_the_sample_it_stopped(tmp_path):
    turns, script = story_then(burst(0.45, seed=3), "")
    llm = ScriptedLLM(LONG)
    session, far, voice, tracer = await converse(tmp_path, turns, script, llm)

    # paused at the onset: the far end was cleared before the cough's utterance had even ended
    (clear_t,) = far.clears
    (ended,) = [e for e in log(far, "endpoint") if e["turn"] == 1]
    assert clear_t < ended["t"]
    (paused,) = trace(tracer, Ev.REPLY_PAUSED)
    assert paused.args["speech_to_clear_ms"] > 0
    # nothing went out while it was paused
    (resume,) = trace(tracer, Ev.RESUME)
    clear_ns = next(e.ts_ns for e in tracer.events() if e.name == Ev.CLEAR)
    assert not [s for s in far.sent if clear_ns < s[3] * 1e9 < resume.ts_ns]
    # the audio: what was sent before the clear is the reply's audio up to some sample; after
    # the resume the reply's audio again, from exactly the sample where the far end stopped
    whole = np.concatenate([c.pcm for c in voice.chunks])
    before = np.concatenate([s[2] for s in far.sent if s[3] * 1e9 <= clear_ns])
    after = np.concatenate([s[2] for s in far.sent if s[3] * 1e9 > clear_ns])
    at = round(resume.args["at_s"] * RATE)
    assert np.array_equal(before, whole[:before.size]), "the audio before the pause is the reply's"
    assert 0 < at < before.size, "it resumed inside what was sent, not after it"
    assert np.array_equal(after, whole[at:]), "the resumed audio is the rest of the reply from the paused sample"
    # what the far end played: the whole reply, nothing skipped, at most a few ms played twice
    played = played_reply_seconds(tmp_path / "out.wav", after_s=0.9)
    assert -0.005 < played - whole.size / RATE < 0.08, (played, whole.size / RATE)
    # heard exactly: the whole story, once; the cough was no turn and asked the LLM nothing
    assert len(llm.requests) == 1
    assert session.records[0].heard_text == LONG and not session.records[0].interrupted
    assert session.history == [{"role": "user", "content": "tell me a story"}, {"role": "assistant", "content": LONG}]
    assert [r.user_text for r in session.records] == ["tell me a story", ""]


async def test_words_over_the_bot_cancel_the_paused_reply_and_keep_what_was_heard(tmp_path):
    turns, script = story_then(burst(0.8, seed=2), "wait stop")
    # slow enough to be still generating when it is talked over
    llm = ScriptedLLM(lambda user: LONG if "story" in user else "Okay.", token_s=0.08)
    session, far, _, tracer = await converse(tmp_path, turns, script, llm)

    first, second = session.records[0], session.records[1]
    assert first.interrupted and second.user_text == "wait stop" and second.reply_text == "Okay."
    (clear_t,) = far.clears[:1]
    # cleared at the onset, before the words that made it an interruption were recognised
    first_partial = next(e["t"] for e in log(far, "partial") if "wait" in e["text"])
    assert clear_t < first_partial
    assert llm.cancelled == 1, "the cut reply's LLM was cancelled"
    # paused, the LLM was not read: at most the token it was waiting for came after
    barge_ns = trace(tracer, Ev.BARGE_IN)[0].ts_ns
    assert len([e for e in trace(tracer, Ev.TOKEN) if e.turn == 0 and e.ts_ns > barge_ns]) <= 1
    # the story's audio stopped at the clear: nothing of it was sent after
    clear_ns = next(e.ts_ns for e in tracer.events() if e.name == Ev.CLEAR)
    story_ids = {s[1] for s in far.sent if s[3] * 1e9 <= clear_ns}
    later = [s for s in far.sent if s[3] * 1e9 > clear_ns]
    assert story_ids and later and min(s[1] for s in later) > max(story_ids)
    assert not [e for e in trace(tracer, Ev.SEND_AUDIO) if e.turn == 0 and e.ts_ns > clear_ns]
    # heard: exactly the pieces the far end began before the clear
    played = {e["id"] for e in log(far, "played") if e["t"] <= clear_t}
    heard = " ".join(e["text"] for e in log(far, "audio") if e["id"] in played and e["text"]).strip()
    assert heard and first.heard_text == heard and is_word_prefix(heard, LONG, strict=True)
    assert session.history[:2] == [{"role": "user", "content": "tell me a story"},
                                   {"role": "assistant", "content": heard}]
    assert llm.requests[-1][-1] == {"role": "user", "content": "Wait stop."}  # as written for the model


async def test_a_backchannel_over_the_bot_resumes_it_and_is_not_answered(tmp_path):
    turns, script = story_then(burst(0.5, seed=4), "mm-hmm")
    llm = ScriptedLLM(LONG)
    session, far, _, tracer = await converse(tmp_path, turns, script, llm)
    (resume,) = trace(tracer, Ev.RESUME)
    assert len(far.clears) == 1
    # brief: the reply went on as it ended, before its words were known
    (final,) = [e for e in trace(tracer, Ev.FINAL) if e.turn == 1]
    assert resume.ts_ns < final.ts_ns
    assert len(llm.requests) == 1, "the backchannel was not answered"
    assert [r.user_text for r in session.records] == ["tell me a story", ""]
    assert session.history[-1] == {"role": "assistant", "content": LONG}


async def test_a_brief_word_over_the_bot_resumes_it_then_its_final_cuts_it_and_is_answered(tmp_path):
    turns, script = story_then(burst(0.4, seed=5), "stop")
    llm = ScriptedLLM(lambda user: LONG if "story" in user else "Okay.", token_s=0.02)
    # its decode takes 1 s: the reply goes on after the wait, before its words
    session, far, _, tracer = await converse(tmp_path, turns, script, llm, flush_s=1.0)
    (resume,) = trace(tracer, Ev.RESUME)
    (final,) = [e for e in trace(tracer, Ev.FINAL) if e.turn == 1]
    assert resume.ts_ns < final.ts_ns, "the reply went on before the words were known"
    # then the words cut it: the far end is cleared again, and they are answered
    assert len(far.clears) == 2 and far.clears[1] >= far.clears[0]
    first, second = session.records[0], session.records[1]
    assert first.interrupted and second.user_text == "stop" and second.reply_text == "Okay."
    assert is_word_prefix(first.heard_text, LONG, strict=True)
    assert session.history[-2:] == [{"role": "user", "content": "stop"}, {"role": "assistant", "content": "Okay."}]


async def test_a_brief_word_over_the_bot_decoded_within_the_wait_cuts_it_without_going_on(tmp_path):
    turns, script = story_then(burst(0.4, seed=5), "stop")
    llm = ScriptedLLM(lambda user: LONG if "story" in user else "Okay.", token_s=0.02)
    session, far, _, tracer = await converse(tmp_path, turns, script, llm)
    assert not trace(tracer, Ev.RESUME) and len(far.clears) == 1
    assert session.records[0].interrupted and session.records[1].reply_text == "Okay."


@pytest.mark.parametrize("stable", ["", "and and making"])
async def test_only_words_the_recognizer_stands_by_cut_the_bot(tmp_path, stable):
    """Half a hum over a phone line, guessed as three words in a partial ("and and making") that
    the final takes back ("Mm-hmm."): a guess (not in the partial's stable text) leaves the bot
    paused until the final, which resumes it; the same words stable cut it at once."""
    turns, script = story_then(burst(0.5, seed=4), "mm-hmm")
    llm = ScriptedLLM(LONG)
    session, far, _, tracer = await converse(tmp_path, turns, script, llm, guesses={1: ("and and making", stable)})
    if stable:
        assert session.records[0].interrupted and not trace(tracer, Ev.RESUME)
    else:
        assert trace(tracer, Ev.RESUME) and not session.records[0].interrupted
        assert session.history[-1] == {"role": "assistant", "content": LONG}


async def test_the_bots_own_words_heard_back_resume_it(tmp_path):
    """An echo the far end's canceller let through: the recognizer hears the story's own first
    words over it. The bot pauses at the sound, as for any speech, but resumes: no interruption."""
    turns, script = story_then(burst(0.6, seed=7), "Once upon a time")
    llm = ScriptedLLM(LONG)
    session, far, _, tracer = await converse(tmp_path, turns, script, llm)
    assert trace(tracer, Ev.ECHO) and trace(tracer, Ev.RESUME)
    assert not session.records[0].interrupted and len(llm.requests) == 1
    assert [r.user_text for r in session.records] == ["tell me a story", ""]
    assert session.history[-1] == {"role": "assistant", "content": LONG}


async def test_noise_that_goes_on_keeps_the_reply_paused_until_it_ends(tmp_path):
    turns, script = story_then(burst(3.0, seed=5), "")
    llm = ScriptedLLM(LONG)
    session, far, _, tracer = await converse(tmp_path, turns, script, llm)
    (resume,) = trace(tracer, Ev.RESUME)
    assert len(far.clears) == 1, "one pause for the whole noise"
    noise_end = far.inner.t0 + far.inner.input_end_times[1]
    assert resume.ts_ns / 1e9 > noise_end, "it resumed over the noise"
    assert session.history == [{"role": "user", "content": "tell me a story"}, {"role": "assistant", "content": LONG}]


def played_reply_seconds(path, after_s: float) -> float:
    """Seconds of tone in the far end's played timeline after `after_s` (the reply's, without
    the silences between): a 40-sample running max of |x| over a threshold (440 Hz has a 36-sample period)."""
    import soundfile as sf

    x, rate = sf.read(path, dtype="float32")
    x = np.abs(x[int(after_s * rate):])
    w = 40
    env = np.maximum.reduce([x[i:x.size - w + i] for i in range(w)])
    return float(np.count_nonzero(env > 0.05)) / rate


async def test_a_hang_up_while_the_reply_is_paused_says_goodbye_and_keeps_what_was_heard(tmp_path):
    turns, script = story_then(burst(1.5, seed=6), "")
    wav = WavConversationTransport(turns, RATE, str(tmp_path / "out.wav"), gap_s=0.3, reply_timeout_s=8.0)
    far = Recording(wav)
    cfg = SessionConfig(speculate=False)
    cfg.turns.endpointing = SilencePolicy()
    session = Session(Models(asr=ScriptedRecognizer(script), llm=ScriptedLLM(LONG), tts=ToneVoice(),
                             vad_factory=EnergyVAD), far, cfg, tracer=Tracer("t"))
    run = asyncio.create_task(session.run())
    assert await await_until(lambda: far.clears, timeout=20), "the noise did not pause the reply"
    n = len(far.sent)
    await session.hang_up("draining", "the server is restarting", "Goodbye.")  # while paused
    await asyncio.wait_for(run, 10)
    wav.close()
    assert len(far.sent) > n, "the goodbye was said, not held with the paused reply"
    first = session.records[0]
    assert first.interrupted and first.heard_text and is_word_prefix(first.heard_text, LONG, strict=True)
    assert session.history[:2] == [{"role": "user", "content": "tell me a story"},
                                   {"role": "assistant", "content": first.heard_text}]


def test_words_that_ask_the_bot_to_stop_cut_it_though_a_look_heard_a_hum():
    # no look heard them (the looks after it also end at "Stop" and other words pause it again,
    # above): the decode at its silence cuts it, in speech as long as a backchannel
    d = speaking().frames("#" * 10)
    looks(d, "Mm-hmm.")
    d.frames("#" * 20 + "..")  # 0.96 s
    assert d.m.on_early_words(d.t, "Stop, stop. Wait a moment please.", d.log[-1].t_speech_end) == [CancelReply(d.t)]
    assert d.m.state == U and not d.m.going_on
    # ... and so does the final of a brief one the reply went on after
    d = speaking().frames("#" * 9 + "..")
    d.m.on_overlap_words(d.t, "Mm-hmm.")
    assert d.m.on_final(d.t, "Wait.") == [CancelReply(d.t)] and d.m.state == T
