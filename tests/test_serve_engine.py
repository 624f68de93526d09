"""`duplex serve --asr DIR` with the in-process engine: browser-protocol conversations at once, one
engine slot each, one batched step per frame for all of them, a freed slot reused by the next
conversation, a clear refusal beyond the slots, and the words each conversation gets are the
words the engine gives for that audio alone.

DIR is a tiny random checkpoint written as `python -m asr.kyutai --save-tiny DIR --words` does
(loaded through `from_pretrained`, as a hub id is); the LLM and voice are test doubles."""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from websockets.asyncio.client import connect

from agent.config import Models
from agent.listener import Listener, UserTranscript
from agent.session import Session, SessionConfig
from agent.trace import NullTracer
from asr.engine_recognizer import EngineRecognizer
from asr.kyutai import save_tiny
from doubles import EnergyVAD, ScriptedLLM, ToneVoice, burst
from helpers import await_until, free_port
from transport.base import AudioIn
from transport.web.server import run_server

RATE = 16000
SLOTS = 4
FRAME = 320  # 20 ms, as the page sends


def clip(seed: int) -> np.ndarray:
    return np.concatenate([np.zeros(int(0.3 * RATE), np.float32), burst(2.0, seed=seed),
                           np.zeros(int(1.2 * RATE), np.float32)])


def config() -> SessionConfig:
    cfg = SessionConfig(speculate=False)
    cfg.turns.use_eou = False
    return cfg


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny") / "stt", seed=0, words=True)


async def reference_words(checkpoint, audio: np.ndarray) -> list[str]:
    """The turn's words from the same engine, this audio alone in it (its own listener, fed as
    the server's is: the same 20 ms pieces, the same VAD and turn rules)."""
    asr = EngineRecognizer.load(checkpoint, slots=1)
    finals: list[UserTranscript] = []

    async def emit(ev):
        if isinstance(ev, UserTranscript):
            finals.append(ev)

    listener = Listener(asr, EnergyVAD(), None, config().listener(), NullTracer(), emit)
    await listener.open()
    for i in range(0, audio.size, FRAME):
        await listener.on_audio(AudioIn(audio[i:i + FRAME], RATE))
    assert await await_until(lambda: finals, timeout=30)
    await listener.close()
    await asr.aclose()
    return [w.text for w in finals[0].words]


async def talk(port: int, audio: np.ndarray, log: list[dict], hold: asyncio.Event | None = None) -> None:
    """A browser-protocol client: hello, the audio at real time, then (optionally) stays until `hold`."""
    async with connect(f"ws://127.0.0.1:{port}/ws", max_size=1 << 22) as ws:
        await ws.send(json.dumps({"type": "hello", "sample_rate": RATE}))

        async def read():
            async for msg in ws:
                if isinstance(msg, str):
                    log.append(json.loads(msg))

        reader = asyncio.create_task(read())
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for k, i in enumerate(range(0, audio.size, FRAME)):
            pcm16 = (np.clip(audio[i:i + FRAME], -1, 1) * 32767).astype("<i2")
            await ws.send(pcm16.tobytes())
            await asyncio.sleep(max(0.0, t0 + (k + 1) * FRAME / RATE - loop.time()))
        await await_until(lambda: any(e["type"] in ("bot_done", "error") for e in log), timeout=30)
        if hold is not None:
            await hold.wait()
        reader.cancel()


async def test_conversations_share_the_engine_one_slot_each(checkpoint):
    asr = EngineRecognizer.load(checkpoint, slots=SLOTS)
    models = Models(asr=asr, llm=ScriptedLLM("OK."), tts=ToneVoice(), vad_factory=EnergyVAD)
    sessions: list[Session] = []

    async def handler(transport):
        session = Session(models, transport, config(), session_id=f"web{len(sessions)}")
        sessions.append(session)
        await session.run()

    port = free_port()
    ready = asyncio.Event()
    server = asyncio.create_task(run_server(handler, "127.0.0.1", port, 16000, ready))
    await ready.wait()
    try:
        audio = [clip(seed) for seed in range(SLOTS)]
        logs: list[list[dict]] = [[] for _ in range(SLOTS)]
        hold = asyncio.Event()
        clients = [asyncio.create_task(talk(port, a, log, hold)) for a, log in zip(audio, logs)]
        assert await await_until(lambda: len(sessions) == SLOTS and all(
            any(e["type"] == "bot_done" for e in log) for log in logs), timeout=60)
        sched = asr.scheduler

        # each conversation held its own slot
        slots = [s.listener.stream.link.session.slot for s in sessions]
        assert sorted(slots) == list(range(SLOTS))

        # one batched step per frame for all of them: the ticks are about one conversation's
        # frames (not four times as many), and the steps held all four rows
        frames_each = sessions[0].listener.stream.link.session.frames_done
        assert sched.ticks <= frames_each * 1.2 + 20, (sched.ticks, frames_each)
        rows = list(sched.active_rows)[-sched.ticks:]
        print(f"ticks {sched.ticks}, frames per conversation {frames_each}, rows per step {np.mean(rows):.2f}")
        assert np.mean(rows) >= 3.0 and rows.count(SLOTS) >= 0.6 * len(rows), rows

        # a conversation beyond the slots is told so, and the page gets nothing else
        extra: list[dict] = []
        await asyncio.wait_for(talk(port, np.zeros(int(0.2 * RATE), np.float32), extra), 30)
        (err,) = [e for e in extra if e["type"] == "error"]
        assert err["code"] == "no_recognizer" and err["fatal"] and "busy" in err["message"]

        # the words each conversation received are the engine's words for its audio alone
        for a, log in zip(audio, logs):
            (final,) = [e for e in log if e["type"] == "final"]
            got = [w[0] for w in final["words"]]
            assert got, "the random model emitted no words: the check would be empty"
            assert got == await reference_words(checkpoint, a)
            print("words:", got)

        # a closed conversation's slot goes to the next one
        hold.set()
        await asyncio.gather(*clients)
        assert await await_until(lambda: not asr.scheduler.sessions, timeout=10)
        again: list[dict] = []
        await asyncio.wait_for(talk(port, clip(9), again), 30)
        assert not [e for e in again if e["type"] == "error"]
        assert sessions[-1].listener.stream.link.session.slot == 0  # the lowest free slot, reused
    finally:
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)
        await asr.aclose()
