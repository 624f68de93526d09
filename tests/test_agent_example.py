"""The README's agent, examples/weather_agent.py, run as a user would: `duplex run --agent` with the
bundled models, a flite question, and the reply audio transcribed back. The bundled LLM must call
the tool with the right argument, and the caller must hear the tool's answer."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from helpers import closest, hear_answer, say, silence

pytestmark = pytest.mark.models
EXAMPLE = Path(__file__).parent.parent / "examples" / "weather_agent.py"
QUESTION = "What's the weather in Paris?"


def test_the_example_agent_answers_with_its_tools_result(tmp_path):
    q = say(QUESTION, tmp_path / "q.raw.wav")
    # the call's first seconds give the session time to read the tools' descriptions (~300 tokens:
    # seconds on a busy 2-core machine); this test is about what the model does, not how fast
    sf.write(tmp_path / "q.wav", np.concatenate([silence(4.0), q, silence(0.5)]), 16000, subtype="PCM_16")
    out, log = tmp_path / "reply.wav", tmp_path / "turns.jsonl"
    proc = subprocess.run([sys.executable, "-m", "agent.serving.cli", "run", "--agent", f"{EXAMPLE}:agent",
                           "--input", str(tmp_path / "q.wav"), "--output", str(out), "--log", str(log),
                           "--reply-timeout", "120"],
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    summary = rows[-1]
    calls = [c["function"] for m in summary["history"] if m.get("tool_calls") for c in m["tool_calls"]]
    assert [c["name"] for c in calls] == ["get_weather"], summary["history"]
    assert json.loads(calls[0]["arguments"])["city"].strip().lower() == "paris"
    results = [m["content"] for m in summary["history"] if m["role"] == "tool"]
    assert results == ["sunny and 24 degrees"]

    audio, rate = sf.read(out, dtype="float32")
    heard = closest(hear_answer(audio[:rate * 25], rate, QUESTION), rows[0]["reply"]).lower()
    print("reply:", rows[0]["reply"], "| heard:", heard)
    assert "sunny" in heard and ("24" in heard or "twenty-four" in heard or "twenty four" in heard)
