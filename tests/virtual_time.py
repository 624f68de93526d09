"""A virtual clock for the orchestration tests: the conversation's real time without the wait.

`VirtualClock(loop)` makes the running event loop's clock, and `time.perf_counter`,
`time.monotonic`, `time.time` and `time.sleep` (their `_ns` forms too), a clock that jumps to
the next timer whenever nothing else can happen: no callback is ready, no I/O is waiting and no
thread job is working. So everything the session paces in seconds (audio fed at 20 ms a frame,
the reply's playout, a tool's timeout, a filler's delay, a test double's token rate) runs as it
would in real time, in the same order and at the same virtual instants, but as fast as the CPU
goes; and it is deterministic: CPU work, on the loop or in `run_in_executor` threads, takes no
virtual time, however busy the machine is.

Thread jobs (`loop.run_in_executor`, so `asyncio.to_thread` and agent.workers.run_in) hold the
clock while they work: a VAD frame's job done in 30 ms of a busy CPU still took no virtual time.
A job that calls `time.sleep(s)` lets the clock go on while it sleeps `s` virtual seconds.

Only for code whose every peer is in this process: on this loop (sockets between two ends of
this loop are fine: loopback hands what one end sent to the other before the send returns) or
in a thread job. A reply from another process comes in real time, while the clock would have
jumped ahead meanwhile; threads of their own (not run_in_executor's) are not waited for either.
Where a test talks to another process for a moment (starting it, a request, its shutdown), it
wraps that moment in `with clock.real_time():`, and meanwhile the clock runs at the real pace.
The time functions are replaced on the `time` module: a clock bound before (a default argument
`clock=time.monotonic`, `from time import monotonic`) keeps the real time, so product code
reads its default clock when an object is made (agent/serving/holding.py's HeldTransport).
"""
from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time

_real_sleep = time.sleep
_real_perf_counter = time.perf_counter
_real_time_ns = time.time_ns

_PATCHED = ("perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns", "sleep")
_WAIT_S = 0.5  # a real select's slice while a thread job works (the clock stays put meanwhile)
_HELD_MAX_S = 20.0  # longer than any test's thread job: a job that never settles is an error, not a hang


