"""A greeting (`--greeting`) through `duplex run` with the real models: the bot speaks first, before
the user says anything, and the context starts with what it said."""
import json
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from helpers import say, silence

pytestmark = pytest.mark.models
GREETING = "Hello! How can I help you today?"


def run_with_greeting(tmp_path, lead_s: float):
    """`duplex run --greeting` on one question that starts after `lead_s` of silence."""
    question = say("What is the capital of France?", tmp_path / "q.raw.wav")
    wav = tmp_path / "q.wav"
    sf.write(wav, np.concatenate([silence(lead_s), question, silence(0.3)]), 16000, subtype="PCM_16")
    out, log = tmp_path / "bot.wav", tmp_path / "log.jsonl"
    cmd = [sys.executable, "-m", "agent.cli", "run", "--input", str(wav), "--output", str(out), "--log", str(log),
           "--llm", "smollm2-135m", "--greeting", GREETING]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    return [r for r in rows if "turn" in r], rows[-1], out


def test_the_greeting_is_heard_first_and_kept_as_the_first_message(tmp_path):
    from asr.wer import wer
    from asr.whisper import WhisperRecognizer
    from transport.audio import resample

    turns, summary, out = run_with_greeting(tmp_path, lead_s=3.5)
    greeting, answer = turns[0], turns[1]
    assert greeting["user"] == "" and greeting["reply"] == GREETING and not greeting["interrupted"]
    assert greeting["voice_to_voice_ms"] is None  # no user speech to measure from
    assert "capital" in answer["user"].lower() and answer["reply"] and answer["voice_to_voice_ms"] > 0
    assert summary["history"][0] == {"role": "assistant", "content": GREETING}
    assert summary["history"][1] == {"role": "user", "content": answer["user"]}
    # heard before the user spoke: the bot's channel up to the question is the greeting
    audio, rate = sf.read(out, dtype="float32")
    heard = WhisperRecognizer.load().transcribe(resample(audio[:int(3.4 * rate)], rate, 16000))[0]
    assert wer([GREETING], [heard]) <= 0.3, heard


def test_talking_over_the_greeting_keeps_only_what_was_heard(tmp_path):
    turns, summary, _ = run_with_greeting(tmp_path, lead_s=0.6)
    greeting, answer = turns[0], turns[1]
    assert greeting["interrupted"], turns
    heard = greeting["heard"].split()
    assert len(heard) < len(GREETING.split()) and GREETING.split()[:len(heard)] == heard, heard
    first = summary["history"][0]
    if heard:  # the user may cut in before a word of it played: then the context has none of it
        assert first == {"role": "assistant", "content": greeting["heard"]}
    else:
        assert first["role"] == "user"
    assert "capital" in answer["user"].lower() and answer["reply"]
