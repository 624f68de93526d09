"""A phone call through `duplex serve`'s Twilio endpoint, with the real default models.

The test plays Twilio's part of a bidirectional media stream: it sends the caller's audio as
8 kHz mu-law at real-time pace (encoded with audioop, not our codec), plays what the bot sends
on its own 20 ms clock, echoes each mark when playback reaches it, and on `clear` drops its
queue and hands back the queued marks, as Twilio does. The caller asks a question, asks for a
story and talks over it.
"""
from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import time
import warnings
from collections import deque
from pathlib import Path

import numpy as np
import pytest

from helpers import free_port, say, silence
from test_browser_e2e import wait_http

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    audioop = pytest.importorskip("audioop")

pytestmark = pytest.mark.models
SID = "MZ00000000000000000000000000000001"
FRAME = 160  # 20 ms at 8 kHz
STORYTELLER = ("You are a storyteller. Answer every request with a long, detailed story of at least "
               "ten sentences. Answer questions in one sentence.")


class FakeTwilio:
    """Twilio's side of one media stream (see the module docstring)."""

    def __init__(self, ws):
        self.ws = ws
        self.queue: deque = deque()  # ("audio", int16 samples) | ("mark", name), in arrival order
        self.played: list[np.ndarray] = []  # the caller's earpiece, one 20 ms frame per tick
        self.log: list[tuple[float, str, object]] = []  # (seconds since the call began, kind, data)
        self.t0 = 0.0
        self.seq = 0

    def now(self) -> float:
        return time.perf_counter() - self.t0

    async def send(self, event: str, **body) -> None:
        self.seq += 1
        await self.ws.send(json.dumps({"event": event, "sequenceNumber": str(self.seq), "streamSid": SID, **body}))

    async def echo(self, name: str) -> None:
        self.log.append((self.now(), "echo", name))
        await self.send("mark", mark={"name": name})

    async def call(self, caller_8k: np.ndarray) -> None:
        await self.ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
        await self.send("start", start={"streamSid": SID, "accountSid": "AC0", "callSid": "CA0", "tracks": ["inbound"],
                                        "customParameters": {},
                                        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}})
        self.t0 = time.perf_counter()
        reader = asyncio.create_task(self.read())
        pcm = (np.clip(caller_8k, -1, 1) * 32767).astype(np.int16)
        for i in range(0, pcm.size - FRAME + 1, FRAME):
            due = self.t0 + (i // FRAME) * 0.02
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            payload = audioop.lin2ulaw(pcm[i:i + FRAME].tobytes(), 2)
            await self.send("media", media={"track": "inbound", "chunk": str(i // FRAME + 1),
                                            "timestamp": str(i // 8), "payload": base64.b64encode(payload).decode()})
            await self.play_one_frame()
        await self.send("stop", stop={"accountSid": "AC0", "callSid": "CA0"})
        reader.cancel()

    async def read(self) -> None:
        async for message in self.ws:
            msg = json.loads(message)
            kind = msg["event"]
            assert msg["streamSid"] == SID
            if kind == "media":
                pcm = np.frombuffer(audioop.ulaw2lin(base64.b64decode(msg["media"]["payload"]), 2), np.int16)
                self.queue.append(("audio", pcm))
                self.log.append((self.now(), "media", pcm.size))
            elif kind == "mark":
                self.queue.append(("mark", msg["mark"]["name"]))
                self.log.append((self.now(), "mark", msg["mark"]["name"]))
            elif kind == "clear":
                self.log.append((self.now(), "clear", None))
                marks = [x for k, x in self.queue if k == "mark"]
                self.queue.clear()
                for name in marks:  # Twilio returns the marks that were still queued
                    await self.send("mark", mark={"name": name})

    async def play_one_frame(self) -> None:
        out = np.zeros(0, np.int16)
        while self.queue and out.size < FRAME:
            kind, item = self.queue[0]
            if kind == "mark":
                self.queue.popleft()
                await self.echo(item)
                continue
            take = item[:FRAME - out.size]
            out = np.concatenate([out, take])
            if take.size == item.size:
                self.queue.popleft()
            else:
                self.queue[0] = ("audio", item[take.size:])
        while self.queue and self.queue[0][0] == "mark":  # marks right after this frame's audio
            await self.echo(self.queue.popleft()[1])
        self.played.append(np.pad(out, (0, FRAME - out.size)))


@pytest.fixture(scope="module")
def phone_call(tmp_path_factory):
    import websockets

    from transport.audio import resample

    d = tmp_path_factory.mktemp("phone")
    parts = {"lead": silence(1.0), "q1": say("What is the capital of France?", d / "q1.wav"), "gap1": silence(8.0),
             "q2": say("Please tell me a long story about a brave little dragon.", d / "q2.wav"),
             "gap2": silence(3.0), "barge_in": say("Stop, stop. Wait a moment please.", d / "bi.wav"),
             "tail": silence(7.0)}
    marks, t = {}, 0.0
    for name, p in parts.items():
        marks[name] = (t, t + p.size / 16000)
        t += p.size / 16000
    caller = resample(np.concatenate(list(parts.values())), 16000, 8000)

    port = free_port()
    cmd = [sys.executable, "-m", "agent.cli", "serve", "--port", str(port), "--llm", "smollm2-135m",
           "--trace-dir", str(d), "--max-tokens", "300", "--system-prompt", STORYTELLER]
    proc = subprocess.Popen(cmd, env=dict(os.environ, PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/", proc)

        async def talk() -> FakeTwilio:
            async with websockets.connect(f"ws://127.0.0.1:{port}/twilio") as ws:
                twilio = FakeTwilio(ws)
                await twilio.call(caller)
                return twilio

        twilio = asyncio.run(talk())
        trace = d / "twilio0.trace.json"
        deadline = time.time() + 30
        while not trace.exists() and time.time() < deadline:
            time.sleep(0.2)
    finally:
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        print(out[-3000:])
    from agent.trace_export import load_events

    return twilio, marks, load_events(str(trace))


def test_the_caller_is_understood_and_hears_the_answer(phone_call):
    from asr.whisper import WhisperRecognizer
    from asr.wer import wer
    from transport.audio import resample

    twilio, marks, events = phone_call
    finals = [e for e in events if e.stage == "asr" and e.name == "final" and e.args.get("text")]
    assert finals, "nothing the caller said was recognised"
    first = finals[0].args["text"].lower()
    assert "capital" in first and "france" in first, first  # 8 kHz mu-law in, decoded and resampled

    # what the caller heard between the question and the story request is the bot's answer
    played = np.concatenate(twilio.played).astype(np.float32) / 32768
    answer = played[int(marks["q1"][1] * 8000):int(marks["q2"][0] * 8000)]
    assert np.sqrt(np.mean(answer ** 2)) > 0.01, "the caller heard nothing after the question"
    reply = "".join(e.args["text"] for e in events if e.stage == "llm" and e.name == "token" and e.turn == finals[0].turn)
    heard = WhisperRecognizer.load().transcribe(resample(answer, 8000, 16000))[0]
    print("reply:", reply, "| caller heard:", heard)
    assert wer(reply, heard) < 0.5, (reply, heard)


def test_marks_tell_the_server_what_was_played(phone_call):
    twilio, marks, events = phone_call
    echoed = {int(x[1:]): t for t, k, x in twilio.log if k == "echo" and x.startswith("s")}
    traced = {e.args["chunk"] for e in events if e.stage == "client" and e.name == "playout_start"}
    assert echoed and traced <= set(echoed)
    # an echo still on the wire when the server sent `clear` is dropped with the cleared marks
    # (Twilio's echoes do not say which were reached and which were cleared); only those
    clears = [t for t, k, _ in twilio.log if k == "clear"]
    late = [cid for cid in set(echoed) - traced if not any(0 <= c - echoed[cid] < 0.3 for c in clears)]
    assert not late, late


def test_talking_over_the_bot_clears_twilios_buffer(phone_call):
    twilio, marks, events = phone_call
    clears = [t for t, k, _ in twilio.log if k == "clear"]
    assert clears, "speaking over the story did not clear Twilio's buffer"
    barge_start = marks["barge_in"][0]
    assert barge_start < clears[0] < barge_start + 1.5, (barge_start, clears)
    # nothing queued before the clear plays after it: marks echoed later name newer pieces only
    sent_before = {int(x[1:]) for t, k, x in twilio.log if k == "mark" and t <= clears[0]}
    played_after = {int(x[1:]) for t, k, x in twilio.log if k == "echo" and t > clears[0] and x.startswith("s")}
    assert not played_after & sent_before, sorted(played_after & sent_before)[:5]
    # the story's context keeps only what the caller heard: a strict prefix of the reply
    interrupted = [e for e in events if e.stage == "turn" and e.name == "interrupted"]
    assert interrupted
    turn = interrupted[0].turn
    reply = "".join(e.args["text"] for e in events if e.stage == "llm" and e.name == "token" and e.turn == turn).split()
    heard = interrupted[0].args["heard"].split()
    assert heard and len(heard) < len(reply) and reply[:len(heard)] == heard, (heard, reply)

