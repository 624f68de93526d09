"""The embedded llama.cpp chat model: streams text and stops within one token when cancelled."""
import asyncio
import contextlib
import time

import pytest

pytestmark = pytest.mark.models
SYSTEM = {"role": "system", "content": "Answer in one short English sentence."}


@pytest.fixture(scope="module")
def model():
    from llm import load_chat_model

    return load_chat_model("smollm2-135m")


async def test_streams_an_answer(model):
    pieces = [p async for p in model.stream([SYSTEM, {"role": "user", "content": "What is the capital of France?"}])]
    assert len(pieces) > 1 and "".join(pieces).strip()


async def test_cancel_stops_generation_within_one_token(model):
    msgs = [{"role": "system", "content": "You write very long stories."},
            {"role": "user", "content": "Tell me a very long story about a dragon."}]
    seen = 0
    async with contextlib.aclosing(model.stream(msgs, max_tokens=400)) as toks:
        async for _ in toks:
            seen += 1
            if seen == 5:
                break
    # after aclose the worker has stopped and released the model: a new request starts at once
    t = time.perf_counter()
    first = None
    async with contextlib.aclosing(model.stream([SYSTEM, {"role": "user", "content": "Say hi."}], max_tokens=5)) as toks:
        async for _ in toks:
            first = time.perf_counter() - t
            break
    assert first is not None
    assert model._lock.acquire(timeout=5)
    model._lock.release()


async def test_task_cancel_reaches_the_worker(model):
    produced = []

    async def consume():
        async for tok in model.stream([{"role": "system", "content": "You write very long stories."},
                                       {"role": "user", "content": "Tell a long story."}], max_tokens=400):
            produced.append(tok)

    task = asyncio.create_task(consume())
    while len(produced) < 3:
        await asyncio.sleep(0.01)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    n = len(produced)
    await asyncio.sleep(0.3)
    assert len(produced) == n  # nothing more arrives after the cancel
    assert model._lock.acquire(timeout=5), "the generation thread kept the model"
    model._lock.release()
