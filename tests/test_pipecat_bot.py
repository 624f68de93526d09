"""examples/pipecat_bot.py answers a spoken question from a client over pipecat's own WebSocket
transport (protobuf frames); the reply audio, transcribed back, says the reply's text."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import CAPITAL_QUESTION, await_until, closest, flite_available, free_port, hear_answer, say

pytestmark = [pytest.mark.models, pytest.mark.skipif(not flite_available(), reason="flite is missing")]


async def _ask(url: str, question: np.ndarray, rate: int = 16000, timeout: float = 90.0):
    """Speak `question` (then silence) at real time; collect the bot's audio and its reply text."""
    import websockets
    from pipecat.frames.frames import InputAudioRawFrame, InputTransportMessageFrame
    from pipecat.serializers.protobuf import ProtobufFrameSerializer

    ser = ProtobufFrameSerializer()
    audio: list[bytes] = []
    out_rate = [0]
    replies: list[str] = []
    t_end_of_speech = [0.0]
    t_first_audio = [0.0]

    async with websockets.connect(url, max_size=None) as ws:
        async def send():
            pcm = (np.clip(np.concatenate([question, np.zeros(4 * rate, np.float32)]), -1, 1) * 32767).astype(np.int16)
            step = rate // 50
            t0 = time.perf_counter()
            for n, i in enumerate(range(0, pcm.size, step)):
                from pipecat.frames.frames import OutputAudioRawFrame

                await ws.send(await ser.serialize(OutputAudioRawFrame(pcm[i:i + step].tobytes(), rate, 1)))
                if i + step >= question.size and not t_end_of_speech[0]:
                    t_end_of_speech[0] = time.perf_counter()
                # real time: 20 ms a frame
                await asyncio.sleep(max(0.0, t0 + (n + 1) * 0.02 - time.perf_counter()))
            while not replies:  # then silence until the reply text came
                await ws.send(await ser.serialize(OutputAudioRawFrame(bytes(2 * step), rate, 1)))
                await asyncio.sleep(0.02)

        async def receive():
            async for message in ws:
                frame = await ser.deserialize(message)
                if isinstance(frame, InputAudioRawFrame):
                    if not t_first_audio[0]:
                        t_first_audio[0] = time.perf_counter()
                    audio.append(frame.audio)
                    out_rate[0] = frame.sample_rate
                elif isinstance(frame, InputTransportMessageFrame):
                    msg = frame.message if isinstance(frame.message, dict) else json.loads(frame.message)
                    if msg.get("type") == "bot-reply":
                        replies.append(msg["text"])

        sender, receiver = asyncio.create_task(send()), asyncio.create_task(receive())
        try:
            # the reply has been spoken: its text came, and its audio, then none for 1.5 s
            await await_until(lambda: receiver.done() or (replies and audio and _quiet_for(audio)), timeout)
        finally:
            sender.cancel()
            receiver.cancel()
    return b"".join(audio), out_rate[0], replies, t_first_audio[0] - t_end_of_speech[0]


_last = {"n": 0, "t": 0.0}


def _quiet_for(audio: list[bytes], seconds: float = 1.5) -> bool:
    """No new audio for `seconds`."""
    if len(audio) != _last["n"]:
        _last.update(n=len(audio), t=time.perf_counter())
    return time.perf_counter() - _last["t"] > seconds


@pytest.mark.timeout(240)
async def test_bot_answers_a_spoken_question(tmp_path):
    from asr.wer import cer, wer

    port = free_port()
    cmd = [sys.executable, "-m", "examples.pipecat_bot", "--port", str(port), "--llm", "smollm2-135m"]
    proc = subprocess.Popen(cmd, env=dict(os.environ, PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,  # noqa: ASYNC220
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the bot exited with {proc.wait()}")
            if "pipecat bot: serving on" in line:
                break
        question = say(CAPITAL_QUESTION, tmp_path / "q.wav")
        audio, rate, replies, v2v = await _ask(f"ws://127.0.0.1:{port}", question)
    finally:
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        print(out[-6000:])
    assert replies and audio, "no reply"
    reply = replies[0]
    pcm = np.frombuffer(audio, np.int16).astype(np.float32) / 32768
    heard = closest(hear_answer(pcm, rate, CAPITAL_QUESTION), reply)
    score = cer([reply], [heard])
    print(f"reply {reply!r}, heard {heard!r}, CER {score:.3f}, WER {wer([reply], [heard]):.3f}, "
          f"voice-to-voice {v2v:.2f} s")
    assert score < 0.2  # letters: see tests/test_local_audio.py
