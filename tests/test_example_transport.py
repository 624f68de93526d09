"""docs/extending.md's "A transport" example (examples/pcm_tcp_transport.py), as an integrator
would use it: registered on duplex serve's own Server and reached over a real TCP socket. With
the test doubles: a conversation is answered, paced at real time, counted, and a barge-in cuts
the reply. With the default models, through `duplex serve --listener`: a spoken question gets a
spoken answer that Whisper can read."""
from __future__ import annotations

import asyncio
import dataclasses
import time

import numpy as np
import pytest

from doubles import ScriptedLLM, burst
from examples.pcm_tcp_transport import RATE, listener
from helpers import CAPITAL_QUESTION, await_until, duplex_serve_process, flite_available, free_port, hear_answer, say
from test_serving import doubles, metric_samples, question, serving

pytestmark = pytest.mark.usefixtures("virtual_clock")


async def talk(port: int, audio: np.ndarray, quiet_s: float = 1.5, max_s: float = 60.0) -> tuple[bytes, float]:
    """Send `audio` at real time in 20 ms frames, then silence, until the reply has begun and
    nothing more came for `quiet_s` (or `max_s` in all); what came back, and how long the reply
    audio took to arrive from its first byte to its last."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    got, times = bytearray(), []

    async def read() -> None:
        while data := await reader.read(4096):
            got.extend(data)
            times.append(time.perf_counter())

    reading = asyncio.create_task(read())
    pcm = (np.clip(audio, -1, 1) * 32767).astype(np.int16)
    start = time.perf_counter()
    for i in range(int(max_s / 0.02)):
        frame = pcm[i * 320:(i + 1) * 320]
        writer.write(np.pad(frame, (0, 320 - len(frame))).tobytes())
        await writer.drain()
        now = time.perf_counter()
        if (i + 1) * 320 >= len(pcm) and times and now - times[-1] > quiet_s:
            break
        await asyncio.sleep(max(0.0, start + (i + 1) * 0.02 - now))
    writer.close()
    await asyncio.wait_for(reading, 10)
    return bytes(got), (times[-1] - times[0]) if times else 0.0


def voiced_seconds(data: bytes) -> float:
    """Seconds of the reply that are not silence (the pacer sends only audio it was given)."""
    pcm = np.frombuffer(data, "<i2").astype(np.float32)
    frames = pcm[:len(pcm) // 320 * 320].reshape(-1, 320)
    return float((np.abs(frames).max(axis=1) > 1000).sum() * 0.02)


async def test_a_conversation_over_raw_pcm_is_answered_at_real_time_and_counted():
    port = free_port()
    async with serving(listeners={"pcm": listener(str(port))}) as s:
        data, spread = await talk(port, question())
        assert await await_until(lambda: s.admission.live == 0, timeout=10)
        samples = await metric_samples(s.port)
    # "It is noon.": the doubles' voice speaks 0.12 s a word
    assert voiced_seconds(data) == pytest.approx(0.36, abs=0.06)
    assert spread >= 0.3  # paced at real time, not written in one burst
    assert samples[("duplex_sessions_total", (("result", "served"),))] == 1
    assert samples[("duplex_voice_to_voice_seconds_count", ())] == 1


async def test_speaking_over_the_reply_cuts_it():
    replies = iter([" ".join(["word"] * 60) + ".", "Okay."])  # 7.2 s of the doubles' voice, then 0.12 s
    models = dataclasses.replace(doubles(), llm=ScriptedLLM(lambda user: next(replies)))
    port = free_port()
    async with serving(listeners={"pcm": listener(str(port))}, models=models) as s:
        interruption = np.zeros(int(4.5 * RATE), np.float32)
        interruption[int(3.5 * RATE):] = burst(1.0, seed=2)  # ~1.5 s into the reply
        audio = np.concatenate([question(), interruption])
        data, _ = await talk(port, audio)
        assert await await_until(lambda: s.admission.live == 0, timeout=10)
    assert 0.5 < voiced_seconds(data) < 5.0  # the story cut ~1.5 s in, then "Okay."


@pytest.mark.models
@pytest.mark.skipif(not flite_available(), reason="flite is not installed")
def test_duplex_serve_listener_flag_answers_a_spoken_question(tmp_path):
    pcm_port = free_port()
    question_audio = say(CAPITAL_QUESTION, tmp_path / "q.wav")
    with duplex_serve_process("--listener", f"examples.pcm_tcp_transport:listener={pcm_port}",
                              "--load-threshold", "0") as (_, proc):
        data, _ = asyncio.run(talk(pcm_port, question_audio, quiet_s=3.0, max_s=90.0))
        assert proc.poll() is None
    reply = np.frombuffer(data, "<i2").astype(np.float32) / 32768
    assert voiced_seconds(data) > 0.3  # its first words at least (a loaded machine may be slow with the rest)
    heard = hear_answer(reply, 16000, CAPITAL_QUESTION)
    assert any("paris" in h.lower() for h in heard), heard  # the answer, however short ("Paris.")