class VirtualClock:
    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._ns = int(loop.time() * 1e9)  # the virtual now, from the loop's real now: timers already set stay right
        self._last = self._ns  # the last reading: every reading is 1 ns after the one before (a span lasts > 0)
        self._wall0 = _real_time_ns() - self._ns
        self._lock = threading.Lock()
        self._busy = 0  # thread jobs submitted and not yet finished, less those asleep
        self._jobs: dict[int, str] = {}  # the jobs submitted and not yet settled, for the error below
        self._held_since: float | None = None  # real time since which thread jobs have held the clock
        self._sleepers: set[threading.Event] = set()
        self._counted = threading.local()
        self._loop_thread = threading.get_ident()
        self._saved: dict[str, object] = {}
        self._real_paced = 0  # real_time() blocks open
        self.active = False

    @staticmethod
    def real_perf_counter() -> float:
        return _real_perf_counter()

    # the clock ----------------------------------------------------------------------------------
    def now_ns(self) -> int:
        with self._lock:
            self._last = max(self._ns, self._last + 1)
            return self._last

    def _loop_time(self) -> float:
        return self._ns / 1e9

    def perf_counter(self) -> float:
        return self.now_ns() / 1e9

    def time_ns(self) -> int:
        return self._wall0 + self.now_ns()

    def time(self) -> float:
        return self.time_ns() / 1e9

    def advance(self, seconds: float) -> None:
        """Move the virtual now on by `seconds` (>= 0)."""
        with self._lock:
            self._ns += max(0, math.ceil(seconds * 1e9))

    @contextlib.contextmanager
    def real_time(self):
        """While inside (on the loop's thread): the clock runs at the real pace, so that a wait on
        another process (its start, a request, its exit) lasts as long as it really does, and
        timers meanwhile fire when their real time comes."""
        self._real_paced += 1
        try:
            yield self
        finally:
            self._real_paced -= 1

    # the loop's wait ------------------------------------------------------------------------------
    def _select(self, timeout=None):
        real = self._real_select
        if timeout is not None and timeout <= 0:
            return real(0)
        events = real(0)
        if events:
            return events
        with self._lock:
            busy = self._busy
        if busy:
            held = self._held_since = self._held_since or _real_perf_counter()
            if _real_perf_counter() - held > _HELD_MAX_S:
                raise RuntimeError(f"virtual clock: thread jobs have held it for {_HELD_MAX_S:g} s of real "
                                   f"time: {sorted(self._jobs.values())}")
            return real(_WAIT_S)  # a job's end (or its sleep) wakes the loop at once
        self._held_since = None
        if self._real_paced:
            t0 = _real_perf_counter()
            events = real(timeout)
            self.advance(_real_perf_counter() - t0)
            return events
        if timeout is None:  # no timer: only I/O or another thread can wake the loop
            return real(None)
        self.advance(timeout)  # nothing can happen before the next timer: jump to it
        return []

    # thread jobs ------------------------------------------------------------------------------------
    def _run_in_executor(self, executor, func, *args):
        """`loop.run_in_executor`, counting the job as busy until it has ended (or was cancelled
        before it began: a queued job whose await was cancelled never runs) and its end has
        reached the loop (else the clock could jump in between)."""
        loop = self.loop
        if executor is None:
            if loop._default_executor is None:  # made by asyncio, as asyncio makes it
                self._real_run_in_executor(None, int)
            executor = loop._default_executor
        state = {"ended": False, "done": False}

        def settle(key: str) -> None:
            state[key] = True
            if state["ended"] and state["done"]:
                self._jobs.pop(id(state), None)
                with self._lock:
                    self._busy -= 1

        def ended(_) -> None:  # in the worker thread, or where a queued job is cancelled
            if self.active:
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(settle, "ended")

        def job(*a):
            self._counted.on = True
            try:
                return func(*a)
            finally:
                self._counted.on = False

        with self._lock:
            self._busy += 1
        self._jobs[id(state)] = repr(func)
        work = executor.submit(job, *args)
        work.add_done_callback(ended)  # before wrap_future's: "ended" reaches the loop before the result
        fut = asyncio.wrap_future(work, loop=loop)
        fut.add_done_callback(lambda _: settle("done"))
        return fut

    def sleep(self, seconds: float) -> None:
        if not self.active:
            return _real_sleep(seconds)
        if threading.get_ident() == self._loop_thread:  # blocks the loop for that long: time passes
            self.advance(seconds)
            return
        woken = threading.Event()
        counted = getattr(self._counted, "on", False)

        def wake() -> None:
            if counted:
                with self._lock:
                    self._busy += 1
            woken.set()

        def start() -> None:
            if counted:
                with self._lock:
                    self._busy -= 1
            self.loop.call_later(max(0.0, seconds), wake)

        self._sleepers.add(woken)
        try:
            self.loop.call_soon_threadsafe(start)
            woken.wait()
        finally:
            self._sleepers.discard(woken)

    # install ------------------------------------------------------------------------------------------
    def __enter__(self) -> "VirtualClock":
        loop = self.loop
        self._real_select = loop._selector.select
        self._real_run_in_executor = loop.run_in_executor
        loop.time = self._loop_time
        loop._selector.select = self._select
        loop.run_in_executor = self._run_in_executor
        fakes = {"perf_counter": self.perf_counter, "perf_counter_ns": self.now_ns, "monotonic": self.perf_counter,
                 "monotonic_ns": self.now_ns, "time": self.time, "time_ns": self.time_ns, "sleep": self.sleep}
        for name in _PATCHED:
            self._saved[name] = getattr(time, name)
            setattr(time, name, fakes[name])
        self.active = True
        return self

    def __exit__(self, *exc) -> None:
        self.active = False
        for name, fn in self._saved.items():
            setattr(time, name, fn)
        for woken in list(self._sleepers):  # a thread asleep on the clock wakes now
            woken.set()
        loop = self.loop
        for name in ("time", "run_in_executor"):
            loop.__dict__.pop(name, None)
        loop._selector.__dict__.pop("select", None)
