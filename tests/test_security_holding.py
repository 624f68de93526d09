"""Nothing holds a slot for ever (issue 40): connections that say hello and then nothing lose their
slots after the idle timeout and /readyz turns 200 again; a call ends at the maximum length; one
address can hold only so many conversations, and open new ones only so fast. Real sockets
against `duplex serve`'s Server on the test doubles."""
from __future__ import annotations

import asyncio
import contextlib
import json

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from agent.serving.holding import Holding, HoldingPolicy
from helpers import await_until
from test_serving import RATE, get, serving
from transport.limits import SourceLimits, SourcePolicy

pytestmark = pytest.mark.usefixtures("virtual_clock")


async def hello_then_nothing(url: str) -> list[dict]:
    """A page that says hello and then sends nothing (its pings answered by the library); the
    events it was sent until the server closed it."""
    events = []
    async with connect(url) as ws:
        await ws.send(json.dumps({"type": "hello", "sample_rate": RATE}))
        with contextlib.suppress(ConnectionClosed):
            async for message in ws:
                if isinstance(message, str):
                    events.append(json.loads(message))
    return events


async def test_silent_connections_lose_their_slots_after_the_idle_timeout():
    async with serving(max_sessions=2, holding=HoldingPolicy(idle_s=1.0, max_call_s=None)) as s:
        held = [asyncio.create_task(hello_then_nothing(s.url("/ws"))) for _ in range(2)]
        assert await await_until(lambda: s.admission.live == 2, timeout=10)
        assert (await get(s.port, "/readyz"))[0] == 503
        logs = await asyncio.wait_for(asyncio.gather(*held), 30)
        assert await await_until(lambda: s.admission.live == 0, timeout=10)
        assert (await get(s.port, "/readyz"))[0] == 200
    for events in logs:
        errors = [e for e in events if e["type"] == "error"]
        assert errors and errors[-1]["code"] == "idle_timeout" and errors[-1]["fatal"], events


async def test_a_call_ends_at_the_maximum_length_even_while_busy():
    async with serving(holding=HoldingPolicy(idle_s=None, max_call_s=1.5)) as s:
        events = await asyncio.wait_for(hello_then_nothing(s.url("/ws")), 30)
        assert await await_until(lambda: s.admission.live == 0, timeout=10)
    assert [e["code"] for e in events if e["type"] == "error"][-1:] == ["call_too_long"]


def test_the_idle_clock_stops_while_someone_speaks_and_runs_again_after():
    h = Holding(HoldingPolicy(idle_s=10, max_call_s=100), now=0.0)
    assert h.expired(9.9) is None and h.expired(10.0).code == "idle_timeout"
    h.engaged(True, 5.0)  # the user starts speaking, or a reply is being played
    assert h.expired(50.0) is None
    h.engaged(False, 50.0)
    assert h.expired(59.0) is None and h.expired(60.0).code == "idle_timeout"
    h.heard(59.0)
    assert h.expired(68.0) is None
    assert h.expired(100.0).code == "call_too_long"
    assert Holding(HoldingPolicy(idle_s=0, max_call_s=0), 0.0).due(0.0) is None


def test_source_limits_count_live_conversations_and_new_ones_per_minute():
    now = [0.0]
    limits = SourceLimits(SourcePolicy(max_live=2, per_minute=60, burst=3, exempt=(), max_sources=2),
                          clock=lambda: now[0])
    assert [limits.refusal("192.0.2.1") for _ in range(3)] == [None] * 3
    assert "a minute" in limits.refusal("192.0.2.1")  # the burst is spent
    now[0] += 1.0  # one more a second
    assert limits.refusal("192.0.2.1") is None and limits.refusal("192.0.2.1") is not None
    assert limits.enter("192.0.2.2") and limits.enter("192.0.2.2") and not limits.enter("192.0.2.2")
    assert "at once" in limits.refusal("192.0.2.2")
    limits.leave("192.0.2.2")
    assert limits.enter("192.0.2.2")
    for i in range(100):  # the memory of rates is bounded
        limits.refusal(f"198.51.100.{i}")
    assert len(limits._buckets) == 2
    assert SourceLimits().refusal("127.0.0.1") is None and SourceLimits().enter("::1")  # loopback is exempt


async def test_one_address_is_refused_beyond_its_share_with_429():
    sources = SourcePolicy(max_live=1, per_minute=1, burst=3, exempt=())  # no refill to speak of
    async with serving(sources=sources) as s:
        async with connect(s.url("/ws")):
            assert await await_until(lambda: s.admission.live == 1, timeout=10)
            try:
                async with connect(s.url("/ws")):
                    status = None
            except InvalidStatus as exc:
                status = exc.response.status_code
            assert status == 429
        assert await await_until(lambda: s.admission.live == 0, timeout=10)
        statuses = []
        for _ in range(3):  # a burst of 3: the 2 above and one more
            try:
                async with connect(s.url("/ws")):
                    statuses.append(101)
            except InvalidStatus as exc:
                statuses.append(exc.response.status_code)
        assert statuses == [101, 429, 429], statuses
        assert (await get(s.port, "/healthz"))[0] == 200  # probes are not limited


def test_a_trusted_proxy_is_counted_by_the_address_it_forwards_for():
    limits = SourceLimits(SourcePolicy(trusted_proxies=("10.0.0.0/8",)))
    assert limits.client("10.1.2.3", "198.51.100.7") == "198.51.100.7"
    assert limits.client("10.1.2.3", "203.0.113.9, 198.51.100.7, 10.9.9.9") == "198.51.100.7"  # proxies skipped
    assert limits.client("10.1.2.3", "not-an-address") == "10.1.2.3"
    assert limits.client("192.0.2.1", "198.51.100.7") == "192.0.2.1"  # not a proxy of ours: its claim is ignored
    assert SourceLimits().client("127.0.0.1", "198.51.100.7") == "127.0.0.1"  # none trusted by default


async def test_behind_a_trusted_proxy_each_forwarded_address_has_its_own_share():
    sources = SourcePolicy(max_live=1, per_minute=600, burst=100, trusted_proxies=("127.0.0.1/32",))
    async with serving(sources=sources) as s:
        alice = {"X-Forwarded-For": "198.51.100.7"}
        async with connect(s.url("/ws"), additional_headers=alice):
            assert await await_until(lambda: s.admission.live == 1, timeout=10)
            try:
                async with connect(s.url("/ws"), additional_headers=alice):
                    status = None
            except InvalidStatus as exc:
                status = exc.response.status_code
            assert status == 429
            async with connect(s.url("/ws"), additional_headers={"X-Forwarded-For": "198.51.100.8"}):
                assert await await_until(lambda: s.admission.live == 2, timeout=10)  # bob has his own
