"""The tests' virtual clock (tests/virtual_time.py): timers fire in order at their virtual time
without the wait, a thread job holds the clock until its result is back, a job asleep lets it go on."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

pytestmark = pytest.mark.usefixtures("virtual_clock")


async def test_sleeps_take_their_virtual_time_and_no_real_time(virtual_clock):
    if virtual_clock is None:
        pytest.skip("DUPLEX_REAL_CLOCK=1")
    t0, loop0, wall0 = time.perf_counter(), asyncio.get_running_loop().time(), virtual_clock.real_perf_counter()
    order = []

    async def after(s, name):
        await asyncio.sleep(s)
        order.append((name, round(time.perf_counter() - t0, 3)))

    await asyncio.gather(after(30.0, "b"), after(10.0, "a"), after(3600.0, "c"))
    assert order == [("a", 10.0), ("b", 30.0), ("c", 3600.0)]
    assert asyncio.get_running_loop().time() - loop0 == pytest.approx(3600.0, abs=1e-3)
    assert virtual_clock.real_perf_counter() - wall0 < 5.0, "an hour of timers took no hour"
    assert time.perf_counter_ns() < time.perf_counter_ns(), "every reading is later than the one before"
    assert abs(time.time() - (time.time_ns() / 1e9)) < 1e-3


async def test_a_thread_job_holds_the_clock_until_its_result_is_back(virtual_clock):
    if virtual_clock is None:
        pytest.skip("DUPLEX_REAL_CLOCK=1")
    started = threading.Event()
    release = threading.Event()

    def work():
        started.set()
        release.wait()  # real work of unknown length: no virtual time passes meanwhile
        return time.perf_counter()

    t0 = time.perf_counter()
    job = asyncio.get_running_loop().run_in_executor(None, work)
    ticks = []

    async def ticker():
        while not job.done():
            ticks.append(time.perf_counter() - t0)
            await asyncio.sleep(0.01)

    tick = asyncio.create_task(ticker())
    await asyncio.to_thread(started.wait)
    threading.Timer(0.2, release.set).start()  # 0.2 s of real time
    done_at = await job
    await tick
    assert done_at - t0 < 0.005, "the job's real 0.2 s took no virtual time"
    assert max(ticks) < 0.02


async def test_a_thread_job_asleep_lets_the_clock_go_on(virtual_clock):
    if virtual_clock is None:
        pytest.skip("DUPLEX_REAL_CLOCK=1")

    def nap():
        t = time.monotonic()
        time.sleep(5.0)
        return time.monotonic() - t

    slept = await asyncio.wait_for(asyncio.to_thread(nap), timeout=60)
    assert slept == pytest.approx(5.0, abs=1e-3)
    # a timeout shorter than the nap fires first, at its own virtual time
    t0 = time.perf_counter()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(asyncio.to_thread(time.sleep, 5.0), timeout=1.0)
    assert time.perf_counter() - t0 == pytest.approx(1.0, abs=1e-3)


async def test_a_queued_job_whose_await_was_cancelled_lets_the_clock_go(virtual_clock):
    if virtual_clock is None:
        pytest.skip("DUPLEX_REAL_CLOCK=1")
    from concurrent.futures import ThreadPoolExecutor

    loop = asyncio.get_running_loop()
    release = threading.Event()
    with ThreadPoolExecutor(1) as one:
        first = loop.run_in_executor(one, release.wait)
        queued = loop.run_in_executor(one, time.perf_counter)  # waits behind the first
        queued.cancel()  # its work is cancelled before it began: it never runs
        release.set()
        await first
        t0 = time.perf_counter()
        await asyncio.wait_for(asyncio.sleep(10.0), timeout=20.0)  # the clock was not left held
        assert time.perf_counter() - t0 == pytest.approx(10.0, abs=1e-3)


async def test_real_time_paces_the_clock_while_waiting_on_another_process(virtual_clock):
    if virtual_clock is None:
        pytest.skip("DUPLEX_REAL_CLOCK=1")
    import sys

    code = "import time; time.sleep(0.3); print('up', flush=True)"
    ticks = []

    async def ticker():
        while True:
            ticks.append(time.perf_counter())
            await asyncio.sleep(0.05)

    tick = asyncio.create_task(ticker())
    real0, t0 = virtual_clock.real_perf_counter(), time.perf_counter()
    with virtual_clock.real_time():
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE)
        line = await asyncio.wait_for(proc.stdout.readline(), timeout=1.0)  # would time out at once unpaced
        await proc.wait()
    real_s, virtual_s = virtual_clock.real_perf_counter() - real0, time.perf_counter() - t0
    tick.cancel()
    assert line == b"up\n"
    assert virtual_s == pytest.approx(real_s, abs=0.05) and virtual_s >= 0.3
    assert len(ticks) <= real_s / 0.05 + 2, "timers fired at their real time, not all at once"
    t1 = virtual_clock.real_perf_counter()
    await asyncio.sleep(30.0)  # outside, the clock jumps again
    assert virtual_clock.real_perf_counter() - t1 < 1.0
