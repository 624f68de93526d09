"""Profiling hooks that feed the tracer.

* :class:`MemorySampler`: an asyncio task that samples the process RSS (from
  ``/proc/self/statm``) and, on CUDA, ``torch.cuda.memory_allocated`` /
  ``memory_reserved`` into ``tracer.counter`` (stage ``memory``: counters
  ``rss_mb``, ``gpu_mb``, ``gpu_reserved_mb``), so leaks show up as a counter
  track in the same Perfetto view as the spans.
* :func:`torch_profiler`: a context manager around :mod:`torch.profiler` that
  writes its Chrome trace to ``path`` (see :func:`profile_path_for` for "next
  to our trace").  :func:`profile_region` marks a region (recognizer step,
  model call) with ``record_function`` while a profiler is active and costs
  one global read otherwise.

torch is imported lazily: nothing here needs it unless CUDA sampling or the
profiler is used.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from typing import Any, Iterator

from agent.tracing.trace import Tracer

__all__ = [
    "rss_mb",
    "gpu_mb",
    "MemorySampler",
    "torch_profiler",
    "profile_region",
    "profile_path_for",
]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_mb() -> float:
    """Resident set size of this process in MiB (0.0 where /proc is missing)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            resident = int(f.read().split()[1])
        return resident * _PAGE / (1 << 20)
    except (OSError, IndexError, ValueError):
        try:
            import resource

            r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # peak, KiB on Linux
            return r / 1024.0
        except Exception:
            return 0.0


def _cuda_available() -> bool:
    torch = sys.modules.get("torch")
    if torch is None:
        return False  # never import torch just to find out
    try:
        return bool(torch.cuda.is_available())
    except Exception:
        return False


def gpu_mb() -> tuple[float, float] | None:
    """(allocated, reserved) CUDA memory in MiB, or None without CUDA."""
    if not _cuda_available():
        return None
    import torch

    return (torch.cuda.memory_allocated() / (1 << 20), torch.cuda.memory_reserved() / (1 << 20))


class MemorySampler:
    """Sample memory into ``tracer`` every ``period_s`` seconds.

    ``gpu=None`` samples CUDA memory when torch is already imported and CUDA is
    available.  Use as ``async with MemorySampler(tracer): ...`` or
    ``start()`` / ``await stop()``.  One sample is taken at start and one at
    stop, so even a short run has two points.
    """

    def __init__(self, tracer: Tracer, period_s: float = 1.0, gpu: bool | None = None) -> None:
        if period_s <= 0:
            raise ValueError("period_s must be > 0")
        self.tracer = tracer
        self.period_s = period_s
        self.gpu = gpu
        self.samples = 0
        self._task: asyncio.Task | None = None

    def sample(self) -> None:
        tr = self.tracer
        ts = tr.now_ns()
        tr.counter("rss_mb", rss_mb(), ts_ns=ts)
        use_gpu = self.gpu if self.gpu is not None else _cuda_available()
        if use_gpu:
            g = gpu_mb()
            if g is not None:
                tr.counter("gpu_mb", g[0], ts_ns=ts)
                tr.counter("gpu_reserved_mb", g[1], ts_ns=ts)
        self.samples += 1

    async def _run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.period_s)

    def start(self) -> "MemorySampler":
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="memory-sampler")
        return self

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self.sample()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def __aenter__(self) -> "MemorySampler":
        return self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()


def profile_path_for(trace_path: str) -> str:
    """Where the torch profiler trace goes for our trace file:
    ``out/session.trace.json`` → ``out/session.torch.json``."""
    base = trace_path
    for suf in (".trace.json", ".json", ".jsonl"):
        if base.endswith(suf):
            base = base[: -len(suf)]
            break
    return base + ".torch.json"


_ACTIVE_PROFILER: Any = None


@contextlib.contextmanager
def torch_profiler(
    path: str,
    *,
    cuda: bool | None = None,
    record_shapes: bool = False,
    with_stack: bool = False,
    profile_memory: bool = False,
) -> Iterator[Any]:
    """Run the body under ``torch.profiler.profile`` and write its Chrome trace
    to ``path`` on exit (also when the body raises).  ``cuda=None`` adds the
    CUDA activity when CUDA is available.  Yields the profiler object."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    global _ACTIVE_PROFILER
    acts = [ProfilerActivity.CPU]
    if cuda if cuda is not None else torch.cuda.is_available():
        acts.append(ProfilerActivity.CUDA)
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    prof = profile(activities=acts, record_shapes=record_shapes, with_stack=with_stack,
                   profile_memory=profile_memory)
    prev = _ACTIVE_PROFILER
    prof.__enter__()
    _ACTIVE_PROFILER = prof
    try:
        yield prof
    finally:
        _ACTIVE_PROFILER = prev
        prof.__exit__(None, None, None)
        prof.export_chrome_trace(path)


def profile_region(name: str):
    """``with profile_region("asr.step"): ...``: a ``record_function`` label
    while :func:`torch_profiler` is active, else a no-op context."""
    if _ACTIVE_PROFILER is None:
        return contextlib.nullcontext()
    from torch.profiler import record_function

    return record_function(name)


async def run_traced(session, tracer) -> None:
    """Run a session, sampling memory into its trace (when it has one) while it runs."""
    if tracer is None:
        await session.run()
        return
    async with MemorySampler(tracer, period_s=0.5):
        await session.run()
