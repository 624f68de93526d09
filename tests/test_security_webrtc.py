"""A WebRTC offer never leaks its conversation slot (issue 40): between `admission.enter()` and
the conversation taking over, every way out of the negotiation (a bad offer, its own deadline,
and a cancellation, which is a BaseException) gives the slot back and closes the peer
connection. The negotiation is held mid-way by a peer connection whose setRemoteDescription
waits, so the test cancels it exactly there."""
from __future__ import annotations

import asyncio
import json

import pytest
from aiortc import RTCConfiguration, RTCPeerConnection
from websockets.datastructures import Headers
from websockets.http11 import Request

import transport.webrtc.signalling as signalling
from transport.admission import Admission
from transport.webrtc.ice import host_addresses
from transport.webrtc.signalling import WebRTCOffers, WebRTCOptions

LOOPBACK = ("127.0.0.1",)


async def an_offer() -> bytes:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("audio", direction="sendrecv")
    with host_addresses(LOOPBACK):
        await pc.setLocalDescription(await pc.createOffer())
    await pc.close()
    return json.dumps({"sdp": pc.localDescription.sdp, "type": "offer"}).encode()


REQUEST = Request("/webrtc/offer", Headers({"Content-Type": "application/json"}))


@pytest.fixture
def stalled(monkeypatch):
    """Peer connections whose remote description never settles; `.made` lists them, `.entered`
    is set once one is negotiating."""
    class Stalled(RTCPeerConnection):
        made: list[RTCPeerConnection] = []
        entered = asyncio.Event()

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            Stalled.made.append(self)

        async def setRemoteDescription(self, description):  # noqa: N802 - aiortc's name
            Stalled.entered.set()
            await asyncio.Event().wait()

    monkeypatch.setattr(signalling, "RTCPeerConnection", Stalled)
    return Stalled


async def never_called(transport):
    raise AssertionError("no conversation may start")


async def test_a_negotiation_cancelled_midway_gives_the_slot_back_and_closes_the_pc(stalled):
    admission = Admission(max_sessions=1)
    offers = WebRTCOffers(never_called, admission, WebRTCOptions(ice_hosts=LOOPBACK))
    body = await an_offer()
    answering = asyncio.create_task(offers.answer(REQUEST, body))
    await asyncio.wait_for(stalled.entered.wait(), 10)
    assert admission.live == 1
    answering.cancel()
    with pytest.raises(asyncio.CancelledError):
        await answering
    assert admission.live == 0 and admission.admitting, "the slot leaked"
    (pc,) = stalled.made
    for _ in range(100):  # the close goes on in a task of its own
        if pc.connectionState == "closed":
            break
        await asyncio.sleep(0.02)
    assert pc.connectionState == "closed"
    await offers.close()


@pytest.mark.usefixtures("virtual_clock")  # the server and its peers on this loop
async def test_a_negotiation_past_its_own_deadline_is_answered_503_and_released(stalled):
    admission = Admission(max_sessions=1)
    offers = WebRTCOffers(never_called, admission, WebRTCOptions(ice_hosts=LOOPBACK, negotiate_timeout_s=0.3))
    status, _, body = await asyncio.wait_for(offers.answer(REQUEST, await an_offer()), 10)
    assert status == 503 and b"timed out" in body
    assert admission.live == 0
    (pc,) = stalled.made
    assert pc.connectionState == "closed"
    await offers.close()


async def test_a_peer_connection_that_cannot_be_made_gives_the_slot_back(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no sockets left")

    monkeypatch.setattr(signalling, "RTCPeerConnection", broken)
    admission = Admission(max_sessions=1)
    offers = WebRTCOffers(never_called, admission, WebRTCOptions(ice_hosts=LOOPBACK))
    status, _, _ = await offers.answer(REQUEST, await an_offer())
    assert status == 400 and admission.live == 0


@pytest.mark.usefixtures("virtual_clock")  # the server and its peers on this loop
async def test_one_address_holds_at_most_its_share_of_webrtc_conversations():
    from helpers import await_until
    from test_serving import serving
    from transport.limits import SourcePolicy
    from webrtc_peer import connect

    sources = SourcePolicy(max_live=1, per_minute=600, burst=100, exempt=())
    async with serving(ice_hosts=LOOPBACK, sources=sources) as s:
        base = f"http://127.0.0.1:{s.port}"
        first = await connect(base)
        try:
            assert await await_until(lambda: first.pc.connectionState == "connected", 10)
            assert s.admission.live == 1
            with pytest.raises(RuntimeError, match="429"):
                await connect(base)
            assert s.admission.live == 1
        finally:
            await first.close()
        assert await await_until(lambda: s.admission.live == 0, 15), (s.admission.live, s.server.limits.live)
        again = await connect(base)  # its share is free again
        await again.close()
