"""Bounded thread pools for the conversation's model work, one per kind, shared by every session
of the process. Never asyncio's default executor: there one abandoned call can starve every
later `to_thread` of every session."""
from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

_POOLS: dict[str, ThreadPoolExecutor] = {}
_SIZES = {"vad": 1, "eou": 1, "llm-warm": 1,  # small models: queueing beats sharing 2 cores
          "tools": 4}
_WAITING = {"tools"}  # sync tools mostly wait on a service: more threads than cores


def pool(kind: str) -> ThreadPoolExecutor:
    if kind not in _POOLS:
        size = _SIZES.get(kind, 1)
        if kind not in _WAITING:
            size = min(size, os.cpu_count() or 1)
        _POOLS[kind] = ThreadPoolExecutor(size, thread_name_prefix=f"duplex-{kind}")
    return _POOLS[kind]


@functools.cache
def physical_cores(cpu_dir: str = "/sys/devices/system/cpu") -> int:
    """Distinct cores among the CPUs this process may run on: hyperthreads of one core count once
    (two models side by side on them run at about half speed each). Without the topology each
    CPU counts. Read once a process (every session's config asks)."""
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    cores = set()
    for c in cpus:
        try:
            cores.add(Path(cpu_dir, f"cpu{c}", "topology", "thread_siblings_list").read_text().strip())
        except OSError:
            cores.add(f"cpu{c}")
    return max(1, len(cores))


async def cancel_and_wait(*tasks: asyncio.Task | None) -> None:
    """Cancel the tasks still running and wait until they have ended (their errors are theirs:
    a cancelled reply or decode has nothing left to report)."""
    live = [t for t in tasks if t is not None and not t.done()]
    for t in live:
        t.cancel()
    for t in live:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await t


async def run_in(kind: str, fn, *args):
    """Run blocking `fn(*args)` on the pool for `kind`, from the event loop."""
    return await asyncio.get_running_loop().run_in_executor(pool(kind), fn, *args)
