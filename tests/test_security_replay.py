"""Replayed carrier upgrades are refused (issue 40): a Vonage JWT by its jti (or the token itself)
while it could still be taken, a Plivo upgrade by its nonce; the memory is bounded and forgets
what has expired. The guards as `duplex serve` builds them (carrier_guards), then over real
sockets."""
from __future__ import annotations

import asyncio
import uuid

from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from helpers import free_port
from test_carrier_signatures import (
    FORBIDDEN, NOW, PLIVO_TOKEN, VONAGE_SECRET, bearer, plivo_headers, status, upgrade, vonage_jwt)
from transport.telephony.media_streams import DIALECTS, MediaStreamCall
from transport.telephony.media_streams_ws import MediaStreamTransport
from transport.telephony.signatures import SeenOnce, carrier_guards
from transport.telephony.vonage import VonageCall
from transport.web.server import run_server


def test_a_vonage_jwt_opens_the_route_once():
    clock = [NOW]
    guard = carrier_guards(vonage_signature_secret=VONAGE_SECRET, clock=lambda: clock[0])["/vonage"]
    token = vonage_jwt(jti=str(uuid.uuid4()))
    assert guard(upgrade("/vonage", **bearer(token))) is None
    refusal = guard(upgrade("/vonage", **bearer(token)))
    assert status(refusal) == FORBIDDEN and "replay" in refusal[1]
    assert guard(upgrade("/vonage", **bearer(vonage_jwt(jti=str(uuid.uuid4()))))) is None  # another call
    no_jti = vonage_jwt(jti=None)
    assert guard(upgrade("/vonage", **bearer(no_jti))) is None
    assert status(guard(upgrade("/vonage", **bearer(no_jti)))) == FORBIDDEN  # the token itself is kept


def test_a_plivo_nonce_opens_the_route_once():
    guard = carrier_guards(plivo_auth_token=PLIVO_TOKEN)["/plivo"]
    path = "/plivo?lang=en"
    signed = plivo_headers(f"wss://agent.example.com{path}", nonce=uuid.uuid4().hex)
    assert guard(upgrade(path, **signed)) is None
    assert status(guard(upgrade(path, **signed))) == FORBIDDEN
    assert guard(upgrade(path, **plivo_headers(f"wss://agent.example.com{path}", nonce=uuid.uuid4().hex))) is None
    # a wrong signature does not use the nonce up
    nonce = uuid.uuid4().hex
    assert status(guard(upgrade(path, **plivo_headers(f"wss://agent.example.com{path}", nonce, "other")))) == FORBIDDEN
    assert guard(upgrade(path, **plivo_headers(f"wss://agent.example.com{path}", nonce=nonce))) is None


def test_the_memory_is_bounded_and_forgets_what_expired():
    seen = SeenOnce(capacity=3)
    assert seen.first("a", until=10, now=0) and not seen.first("a", until=10, now=5)
    assert seen.first("a", until=20, now=10)  # expired: a token that old is refused for its age anyway
    for key in "bcdefg":
        assert seen.first(key, until=100, now=11)
    assert len(seen) == 3


async def test_a_replayed_vonage_upgrade_is_refused_on_real_sockets():
    port, ready = free_port(), asyncio.Event()
    opened = []

    async def handler(transport):
        opened.append(transport)
        while await transport.receive() is not None:
            pass

    routes = {"/vonage": lambda ws: MediaStreamTransport(ws, VonageCall()),
              "/plivo": lambda ws: MediaStreamTransport(ws, MediaStreamCall(DIALECTS["plivo"]))}
    guards = carrier_guards(vonage_signature_secret=VONAGE_SECRET, clock=lambda: NOW)
    server = asyncio.create_task(run_server(handler, "127.0.0.1", port, 16000, ready, routes=routes, guards=guards))
    try:
        await asyncio.wait_for(ready.wait(), 10)
        headers = bearer(vonage_jwt(jti=str(uuid.uuid4())))
        async with connect(f"ws://127.0.0.1:{port}/vonage", additional_headers=headers):
            pass
        try:
            async with connect(f"ws://127.0.0.1:{port}/vonage", additional_headers=headers):
                replayed = None
        except InvalidStatus as exc:
            replayed = exc.response.status_code
        assert replayed == FORBIDDEN
    finally:
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)
