"""The far end hangs up (the script ends) while the bot is still answering: the turn keeps the
user's words and what was heard of the reply, in its record and in the context, as after a
barge-in. Real ASR, LLM and TTS; the scripted far end gives up `reply_timeout_s` after its input,
long before the reply could be over."""
import asyncio

import numpy as np
import pytest

from helpers import is_word_prefix, say, silence

pytestmark = pytest.mark.models


def run_script(tmp_path, turns, reply_timeout_s: float, **config):
    from agent.models import load_models
    from agent.session import Session, SessionConfig
    from agent.trace import Tracer
    from transport.wavfile import WavConversationTransport

    models = load_models()
    transport = WavConversationTransport(turns, models.tts.sample_rate, str(tmp_path / "bot.wav"),
                                         reply_timeout_s=reply_timeout_s)
    tracer = Tracer("t")
    session = Session(models, transport, SessionConfig(**config), tracer=tracer)
    asyncio.run(session.run())
    transport.close()
    return session, tracer


def test_hanging_up_during_the_greeting_keeps_what_was_heard_of_it(tmp_path):
    from transport.wavfile import ScriptedTurn

    greeting = ("Hello and welcome to the city library. I can renew your books, tell you our opening hours, "
                "book a room for your study group, or help you find a title in the catalogue.")
    session, tracer = run_script(tmp_path, [ScriptedTurn(silence(1.0), 16000, "hello?")], reply_timeout_s=4.0,
                                 greeting=greeting)
    rec = session.records[0]
    assert rec.interrupted and rec.reply_text == greeting
    heard = rec.heard_text
    assert heard and is_word_prefix(heard, greeting, strict=True), heard
    assert session.history == [{"role": "assistant", "content": heard}]
    cut = [e for e in tracer.events() if e.name == "interrupted"]
    assert [e.args["why"] for e in cut] == ["session ended"]


def test_hanging_up_before_the_answer_is_over_keeps_the_question(tmp_path):
    from transport.wavfile import ScriptedTurn

    question = np.concatenate([silence(0.4), say("Please tell me a long story about a brave little dragon.",
                                                 tmp_path / "q.wav"), silence(0.2)])
    session, _ = run_script(tmp_path, [ScriptedTurn(question, 16000, "story")], reply_timeout_s=4.0, max_tokens=160,
                            system_prompt="You are a storyteller. Answer every request with a long, detailed "
                                          "story of at least ten sentences.")
    assert len(session.records) == 1
    rec = session.records[0]
    assert "long story" in rec.user_text.lower() and rec.interrupted
    assert is_word_prefix(rec.heard_text, rec.reply_text), (rec.heard_text, rec.reply_text)
    expected = [{"role": "user", "content": rec.user_text}]
    if rec.heard_text:  # the far end may hang up before a word of the answer played
        expected.append({"role": "assistant", "content": rec.heard_text})
    assert session.history == expected
    assert rec.summary()["user"] == rec.user_text and rec.summary()["interrupted"]
