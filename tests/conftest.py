import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "real_clock: keeps the real clock in a module whose tests use virtual_clock")


@pytest.fixture
def one_torch_thread():
    """Tiny tensors: one thread is faster and immune to a busy machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def hf():
    """A tiny, seeded, random Kyutai STT model (transformers reference), window 8."""
    from asr.engine.kyutai import tiny_hf_model

    return tiny_hf_model(seed=0, window=8)


@pytest.fixture
async def virtual_clock(request):
    """The test's event loop and the time module on a virtual clock (tests/virtual_time.py): the
    conversation's seconds pass as fast as the CPU goes, in the same order as in real time.
    DUPLEX_REAL_CLOCK=1 runs them on the real clock instead, to compare. A test that is not a
    coroutine (no loop of its own to run on it), or one marked `real_clock`, keeps the real clock."""
    import asyncio
    import inspect
    import os

    from virtual_time import VirtualClock

    if (os.environ.get("DUPLEX_REAL_CLOCK") == "1" or not inspect.iscoroutinefunction(request.function)
            or request.node.get_closest_marker("real_clock")):
        yield None
        return
    with VirtualClock(asyncio.get_running_loop()) as clock:
        yield clock
