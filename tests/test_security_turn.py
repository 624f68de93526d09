"""TURN credentials are not an open relay (issue 40): each set has a user name of its own, they
last 10 minutes by default (not an hour), and one address may ask for them only so often. Real
sockets against `duplex serve`'s Server on the test doubles."""
from __future__ import annotations

import json
import time

from agent.serving.server import ServeConfig
from test_serving import get, serving
from transport.limits import SourcePolicy
from transport.webrtc.ice_servers import IceServers

SECRET = "north wind"
TURN = "turn:127.0.0.1:3478?transport=udp"


def test_credentials_last_ten_minutes_by_default():
    assert ServeConfig().turn_ttl_s <= 600 and IceServers().turn_ttl_s <= 600


async def test_each_answer_gets_a_user_name_of_its_own_and_a_short_life():
    async with serving(ice_servers=[TURN], turn_secret=SECRET) as s:
        users = []
        for _ in range(3):
            status, _, text = await get(s.port, "/webrtc/config")
            assert status == 200
            (entry,) = json.loads(text)["iceServers"]
            expiry, user = entry["username"].split(":")
            assert int(expiry) - time.time() <= 600 + 5
            users.append(user)
        assert len(set(users)) == 3, users


async def test_one_address_asking_too_often_gets_429():
    sources = SourcePolicy(per_minute=1, burst=2, exempt=())
    async with serving(ice_servers=[TURN], turn_secret=SECRET, sources=sources) as s:
        statuses = [(await get(s.port, "/webrtc/config"))[0] for _ in range(4)]
        assert statuses == [200, 200, 429, 429], statuses
        assert (await get(s.port, "/healthz"))[0] == 200
