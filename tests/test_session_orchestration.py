"""The real Session, orchestrated with test doubles (tests/doubles.py) behind the real interfaces:
a normal turn, speculation committed and missed, barge-in, false interruption, hang-up, greeting,
slot refusal and a recognizer's gap and loss. No models; the conversation's seconds on the
virtual clock (tests/virtual_time.py), a fraction of a second each."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from agent.conversation.endpointing import SilencePolicy
from agent.conversation.session import Models, Session, SessionConfig
from agent.tracing.trace import Ev, Stage, Tracer
from helpers import is_word_prefix
from doubles import EnergyVAD, ScriptedLLM, ScriptedRecognizer, ToneVoice, burst
from transport.wavfile import ScriptedTurn, WavConversationTransport

pytestmark = pytest.mark.usefixtures("virtual_clock")

RATE = 16000
LONG = ("Once upon a time there was a small fox who lived in a quiet wood, and every morning "
        "the fox went down to the river to drink and to watch the fish jump in the sun.")


def config(**kw) -> SessionConfig:
    cfg = SessionConfig(**kw)
    cfg.turns.endpointing = SilencePolicy()  # silence alone ends turns (0.5 s)
    return cfg


def turn(pcm: np.ndarray, after: float | None = None) -> ScriptedTurn:
    return ScriptedTurn(pcm, RATE, "burst", start_after_s=after)


def with_silence(pcm: np.ndarray, lead: float = 0.3) -> np.ndarray:
    return np.concatenate([np.zeros(int(lead * RATE), np.float32), pcm])


class HangUpAt:
    """The far end hangs up at timeline second `t` (the WAV far end underneath plays the rest)."""

    def __init__(self, inner: WavConversationTransport, t: float):
        self.inner, self.t = inner, t
        self.reports_playout = inner.reports_playout

    async def receive(self):
        return None if self.inner.now() >= self.t else await self.inner.receive()

    def __getattr__(self, name):
        return getattr(self.inner, name)


async def converse(tmp_path, turns, asr, llm, cfg=None, hang_up_at=None, gap_s=0.3):
    wav = WavConversationTransport(turns, RATE, str(tmp_path / "out.wav"), gap_s=gap_s, reply_timeout_s=8.0)
    transport = HangUpAt(wav, hang_up_at) if hang_up_at is not None else wav
    models = Models(asr=asr, llm=llm, tts=ToneVoice(), vad_factory=EnergyVAD)
    tracer = Tracer("t", capacity=1 << 14)
    session = Session(models, transport, cfg or config(), tracer=tracer)
    await asyncio.wait_for(session.run(), timeout=30)
    wav.close()
    return session, wav, tracer


def events(wav, kind):
    return [e for e in wav.events_log if e["type"] == kind]


def names(tracer, stage):
    return [e.name for e in tracer.events() if e.stage == stage]


async def test_a_normal_turn_is_answered_and_remembered(tmp_path):
    llm = ScriptedLLM("Paris is the capital.")
    session, wav, _ = await converse(tmp_path, [turn(with_silence(burst(0.8)))],
                                     ScriptedRecognizer(["what is the capital of France"]), llm,
                                     config(speculate=False))
    (rec,) = list(session.records)
    assert rec.user_text == "what is the capital of France"
    assert rec.reply_text == "Paris is the capital." and rec.heard_text == rec.reply_text
    assert rec.voice_to_voice is not None and rec.voice_to_voice > 0
    assert [e["text"] for e in events(wav, "final")] == ["what is the capital of France"]
    assert session.history == [{"role": "user", "content": "what is the capital of France"},
                               {"role": "assistant", "content": "Paris is the capital."}]
    assert llm.requests[0][-1] == {"role": "user", "content": "What is the capital of France?"}  # as written
    assert events(wav, "played"), "the reply's audio was played at the far end"
    assert not events(wav, "clear")


async def test_speculation_started_at_the_pause_is_committed(tmp_path):
    llm = ScriptedLLM("Four legs.")
    session, wav, tracer = await converse(tmp_path, [turn(with_silence(burst(0.6)))],
                                          ScriptedRecognizer(["how many legs"]), llm)
    (rec,) = list(session.records)
    assert rec.speculative and rec.reply_text == "Four legs."
    assert session.speculation_stats["committed"] == 1 and session.speculation_stats["cancelled"] == 0
    assert len(llm.requests) == 1, "the committed speculation was the only LLM request"
    assert names(tracer, Stage.SPECULATION) == [Ev.START, Ev.COMMIT]
    # the reply was ready before the turn ended, so nothing waited on the LLM after it
    assert rec.llm_first_token <= rec.first_audio_out


async def test_speculation_on_a_mid_sentence_pause_is_cancelled(tmp_path):
    # "I'd like to book" [0.35 s pause: longer than the 0.2 s pause, shorter than the 0.5 s end] "a table"
    speech = np.concatenate([burst(0.6), np.zeros(int(0.35 * RATE), np.float32), burst(0.5, seed=1)])
    llm = ScriptedLLM("Sure.")
    session, wav, _ = await converse(tmp_path, [turn(with_silence(speech))],
                                     ScriptedRecognizer(["I'd like to book", "a table"]), llm)
    (rec,) = list(session.records)
    assert rec.user_text == "I'd like to book a table"
    stats = session.speculation_stats
    assert stats["started"] == 2 and stats["cancelled"] == 1 and stats["committed"] == 1
    assert llm.requests[0][-1]["content"] == "I'd like to book."  # the miss, as written
    assert llm.requests[-1][-1]["content"] == "I'd like to book a table."
    assert rec.reply_text == "Sure."


async def test_barge_in_cuts_the_reply_flushes_the_far_end_and_keeps_what_was_heard(tmp_path):
    llm = ScriptedLLM(lambda user: LONG if "story" in user else "Okay, I stop.")
    turns = [turn(with_silence(burst(0.6))), turn(burst(0.6, seed=2), after=2.5)]
    session, wav, tracer = await converse(tmp_path, turns, ScriptedRecognizer(["tell me a story", "stop please"]),
                                          llm, config(speculate=False))
    first, second = session.records[0], session.records[1]
    assert first.interrupted and first.heard_text
    assert is_word_prefix(first.heard_text, LONG, strict=True)
    assert events(wav, "clear"), "the far end was told to drop its buffered audio"
    assert Ev.BARGE_IN in names(tracer, Stage.TURN)
    # the next prompt holds what was heard of the story, not the whole story
    prompt = llm.requests[-1]
    assert {"role": "assistant", "content": first.heard_text} in prompt
    assert prompt[-1] == {"role": "user", "content": "Stop please."}
    assert second.reply_text == "Okay, I stop."
    # nothing of the cut reply played after the clear
    clear_t = events(wav, "clear")[0]["t"]
    cut_ids = {e["id"] for e in events(wav, "audio") if e["t"] < clear_t}
    assert not [e for e in events(wav, "played") if e["id"] in cut_ids and e["t"] > clear_t + 0.05]


async def test_a_false_interruption_resumes_the_reply_from_the_cut_clause(tmp_path):
    llm = ScriptedLLM(LONG)
    turns = [turn(with_silence(burst(0.6))), turn(burst(0.45, seed=3), after=2.0)]  # a cough: no words
    session, wav, tracer = await converse(tmp_path, turns, ScriptedRecognizer(["tell me a story", ""]), llm,
                                          config(speculate=False))
    assert Ev.RESUME in names(tracer, Stage.TURN)
    assert len(llm.requests) == 1, "the resumed reply is spoken again, not asked for again"
    assert [r.user_text for r in session.records] == ["tell me a story", ""]  # the cough's turn held no words
    assert session.history[0] == {"role": "user", "content": "tell me a story"}
    said = session.history[-1]["content"]
    assert session.history[-1]["role"] == "assistant" and said.endswith("sun.")
    assert len(session.history) == 2, "the truncated exchange stored at the cut was replaced"


async def test_a_hang_up_mid_reply_keeps_the_turn(tmp_path):
    llm = ScriptedLLM(LONG)
    session, wav, _ = await converse(tmp_path, [turn(with_silence(burst(0.6)))],
                                     ScriptedRecognizer(["tell me a story"]), llm, config(speculate=False),
                                     hang_up_at=3.0)
    (rec,) = list(session.records)
    assert rec.interrupted and rec.heard_text and is_word_prefix(rec.heard_text, LONG, strict=True)
    assert session.history == [{"role": "user", "content": "tell me a story"},
                               {"role": "assistant", "content": rec.heard_text}]


async def test_the_greeting_is_spoken_first_and_kept_in_the_context(tmp_path):
    llm = ScriptedLLM("Paris.")
    cfg = config(greeting="Hello, how can I help?", speculate=False)
    session, wav, _ = await converse(tmp_path, [turn(np.zeros(int(2.5 * RATE), np.float32)),
                                                turn(burst(0.6), after=0.0)],
                                     ScriptedRecognizer(["capital of France"]), llm, cfg)
    greeting, answer = session.records[0], session.records[1]
    assert greeting.user_text == "" and greeting.reply_text == "Hello, how can I help?"
    assert events(wav, "audio")[0]["text"] in "Hello, how can I help?"
    assert session.history[0] == {"role": "assistant", "content": "Hello, how can I help?"}
    assert llm.requests[0][-2] == {"role": "assistant", "content": "Hello, how can I help?"}
    assert answer.reply_text == "Paris."


async def test_a_conversation_beyond_the_recognizers_slots_is_refused_clearly(tmp_path):
    asr = ScriptedRecognizer(["hello"], slots=1)
    busy = await asr.open_stream()  # another conversation holds the only slot
    llm = ScriptedLLM("Hi.")
    session, wav, _ = await asyncio.wait_for(
        converse(tmp_path, [turn(with_silence(burst(0.6)))], asr, llm), timeout=10)
    (err,) = events(wav, "error")
    assert err["code"] == "no_recognizer" and err["fatal"] and "slot" in err["message"]
    assert events(wav, "audio"), "a phone line hears an apology"
    assert not llm.requests
    await busy.close()
    assert asr.open_streams == []


async def test_a_recognizer_gap_is_traced_and_the_conversation_goes_on(tmp_path):
    llm = ScriptedLLM("Yes.")
    session, wav, tracer = await converse(tmp_path, [turn(with_silence(burst(0.6), lead=0.8))],
                                          ScriptedRecognizer(["are you there"], gap_at_s=0.4), llm)
    assert Ev.GAP in names(tracer, Stage.ASR)
    assert session.records[0].user_text == "are you there" and session.records[0].reply_text == "Yes."


async def test_a_lost_recognizer_ends_the_conversation_with_a_clear_error(tmp_path):
    asr = ScriptedRecognizer(["hello"], fail_at_s=0.5)
    session, wav, _ = await converse(tmp_path, [turn(with_silence(burst(0.6), lead=1.0))], asr, ScriptedLLM("Hi."))
    (err,) = events(wav, "error")
    assert err["code"] == "recognizer_lost" and err["fatal"]
    assert asr.open_streams == [], "the stream was closed"


async def test_talking_over_the_greeting_keeps_only_what_was_heard_of_it(tmp_path):
    greeting = "Hello and welcome to the shop, I can tell you about our opening hours and our prices today."
    llm = ScriptedLLM("Sure.")
    cfg = config(greeting=greeting, speculate=False)
    session, wav, _ = await converse(tmp_path, [turn(np.zeros(int(1.2 * RATE), np.float32)),
                                                turn(burst(0.6), after=0.0)],
                                     ScriptedRecognizer(["what are your hours"]), llm, cfg)
    cut, answer = session.records[0], session.records[1]
    assert cut.interrupted and cut.heard_text and is_word_prefix(cut.heard_text, greeting, strict=True)
    assert session.history[:2] == [{"role": "assistant", "content": cut.heard_text},
                                   {"role": "user", "content": "what are your hours"}]
    assert answer.reply_text == "Sure."


async def test_the_llm_read_ahead_gives_way_when_the_user_stops_speaking(tmp_path):
    # a partial 0.3 s into the burst starts the LLM's read-ahead of the words so far; once the
    # user stops, their words' decode needs the cores, and the read-ahead ends there
    llm = ScriptedLLM("Four legs.", warm_s=20.0)
    session, wav, tracer = await converse(tmp_path, [turn(with_silence(burst(0.8)))],
                                          ScriptedRecognizer(["how many legs"], guesses={0: ("how many", "how")}),
                                          llm)
    (rec,) = list(session.records)
    assert rec.reply_text == "Four legs."
    assert "How many?" in llm.warms_stopped
    events = tracer.events()
    warm = next(e for e in events if e.name == Ev.WARM_CACHE and (e.args or {}).get("user_words"))
    assert warm.args["stopped"] is True
    endpoint = next(e for e in events if e.name == Ev.ENDPOINT)
    assert warm.ts_ns + warm.dur_ns < endpoint.ts_ns  # it gave way before the turn even ended


async def test_a_warmer_that_takes_no_stop_still_reads_ahead(tmp_path):
    class OlderWarmer(ScriptedLLM):  # a user's model whose `warm` takes no stop
        def warm(self, messages) -> None:
            self.warmed.append([dict(m) for m in messages])

    llm = OlderWarmer("Four legs.")
    session, _, tracer = await converse(tmp_path, [turn(with_silence(burst(0.8)))],
                                        ScriptedRecognizer(["how many legs"], guesses={0: ("how many", "how")}), llm)
    (rec,) = list(session.records)
    assert rec.reply_text == "Four legs."
    assert any(m[-1]["content"] == "How many?" for m in llm.warmed)  # the partial was read ahead
    assert not [e for e in tracer.events() if e.name == Ev.WARM_CACHE and (e.args or {}).get("error")]
