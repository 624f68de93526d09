"""A LiveKit Agents user's STT, pointed at `duplex asr-serve`: the `livekit-plugins-kyutai-lasuite`
plugin (Kyutai STT for LiveKit, written against moshi-server), used as its README shows.

Runs in the peers virtualenv (`.venv-peers`, made by scripts/setup_peers.sh: livekit-agents
and our project do not share one environment). Streams a 16-bit mono 24 kHz WAV at real-time
pace in 20 ms frames, then silence, and prints one JSON line: the words, as LiveKit's
`SpeechEvent`s gave them.

    python livekit_kyutai_stt.py URL WAV [--tail-s 3] [--timeout-s 60]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time
import wave

import numpy as np
from lasuite.plugins.kyutai import STT
from livekit import rtc
from livekit.agents import stt as lk_stt

FRAME = 480  # 20 ms at 24 kHz


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("wav")
    p.add_argument("--tail-s", type=float, default=3.0)
    p.add_argument("--timeout-s", type=float, default=60.0)
    args = p.parse_args()
    with wave.open(args.wav) as w:
        assert w.getframerate() == 24000 and w.getnchannels() == 1 and w.getsampwidth() == 2
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
    pcm = np.concatenate([pcm, np.zeros(int(args.tail_s * 24000), np.int16)])

    import aiohttp

    async with aiohttp.ClientSession() as session:
        stream = STT(api_key="public_token", base_url=args.url, http_session=session).stream()
        words: list[dict] = []
        ends = 0

        async def read() -> None:
            nonlocal ends
            async for ev in stream:
                if ev.type == lk_stt.SpeechEventType.FINAL_TRANSCRIPT:
                    alt = ev.alternatives[0]
                    words.append({"text": alt.text, "start_time": alt.start_time})
                elif ev.type == lk_stt.SpeechEventType.END_OF_SPEECH:
                    ends += 1

        reader = asyncio.create_task(read())
        t0 = time.perf_counter()
        for k, i in enumerate(range(0, pcm.size, FRAME)):
            await asyncio.sleep(max(0.0, t0 + k * 0.02 - time.perf_counter()))
            chunk = pcm[i:i + FRAME]
            stream.push_frame(rtc.AudioFrame(chunk.tobytes(), 24000, 1, chunk.size))
        await asyncio.sleep(1.0)  # the last words' Word messages
        await stream.aclose()
        reader.cancel()
    print(json.dumps({"words": words, "end_of_speech": ends}))


if __name__ == "__main__":
    asyncio.run(main())
