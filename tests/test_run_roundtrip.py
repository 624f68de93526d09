"""`duplex run` end to end with the real models: a reply WAV comes out, and transcribing it back
gives the reply text that was logged."""
import json
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from asr.wer import wer
from helpers import say, silence

pytestmark = pytest.mark.models


def test_duplex_run_reply_wav_matches_logged_text(tmp_path):
    q1 = say("What is the capital of France?", tmp_path / "q1.wav")
    q2 = say("How many legs does a spider have?", tmp_path / "q2.wav")
    for name, q in (("q1", q1), ("q2", q2)):
        sf.write(tmp_path / f"{name}.wav", np.concatenate([silence(0.5), q, silence(0.3)]), 16000, subtype="PCM_16")
    out, log = tmp_path / "reply.wav", tmp_path / "turns.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "agent.cli", "run", "--input", str(tmp_path / "q1.wav"),
         "--input", str(tmp_path / "q2.wav"), "--output", str(out), "--log", str(log), "--llm", "smollm2-135m"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    turns = [r for r in rows if "turn" in r]
    assert len(turns) == 2
    assert "capital" in turns[0]["user"].lower() and "spider" in turns[1]["user"].lower()
    assert all(t["reply"].strip() and t["voice_to_voice_ms"] > 0 for t in turns)

    audio, rate = sf.read(out, dtype="float32")
    assert audio.size > rate and np.abs(audio).max() > 0.05, "the reply WAV is silent"
    from asr import load_recognizer
    from transport.audio import resample

    rec = load_recognizer()
    stream = rec.open_stream()
    heard = []
    x = resample(audio, rate, 16000)
    for i in range(0, x.size, 16000 * 20):  # the recognizer takes at most ~28 s at once
        stream.push(x[i:i + 16000 * 20])
        heard.append(stream.finalize().text)
    spoken = " ".join(t["reply"] for t in turns)
    score = wer([spoken], [" ".join(heard)])
    print("logged:", spoken, "\nheard: ", " ".join(heard), f"\nWER {score:.2f}")
    assert score <= 0.25
