"""The batched Kyutai engine in this process, as a `StreamingRecognizer`.

One `EngineScheduler` serves every conversation of the process: one slot per stream, and every
active slot advances in the same batched step (asr.engine.scheduler). A stream is an `EngineSession`
seen through the shared Kyutai-message stream (asr.moshi_stream), so in-process and remote
streams behave alike. The scheduler's tick loop starts lazily on the loop that opens the first
stream (it runs the model on its own one-thread executor, never on asyncio's default one).
"""

from __future__ import annotations

import asyncio
import logging
import os

import numpy as np

from asr.base import RecognizerUnavailable
from asr.engine.kyutai import FRAME_RATE, LoadedModel
from asr.moshi_protocol import SAMPLE_RATE, ServerMessage
from asr.moshi_stream import LinkLost, MoshiStream
from asr.engine.scheduler import EngineScheduler, EngineSession, NoFreeSlot, SchedulerConfig, SessionClosed

TINY_RANDOM = "tiny-random"

log = logging.getLogger("duplex.asr.engine")


class EngineLink:
    """A `MoshiLink` onto one engine slot. A closed session is final: the scheduler closes one
    only when its owner closed it, it was evicted (idle, too long) or the scheduler stopped."""

    def __init__(self, session: EngineSession):
        self.session = session

    def _lost(self, why: object) -> LinkLost:
        return LinkLost(f"engine slot {self.session.slot} closed: {self.session.closed_reason or why}", final=True)

    async def send_audio(self, pcm: np.ndarray) -> None:
        try:
            await self.session.feed(pcm)  # waits while the slot's input buffer is full
        except SessionClosed as e:
            raise self._lost(e) from None

    async def send_marker(self, marker_id: int) -> None:
        try:
            await self.session.mark(marker_id)
        except SessionClosed as e:
            raise self._lost(e) from None

    async def receive(self) -> list[ServerMessage]:
        msgs = await self.session.messages()
        if not msgs:  # closed and drained
            raise self._lost("closed")
        return msgs

    async def close(self) -> None:
        await self.session.close()  # frees the slot at once


class EngineRecognizer:
    """The engine's slots as streams; `RecognizerUnavailable` when all are taken.

    `model`: a loaded Kyutai model (asr.engine.kyutai: `tiny_random`, `from_pretrained`); its engine's
    batch size is the number of slots. Use one per process (`load_recognizer` caches it)."""

    sample_rate = SAMPLE_RATE

    def __init__(self, model: LoadedModel, config: SchedulerConfig | None = None, *,
                 flush_margin_frames: int | None = None, events_max: int = 512):
        self.model = model
        self.name = model.name
        self.delay_s = model.asr_delay_frames / FRAME_RATE
        self.config = config or SchedulerConfig()
        self._margin = self.config.flush_extra_frames if flush_margin_frames is None else flush_margin_frames
        self._events_max = events_max
        self._scheduler: EngineScheduler | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def load(cls, name: str = TINY_RANDOM, *, device: str = "cpu", slots: int = 8, dtype=None,
             compile: bool = False, tune_convs: bool | None = None, **config) -> EngineRecognizer:
        """`tiny-random` (random weights: plumbing only), a Kyutai STT hub id (needs internet) or a
        local transformers checkpoint directory. `config`: `SchedulerConfig` fields."""
        from asr.engine.kyutai import from_pretrained, tiny_random

        if tune_convs is None:  # timing the convs pays off for real models on a CPU only
            tune_convs = device == "cpu" and name != TINY_RANDOM
        if name == TINY_RANDOM:
            loaded = tiny_random(slots, seed=0, device=device, compile=compile, tune_convs=tune_convs)
        else:
            import torch

            if isinstance(dtype, str):
                dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
            if dtype is None:  # bf16 matmuls are slow on most CPUs
                dtype = torch.float32 if device == "cpu" else torch.bfloat16
            try:
                loaded = from_pretrained(name, slots, device=device, dtype=dtype, compile=compile,
                                         tune_convs=tune_convs)
            except OSError as e:  # transformers' word for "not on disk and the hub unreachable"
                if os.path.isdir(name):
                    raise
                raise RuntimeError(f"could not load the recognizer {name!r} from the Hugging Face hub: it needs "
                                   f"internet the first time, or give a local checkpoint directory ({e})") from e
        return cls(loaded, SchedulerConfig(**config))

    @property
    def slots(self) -> int:
        return self.model.engine.batch_size

    @property
    def scheduler(self) -> EngineScheduler:
        """The one scheduler of this recognizer (for tests and metrics: ticks, active_rows)."""
        if self._scheduler is None:
            self._scheduler = EngineScheduler(self.model, self.config)
        return self._scheduler

    async def _started(self) -> EngineScheduler:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            old = self._scheduler
            if old is not None and self._loop is not None and not self._loop.is_closed() and old.sessions:
                raise RuntimeError(f"{self.name}: the engine is serving streams on another event loop")
            if old is not None and self._loop is not None:
                # its tick loop belonged to a loop that is gone; the engine resets slots on reuse
                old._executor.shutdown(wait=False)
                self._scheduler = None
            self._loop = loop
        sched = self.scheduler
        await sched.start()
        return sched

    async def open_stream(self) -> MoshiStream:
        sched = await self._started()
        try:
            session = await sched.open_session()
        except NoFreeSlot:
            raise RecognizerUnavailable(f"all {sched.batch_size} recognizer slots are busy ({self.name})") from None
        return MoshiStream(EngineLink(session), delay_s=self.delay_s, name=f"{self.name} slot {session.slot}",
                           sample_rate=self.sample_rate, frame_size=sched.frame_size,
                           flush_margin_frames=self._margin, events_max=self._events_max)

    async def aclose(self) -> None:
        """Stop the tick loop and close every stream's slot."""
        if self._scheduler is not None and self._loop is asyncio.get_running_loop():
            await self._scheduler.stop()
        self._scheduler = None
        self._loop = None
