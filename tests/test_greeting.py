"""A greeting (`--greeting`) through `duplex run` with the real models: the bot speaks first, before
the user says anything, and the context starts with what it said."""
import json
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from helpers import is_word_prefix, say, silence

pytestmark = pytest.mark.models
GREETING = "Hello! How can I help you today?"


def run_with_greeting(tmp_path, lead_s: float):
    """`duplex run --greeting` on one question that starts after `lead_s` of silence."""
    question = say("What is the capital of France?", tmp_path / "q.raw.wav")
    wav = tmp_path / "q.wav"
    sf.write(wav, np.concatenate([silence(lead_s), question, silence(0.3)]), 16000, subtype="PCM_16")
    out, log, far = tmp_path / "bot.wav", tmp_path / "log.jsonl", tmp_path / "far_end.jsonl"
    cmd = [sys.executable, "-m", "agent.cli", "run", "--input", str(wav), "--output", str(out), "--log", str(log),
           "--far-end-log", str(far), "--llm", "smollm2-135m", "--greeting", GREETING]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    events = [json.loads(line) for line in far.read_text().splitlines()]
    return [r for r in rows if "turn" in r], rows[-1], out, events


def played_starts(events: list[dict]) -> list[tuple[float, str]]:
    """(timeline second, text) of each piece of reply audio as the far end started playing it, in
    order, with the words the session says that piece speaks ('' for none)."""
    text = {e["id"]: e["text"] for e in events if e["type"] == "audio"}
    return [(e["t"], text[e["id"]]) for e in events if e["type"] == "played"]


def test_the_greeting_is_heard_first_and_kept_as_the_first_message(tmp_path):
    from asr.wer import wer
    from asr.whisper import WhisperRecognizer
    from transport.audio import resample

    lead_s = 3.5
    turns, summary, out, events = run_with_greeting(tmp_path, lead_s)
    greeting, answer = turns[0], turns[1]
    assert greeting["user"] == "" and greeting["reply"] == GREETING and not greeting["interrupted"]
    assert greeting["voice_to_voice_ms"] is None  # no user speech to measure from
    assert "capital" in answer["user"].lower() and answer["reply"] and answer["voice_to_voice_ms"] > 0
    assert summary["history"][0] == {"role": "assistant", "content": GREETING}
    assert summary["history"][1] == {"role": "user", "content": answer["user"]}
    # heard first: the far end started playing the greeting before the user spoke...
    starts = played_starts(events)
    said = [" ".join(" ".join(text for _, text in starts[:n]).split()) for n in range(len(starts) + 1)]
    assert starts[0][0] < lead_s and GREETING in said, starts
    # ...and it is intelligible: the bot's channel from its first piece to the end of the piece that
    # completes its last word (a piece is ~0.1 s; 0.4 s of margin) is the greeting
    last = starts[said.index(GREETING) - 1][0]
    audio, rate = sf.read(out, dtype="float32")
    span = audio[int(starts[0][0] * rate):int((last + 0.4) * rate)]
    heard = WhisperRecognizer.load().transcribe(resample(span, rate, 16000))[0]
    assert wer([GREETING], [heard]) <= 0.3, (heard, starts)


def test_talking_over_the_greeting_keeps_only_what_was_heard(tmp_path):
    turns, summary, _, _ = run_with_greeting(tmp_path, lead_s=0.6)
    greeting, answer = turns[0], turns[1]
    assert greeting["interrupted"], turns
    heard = greeting["heard"].split()
    assert is_word_prefix(greeting["heard"], GREETING, strict=True), heard
    first = summary["history"][0]
    if heard:  # the user may cut in before a word of it played: then the context has none of it
        assert first == {"role": "assistant", "content": greeting["heard"]}
    else:
        assert first["role"] == "user"
    assert "capital" in answer["user"].lower() and answer["reply"]
