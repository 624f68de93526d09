"""A complete duplex transport in one small file: raw PCM over TCP (s16le mono, 16 kHz, both
ways), for an in-house media server that speaks nothing else. docs/extending.md's "A transport"
walks through it; tests/test_example_transport.py runs a conversation over it.

    duplex serve --listener examples.pcm_tcp_transport:listener=9100

The wire carries no marks and no "clear", so this transport paces the reply itself, 20 ms a frame
at real time: a sample counts as played when it leaves, and `clear()` drops what has not left.
"""
from __future__ import annotations

import asyncio
import contextlib
import time

import numpy as np

from transport.audio import INPUT_RATE, Int16RateAdapter, int16_to_float
from transport.base import AudioIn, AudioOut, InputEvent
from transport.playback import Playback

RATE = INPUT_RATE  # the wire's, both ways


class PcmTcpTransport:
    reports_playout = True  # the Played marks come from our own pacing (`Playback.tick`)
    kind = "pcm"  # names the conversation in logs, traces and metrics

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.playback, self._to_wire = Playback(RATE), Int16RateAdapter(RATE)
        # mic audio and Played marks, in order; bounded, so a session that stops reading stops
        # the socket being read and TCP pushes back on the sender
        self.events: asyncio.Queue = asyncio.Queue(maxsize=64)
        self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._pace())]

    async def receive(self) -> InputEvent | None:
        return await self.events.get()  # None: the far end has gone

    async def _read(self) -> None:
        odd = b""  # half a sample left over from the last read
        try:
            while data := await self.reader.read(3200):
                data, odd = odd + data, b""
                if len(data) % 2:
                    data, odd = data[:-1], data[-1:]
                await self.events.put(AudioIn(int16_to_float(np.frombuffer(data, "<i2")), RATE))
        except ConnectionError:
            pass
        await self.events.put(None)

    async def send_audio(self, chunk: AudioOut) -> None:
        self.playback.push(chunk.chunk_id, self._to_wire(chunk.pcm, chunk.sample_rate))

    async def clear(self) -> None:
        self.playback.clear()

    async def send_event(self, event) -> None:
        """No side channel on this wire: partials and bot text go nowhere."""

    async def _pace(self) -> None:
        due = time.perf_counter()
        while not self.writer.is_closing():
            frame, played = self.playback.tick(time.perf_counter())
            if frame is not None:
                self.writer.write(frame.astype("<i2").tobytes())
                await self.writer.drain()
            for mark in played:
                await self.events.put(mark)
            due = max(due + 0.02, time.perf_counter() - 0.1)  # no burst after a stall
            await asyncio.sleep(max(0.0, due - time.perf_counter()))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await task
        self.writer.close()


def listener(port: str, host: str = "127.0.0.1"):
    """`duplex serve --listener examples.pcm_tcp_transport:listener=PORT`: serve(conversation,
    admission) accepts TCP connections until cancelled, one conversation each."""
    async def serve(conversation, admission) -> None:
        async def on_connect(reader, writer) -> None:
            if admission.enter() is not None:  # full or draining: no voice to tell it on this wire
                writer.close()
                return
            transport = PcmTcpTransport(reader, writer)
            try:
                await conversation(transport)
            finally:
                admission.leave()
                await transport.close()

        async with await asyncio.start_server(on_connect, host, int(port)) as server:
            await server.serve_forever()
    return serve
