"""A finished conversation is freed by reference counting alone (issue 42): its parts call back
through weak references and no error keeps a frame that refers to them, so nothing of it waits
for the cyclic collector. Run with the collector off; every object of the product's own classes
made by the conversation must be gone once the last reference to the session is."""
from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import weakref

import pytest

from agent import Agent, ToolPolicy, function_tool
from doubles import ScriptedLLM, ScriptedRecognizer, burst, said
from test_session_orchestration import converse, turn, with_silence
from test_tools_session import Script, call, spoken
from test_tools_session import converse as converse_with_tools

PRODUCT = ("agent.", "transport.", "asr.", "llm.", "tts.")
# the server's side of websockets' connection: what ours makes of each page (the client's own
# protocol is the test's, kept in the same cycle until the collector runs)
SERVED = ("websockets.server.ServerProtocol",)
# the test's own far end and tracer, which the test keeps until it returns
TEST_SIDE = {"transport.wavfile.WavConversationTransport", "transport.wavfile.ScriptedTurn",
             "transport.audio.Int16RateAdapter", "agent.tracing.trace.Tracer"}


_UNSEEN = object()


def counted_as(kind: type) -> str | None:
    """The name objects of type `kind` are counted under, or None: not the product's (nor SERVED).
    From the type alone: an object's own `__class__` may be a lazy proxy's, which imports its
    target when asked (openai's), building thousands of objects mid-census."""
    if issubclass(kind, weakref.ProxyTypes):
        return None  # a part's reference to the session: dead once the session is
    module = kind.__dict__.get("__module__") if issubclass(kind, type) else kind.__module__
    name = f"{module}.{kind.__qualname__}"
    return name if isinstance(module, str) and (module.startswith(PRODUCT) or name in SERVED) else None


def census() -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    names: dict[int, str | None] = {}  # counted_as by type: the whole process's objects, a lookup each
    for obj in gc.get_objects():
        kind = type(obj)
        name = names.get(id(kind), _UNSEEN)  # the type is alive while the list holds the object
        if name is _UNSEEN:
            name = names[id(kind)] = counted_as(kind)
        if name is not None:
            counts[name] += 1
    return counts


@contextlib.asynccontextmanager
async def collector_off():
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def left_after(run) -> dict:
    """The product's objects that one conversation (`run`, which returns nothing of it) leaves."""
    await run()  # the first one loads what stays for the process (caches, pools)
    async with collector_off():
        before = census()
        await run()
        await asyncio.sleep(0)  # done-callbacks
        left = census() - before
    return {name: n for name, n in left.items() if name not in TEST_SIDE}


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("virtual_clock")
async def test_a_conversation_cut_by_a_barge_in_is_freed_without_the_collector(tmp_path):
    async def run() -> None:
        llm = ScriptedLLM("Paris is the capital. It is a large city on the Seine with many bridges and parks.")
        session, wav, tracer = await converse(
            tmp_path, [turn(with_silence(burst(0.8))), turn(burst(0.5, seed=3), after=0.6)],
            ScriptedRecognizer(["what is the capital of France", "stop there please"]), llm)
        assert session.records[0].interrupted, "the first reply was cut"

    assert await left_after(run) == {}


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("virtual_clock")
async def test_a_conversation_whose_tool_a_barge_in_cancelled_is_freed_without_the_collector(tmp_path):
    @function_tool
    async def search_flights(destination: str) -> str:
        """Search flights."""
        await asyncio.sleep(30)
        return "none"

    async def run() -> None:
        script = Script(["find me a flight to Rome", "never mind"],
                        lambda user: [call("search_flights", destination="Rome")] if "flight" in user else
                        said("Okay."))
        agent = Agent(tools=[search_flights], tool_policy=ToolPolicy(filler_delay_s=0.3, filler_phrases=("One moment.",)))
        session, *_ = await converse_with_tools(tmp_path, [turn(spoken()), turn(burst(0.6, seed=2), after=1.5)],
                                                script, agent)
        assert session.records[0].interrupted

    assert await left_after(run) == {}


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("virtual_clock")  # server and page client on this loop, over loopback sockets
async def test_a_served_page_conversation_is_freed_without_the_collector():
    """Through the real server and the page's WebSocket protocol: what a conversation made (its
    transport, session and parts) is gone once it has ended."""
    from helpers import await_until
    from test_serving import question, serving, talk

    async with serving() as s:
        async def run() -> None:
            await talk(s.url("/ws"), question())
            assert await await_until(lambda: s.admission.live == 0, timeout=10)

        assert await left_after(run) == {}
