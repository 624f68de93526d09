"""The server's measured load: what admission (transport.admission.LoadGate) refuses on, and
what /metrics shows of it.

The signals, and why these:
- **CPU**: the machine's utilisation (every process: a co-located LLM server counts too),
  averaged over the last `window_s`. On a CPU machine every stage (VAD, recognizer, LLM, voice)
  competes for the same cores, and voice-to-voice time grows with utilisation long before
  anything fails. LiveKit Agents refuses jobs above a CPU load threshold for the same reason.
- **A reservation per conversation just admitted** (for `settle_s`): a caller says hello before
  speaking, so a burst of arrivals would otherwise all pass on the same idle reading.
- **The LLM's queue**: replies waiting for their first token. Each one waiting adds a whole
  reply's generation to someone's voice-to-voice time.
- **Event-loop lag**: a loop that wakes late delays every conversation's audio and keepalives.

An idle server (no live conversation) always takes one: the load is then not ours to shed, and
refusing would make a server on a busy machine useless.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class LoadPolicy:
    cpu_threshold: float = 0.8  # of the machine; None-like 0 switches the load checks off
    reservation: float = 0.3  # of the machine, per conversation admitted in the last settle_s
    settle_s: float = 4.0
    window_s: float = 3.0
    max_llm_queue: int = 2
    max_lag_s: float = 0.25

    @property
    def enabled(self) -> bool:
        return self.cpu_threshold > 0


class LoadMonitor:
    """Samples in (`observe`, or `run` for the real machine); a reason to refuse out."""

    def __init__(self, policy: LoadPolicy | None = None, llm_queue: Callable[[], int] = lambda: 0,
                 clock: Callable[[], float] | None = None):
        self.policy = policy or LoadPolicy()
        self.llm_queue, self.clock = llm_queue, clock or time.monotonic  # read when made: a test's clock too
        self._cpu: deque[tuple[float, float]] = deque(maxlen=256)  # (time, utilisation 0..1)
        self._admitted: deque[float] = deque(maxlen=256)
        self.lag_s = 0.0

    def observe(self, cpu: float, lag_s: float) -> None:
        now = self.clock()
        self._cpu.append((now, cpu))
        self.lag_s = lag_s

    @property
    def cpu(self) -> float:
        """Utilisation averaged over the window (0 before the first sample)."""
        since = self.clock() - self.policy.window_s
        recent = [c for t, c in self._cpu if t >= since]
        return sum(recent) / len(recent) if recent else 0.0

    def reserved(self) -> float:
        since = self.clock() - self.policy.settle_s
        while self._admitted and self._admitted[0] < since:
            self._admitted.popleft()
        return len(self._admitted) * self.policy.reservation

    # ---- transport.admission.LoadGate -------------------------------------------------------
    def reason(self, live: int) -> str | None:
        p = self.policy
        if not p.enabled or live == 0:
            return None
        if (queued := self.llm_queue()) > p.max_llm_queue:
            return f"busy: {queued} replies wait for the LLM (most {p.max_llm_queue})"
        if self.lag_s > p.max_lag_s:
            return f"busy: the event loop is {self.lag_s * 1000:.0f} ms late (most {p.max_lag_s * 1000:.0f})"
        cpu, reserved = self.cpu, self.reserved()
        if cpu + reserved > p.cpu_threshold:
            return (f"busy: CPU {cpu:.0%} + {reserved:.0%} reserved for conversations just admitted "
                    f"> {p.cpu_threshold:.0%}")
        return None

    def admitted(self) -> None:
        self._admitted.append(self.clock())

    # ---- the real machine ------------------------------------------------------------------
    async def run(self, period_s: float = 0.5, on_lag: Callable[[float], None] | None = None) -> None:
        """Until cancelled: sample the machine's CPU and how late the loop wakes a sleep."""
        loop = asyncio.get_running_loop()
        psutil.cpu_percent(None)  # the first reading only starts the interval
        while True:
            t0 = loop.time()
            await asyncio.sleep(period_s)
            lag = max(0.0, loop.time() - t0 - period_s)
            self.observe(psutil.cpu_percent(None) / 100.0, lag)
            if on_lag is not None:
                on_lag(lag)


class QueuedLLM:
    """A chat model, counting the streams that wait for their first token (`waiting`): the
    LLM's queue, for admission and /metrics, whatever the model (embedded or a server)."""

    def __init__(self, inner):
        self.inner = inner
        self.name = getattr(inner, "name", "llm")
        self.warm = getattr(inner, "warm", None)  # the session warms prompts when it can
        self.tool_results = getattr(inner, "tool_results", None)  # how it reads its tools' results
        self.waiting = 0

    @property
    def continues_text(self) -> bool:
        return getattr(self.inner, "continues_text", False)

    async def stream(self, messages, max_tokens: int | None = None, tools: list[dict] | None = None,
                     prefix: str = "") -> AsyncIterator:
        self.waiting += 1
        queued = True
        try:
            offer = {"tools": tools} if tools else {}  # a model that takes no tools is never offered any
            if prefix:
                offer["prefix"] = prefix
            async with contextlib.aclosing(self.inner.stream(messages, max_tokens, **offer)) as tokens:
                async for token in tokens:
                    if queued:
                        queued = False
                        self.waiting -= 1
                    yield token
        finally:
            if queued:
                self.waiting -= 1
