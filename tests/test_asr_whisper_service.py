"""`duplex asr-serve --model whisper-tiny.en`: the embedded Whisper recognizer over the moshi protocol.

Real server on 127.0.0.1, real models (faster-whisper tiny.en, Silero VAD), real speech from the
shared dev set streamed as msgpack Audio at 24 kHz in 80 ms chunks, faster than real time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
from pathlib import Path

import msgpack
import numpy as np
import pytest
import soundfile as sf
import soxr
import websockets

from asr.moshi_protocol import decode_server
from asr.serving.server import PATH, AsrServer, build_recognizer, parse_args
from asr.wer import wer
from helpers import DEV, dev_reference

pytestmark = pytest.mark.models

RATE = 24000
CHUNK = 1920  # 80 ms
KEY = {"kyutai-api-key": "public_token"}
CLIPS = ["sense_and_sensibility_01_austen_64kb-0870.wav", "goforward.wav"]


def clip_24k(name: str) -> np.ndarray:
    data, rate = sf.read(DEV / name, dtype="float32")
    return soxr.resample(data, rate, RATE, quality="HQ").astype(np.float32)


def audio_msg(pcm: np.ndarray) -> bytes:
    return msgpack.packb({"type": "Audio", "pcm": pcm.astype(np.float32).tolist()}, use_single_float=True)


@contextlib.asynccontextmanager
async def whisper_server(slots: int = 2):
    # the same construction path as `duplex asr-serve --model whisper-tiny.en`
    recognizer = build_recognizer(parse_args(["--model", "whisper-tiny.en", "--slots", str(slots)]))
    server = AsrServer(recognizer)
    async with recognizer, server.serving() as port:
        yield recognizer, f"ws://127.0.0.1:{port}{PATH}"


async def transcribe(url: str, pcm: np.ndarray, marker_id: int) -> tuple[list[dict], list[dict]]:
    """Stream `pcm`, a Marker, then 2 s of silence; return (Words and EndWords, everything)."""
    async with websockets.connect(url, additional_headers=KEY) as ws:
        first = decode_server(await asyncio.wait_for(ws.recv(), 30))
        assert first["type"] == "Ready"
        seen: list[dict] = []

        async def send():
            for i in range(0, pcm.size, CHUNK):
                await ws.send(audio_msg(pcm[i:i + CHUNK]))
            await ws.send(msgpack.packb({"type": "Marker", "id": marker_id}))
            silence = np.zeros(CHUNK, np.float32)
            for _ in range(25):  # 2 s of trailing silence, as Kyutai's clients send
                await ws.send(audio_msg(silence))

        sender = asyncio.create_task(send())
        async with asyncio.timeout(60):
            while True:
                m = decode_server(await ws.recv())
                seen.append(m)
                assert m["type"] != "Error", m
                if m["type"] == "Marker":
                    assert m["id"] == marker_id
                    break
        await sender
        return [m for m in seen if m["type"] in ("Word", "EndWord")], seen


async def test_whisper_served_over_moshi_protocol_two_concurrent_streams():
    clips = [clip_24k(c) for c in CLIPS]
    async with whisper_server(slots=2) as (service, url):
        results = await asyncio.gather(*(transcribe(url, pcm, 100 + i) for i, pcm in enumerate(clips)))
        assert service.recognizer.name == "whisper-tiny.en"
    hyps = []
    for (words, seen), pcm in zip(results, clips):
        starts = [m["start_time"] for m in words if m["type"] == "Word"]
        stops = [m["stop_time"] for m in words if m["type"] == "EndWord"]
        # every Word is followed by its EndWord
        assert [m["type"] for m in words] == ["Word", "EndWord"] * len(starts)
        assert starts, "no words"
        duration = pcm.size / RATE
        assert starts == sorted(starts)
        assert all(0.0 <= s <= duration for s in starts), (starts, duration)
        assert all(s <= e for s, e in zip(starts, stops))
        # the marker came back after the words for the audio before it, and after its steps
        steps = [m["step_idx"] for m in seen if m["type"] == "Step"]
        assert steps == list(range(1, len(steps) + 1))
        assert len(steps) >= pcm.size // CHUNK
        assert all("buffered_pcm" in m for m in seen)
        hyps.append(" ".join(m["text"] for m in words if m["type"] == "Word"))
    refs = [dev_reference(c) for c in CLIPS]
    score = wer(refs, hyps)
    assert score <= 0.20, (score, hyps, refs)


KYUTAI_CLIENT = os.environ.get("DUPLEX_KYUTAI_CLIENT")


@pytest.mark.skipif(not KYUTAI_CLIENT, reason="set DUPLEX_KYUTAI_CLIENT to Kyutai's scripts/stt_from_file_rust_server.py "
                    "(github.com/kyutai-labs/delayed-streams-modeling; not on any registry, not vendored)")
async def test_kyutai_own_client_script_unchanged():
    """Kyutai's own file client, run as they ship it, against our server: its transcript and its
    word timestamps come out right (it needs sphn, msgpack, numpy, websockets: all in our venv)."""
    clip = CLIPS[0]
    async with whisper_server(slots=1) as (_, url):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, KYUTAI_CLIENT, str(DEV / clip), "--url", url.removesuffix(PATH), "--rtf", "4",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await asyncio.wait_for(proc.communicate(), 120)
    text = out.decode()
    assert proc.returncode == 0, text
    # its last lines: "start - stop  word", times counted from its leading 1 s of silence
    rows = [m.groups() for m in re.finditer(r"^\s*(\d+\.\d+) -\s*(\d+\.\d+)\s+(\S.*)$", text, re.M)]
    starts, stops, words = [float(a) for a, _, _ in rows], [float(b) for _, b, _ in rows], [w for *_, w in rows]
    assert words, text
    assert wer([dev_reference(clip)], [" ".join(words)]) <= 0.15, text
    duration = sf.info(str(DEV / clip)).duration
    assert starts == sorted(starts) and all(s <= e for s, e in zip(starts, stops))
    assert 0.9 <= starts[0] and stops[-1] <= 1.0 + duration + 0.2, (starts, stops)


PEERS_PY = Path(__file__).resolve().parents[1] / ".venv-peers" / "bin" / "python"
LIVEKIT_CLIENT = Path(__file__).parent / "peers" / "livekit_kyutai_stt.py"


async def test_livekit_agents_kyutai_stt_plugin_unchanged(tmp_path):
    """A LiveKit Agents user's Kyutai STT plugin (`livekit-plugins-kyutai-lasuite`, written for
    moshi-server), pointed at our server: its SpeechEvents carry the clip's words, in order."""
    if not PEERS_PY.exists():
        if os.environ.get("CI"):
            pytest.fail("the peers virtualenv is missing: `make test` makes it (scripts/setup_peers.sh)")
        pytest.skip("run scripts/setup_peers.sh (make test does) for the LiveKit plugin")
    clip = CLIPS[0]
    wav = tmp_path / "clip24k.wav"
    sf.write(wav, clip_24k(clip), RATE, subtype="PCM_16")
    async with whisper_server(slots=1) as (_, url):
        proc = await asyncio.create_subprocess_exec(
            str(PEERS_PY), str(LIVEKIT_CLIENT), url, str(wav),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()[-3000:]
    result = json.loads(out.decode().strip().splitlines()[-1])
    words = [w["text"] for w in result["words"]]
    assert wer([dev_reference(clip)], [" ".join(words)]) <= 0.15, (words, dev_reference(clip))
    starts = [w["start_time"] for w in result["words"]]
    assert starts == sorted(starts) and 0 <= starts[0] < starts[-1] <= sf.info(str(wav)).duration, starts


async def collect_until_marker(session, marker_id: int) -> list:
    got = []
    async with asyncio.timeout(60):
        while not any(type(m).__name__ == "MarkerReply" and m.id == marker_id for m in got):
            batch = await session.messages()
            assert batch, "session closed before the marker came back"
            got += batch
    return got


async def test_flush_ends_the_utterance_and_buffers_stay_bounded():
    from asr.whisper import WhisperRecognizer
    from asr.serving.whisper_service import WhisperService, WhisperServiceConfig

    pcm = clip_24k("goforward.wav")[:int(2.1 * RATE)]  # cut 0.2 s after "meters": no pause to end on
    cfg = WhisperServiceConfig(max_sessions=1, buffer_seconds=1.0)
    async with WhisperService(WhisperRecognizer.load("whisper-tiny.en"), cfg) as service:
        s = await service.open_session()
        for i in range(0, pcm.size, 24000):  # 1 s pieces into a 1 s buffer: feed must wait for room
            await s.feed(pcm[i:i + 24000])
            assert s.buffered_samples <= s.capacity
        await s.mark(7)  # no trailing silence from the client: only the Flush ends the utterance
        await s.flush()
        got = await collect_until_marker(s, 7)
        words = [m.text for m in got if type(m).__name__ == "Word"]
        assert wer(["go forward ten meters"], [" ".join(words)]) <= 0.25, words
        assert s.max_buffered <= s.capacity < 2 * 24000
        await s.close()
        assert not service.sessions


async def test_injected_vad_that_hears_nothing_gives_no_words_but_the_marker():
    from asr.whisper import WhisperRecognizer
    from asr.serving.whisper_service import WhisperService, WhisperServiceConfig

    def deaf_vad():
        pending = [0]

        def score(pcm):
            pending[0] += len(pcm)
            n, pending[0] = pending[0] // 512, pending[0] % 512
            return [0.0] * n
        return score

    pcm = clip_24k("goforward.wav")
    async with WhisperService(WhisperRecognizer.load("whisper-tiny.en"), WhisperServiceConfig(max_sessions=1),
                              vad_factory=deaf_vad) as service:
        s = await service.open_session()
        await s.feed(pcm)
        await s.mark(1)
        await s.feed(np.zeros(4800, np.float32))
        got = await collect_until_marker(s, 1)
        assert not [m for m in got if type(m).__name__ == "Word"]
        steps = [m for m in got if type(m).__name__ == "Step"]
        assert len(steps) >= pcm.size // CHUNK and all(m.prs == (0.0,) for m in steps)
        with pytest.raises(Exception, match="no free slot"):
            await service.open_session()
        await s.close()


async def test_asr_serve_with_no_model_gives_words():
    """What a newcomer runs: `duplex asr-serve` with no --model, as a process; a clip streamed to it
    comes back as its words (the embedded Whisper), not the random engine's noise."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent.serving.cli", "asr-serve", "--port", "0", "--slots", "1",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        async with asyncio.timeout(120):  # until it prints its bound address
            while not (m := re.search(rb"asr-serve: (.*) on (ws://\S+)", line := await proc.stdout.readline())):
                assert line, "asr-serve exited before serving"
        assert b"whisper-tiny.en" in m.group(1) and b"RANDOM" not in m.group(1).upper()
        words, _ = await transcribe(m.group(2).decode(), clip_24k("goforward.wav"), 1)
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)
    hyp = " ".join(w["text"] for w in words if w["type"] == "Word")
    assert wer([dev_reference("goforward.wav")], [hyp]) <= 0.25, hyp
