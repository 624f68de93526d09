"""A rumble over the bot (a bump on the microphone) pauses it; the recognizer finds no words in it,
so the bot resumes from where its audio stopped. Real ASR, LLM and TTS. The VAD here is a plain
energy detector, the kind that fires on noise: Silero rarely takes such noise for speech, and that
false positive is the case under test."""
import asyncio

import numpy as np
import pytest
import soundfile as sf

from doubles import EnergyVAD
from helpers import say, silence

pytestmark = pytest.mark.models


def rumble(seconds: float) -> np.ndarray:
    """Brown noise: low-frequency rumble that Whisper transcribes as nothing."""
    x = np.cumsum(np.random.default_rng(0).standard_normal(int(seconds * 16000))) / 300
    return (x - x.mean()).astype(np.float32)


def test_noise_interrupts_then_the_bot_resumes(tmp_path):
    from agent.conversation.models import load_models
    from agent.conversation.session import Session, SessionConfig
    from agent.tracing.trace import Ev, Stage, Tracer
    from transport.wavfile import ScriptedTurn, WavConversationTransport

    story = np.concatenate([silence(0.4), say("Please tell me a long story about a brave little dragon.",
                                               tmp_path / "s.wav"), silence(0.2)])
    turns = [ScriptedTurn(story, 16000, "story"), ScriptedTurn(rumble(1.5), 16000, "rumble", start_after_s=4.5)]
    models = load_models()
    models.vad_factory = EnergyVAD
    config = SessionConfig(max_tokens=60, system_prompt=(
        "You are a storyteller. Answer every request with a long, detailed story of at least ten sentences."))
    transport = WavConversationTransport(turns, models.tts.sample_rate, str(tmp_path / "bot.wav"),
                                         reply_timeout_s=120)  # the whole story plays, on a loaded CPU too
    tracer = Tracer("t")
    session = Session(models, transport, config, tracer=tracer)
    asyncio.run(session.run())
    transport.close()

    names = [(e.stage, e.name) for e in tracer.events()]
    assert (Stage.TURN, Ev.BARGE_IN) in names, "the rumble did not pause the bot"
    assert (Stage.TURN, Ev.RESUME) in names, "the bot did not resume after a wordless interruption"
    first = session.records[0]
    # resumed where its audio stopped, the reply was heard whole, once: not cut, not repeated
    assert not first.interrupted and first.reply_text and first.heard_text == first.reply_text
    assert [m for m in session.history if m["role"] == "assistant"] == [{"role": "assistant", "content": first.reply_text}]
    user = [m["content"] for m in session.history if m["role"] == "user"]
    assert user == [first.user_text]
    # the rumble was no turn to answer (its utterance ended with no words, or the timeout resumed first)
    assert len(session.records) <= 2 and not any(r.user_text for r in list(session.records)[1:])
    # and the bot was heard again after the rumble
    audio, rate = sf.read(tmp_path / "bot.wav", dtype="float32")
    after = audio[int((transport.input_end_times[1] + 0.5) * rate):]
    assert np.sqrt(np.mean(after ** 2)) > 0.01, "no audio after the resume"
