"""STUN/TURN for the page: `GET /webrtc/config` (transport/webrtc/ice_servers.py) and coturn's
time-limited "TURN REST API" credentials, checked against a real coturn (`turnserver`) on
127.0.0.1: it takes the credentials we mint and refuses expired and forged ones, and a whole
conversation goes through its relay: an aiortc peer that gathers relay candidates only (the
browser's iceTransportPolicy "relay") and a server minting its own credentials for each offer.

Every socket is on 127.0.0.1: coturn listens and relays there, the server gathers 127.0.0.1
only (--ice-host), and a relay-only peer gathers no host address at all."""
from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import pytest
from helpers import await_until, free_port, wait_until
from test_serving import get, serving
from test_webrtc import LOOPBACK, base, loud_s, question, server_transports
from webrtc_peer import connect

from transport.webrtc.client import fetch_config
from transport.webrtc.ice import selected_pairs
from transport.webrtc.ice_servers import IceServer, IceServers, from_page_config, parse, rest_credentials

SECRET = "north wind"
needs_coturn = pytest.mark.skipif(shutil.which("turnserver") is None,
                                  reason="coturn is missing (scripts/setup.sh installs it)")


# ---- the credentials and the config body (pure) ---------------------------------------------------

def test_turn_rest_credentials_are_coturns_recipe():
    # the vector from openssl, not from our code:
    #   printf '1700003600:duplex' | openssl dgst -sha1 -hmac 'north wind' -binary | base64
    assert rest_credentials(SECRET, 1_700_000_000.9, ttl_s=3600) == ("1700003600:duplex",
                                                                     "yeNsoYZmu8Fg9NcPmCRiLmSoBRQ=")
    user, _ = rest_credentials(SECRET, 1_700_000_000, ttl_s=60)
    assert user == "1700000060:duplex"  # the expiry, in unix time
    assert rest_credentials("another secret", 1_700_000_000.9)[1] != "yeNsoYZmu8Fg9NcPmCRiLmSoBRQ="


def test_the_config_body_has_the_browsers_rtciceserver_shape():
    servers = IceServers(("stun:stun.example.org:3478", "alice:pa:ss@turn:static.example.org:3478?transport=udp",
                          "turn:rest.example.org:3478?transport=udp"), turn_secret=SECRET, turn_ttl_s=600)
    body = servers.page_config(1_700_000_000)
    user, credential = rest_credentials(SECRET, 1_700_000_000, 600)
    assert body == {"iceServers": [
        {"urls": ["stun:stun.example.org:3478"]},
        {"urls": ["turn:static.example.org:3478?transport=udp"], "username": "alice", "credential": "pa:ss"},
        {"urls": ["turn:rest.example.org:3478?transport=udp"], "username": user, "credential": credential},
    ]}
    assert json.loads(json.dumps(body)) == body
    later = servers.page_config(1_700_000_100)["iceServers"]
    assert later[1] == body["iceServers"][1]  # static credentials are handed out as they are
    assert later[2]["username"] == "1700000700:duplex" != user  # minted ones move with the clock
    assert IceServers().page_config(1_700_000_000) == {"iceServers": []}  # no servers: host candidates
    # what an aiortc peer makes of the body: the same servers
    assert from_page_config(body) == IceServers(servers.specs, SECRET, 600).at(1_700_000_000)
    assert from_page_config({"iceServers": [{"urls": "stun:a:1"}]}) == [IceServer("stun:a:1")]


@pytest.mark.parametrize("specs, secret, ttl, message", [
    (("turn:t.example:3478?transport=udp",), None, 3600, "has no credentials"),
    (("stun:s.example:3478",), SECRET, 3600, "no --ice-server turn:"),
    (("alice:pw@turn:t.example:3478",), SECRET, 3600, "no --ice-server turn:"),
    (("turn:t.example:3478",), SECRET, 0, "--turn-ttl must be positive"),
    (("http://t.example",), None, 3600, "stun:, turn: or turns:"),
    (("alice@turn:t.example:3478",), None, 3600, "USER:PASSWORD@"),
    (("alice:pw@stun:s.example:3478",), None, 3600, "only a TURN server takes credentials"),
])
def test_bad_ice_settings_are_refused_when_made(specs, secret, ttl, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        IceServers(specs, secret, ttl)
    assert parse("u:p@turns:t.example:5349?transport=tcp") == IceServer("turns:t.example:5349?transport=tcp", "u", "p")


def test_duplex_serve_stops_at_start_on_a_turn_url_without_credentials():
    env = {k: v for k, v in os.environ.items() if k != "DUPLEX_TURN_SECRET"}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "agent.serving.cli", "serve", "--port", str(free_port()),
                           "--ice-server", "turn:127.0.0.1:3478?transport=udp"],
                          check=False, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "duplex serve: TURN server turn:127.0.0.1:3478?transport=udp has no credentials" in proc.stderr, \
        proc.stderr[-2000:]
    assert "--turn-secret" in proc.stderr
    print(f"refused in {time.monotonic() - t0:.1f} s, before any model loaded")


# ---- the route ------------------------------------------------------------------------------------

async def test_the_config_route_obeys_the_token_and_the_origin():
    turn = "turn:127.0.0.1:3478?transport=udp"
    async with serving(ice_hosts=LOOPBACK, token="s3cret", ice_servers=[turn], turn_secret=SECRET,
                       turn_ttl_s=120) as s:
        status, text = await asyncio.to_thread(fetch_config, base(s))
        assert status == 401 and "token" in text
        status, headers, _ = await get(s.port, "/webrtc/config")
        assert status == 401 and headers.get("WWW-Authenticate") == "Bearer"
        status, _ = await asyncio.to_thread(fetch_config, base(s), None,
                                            {"Authorization": "Bearer s3cret", "Origin": "https://evil.example"})
        assert status == 403
        status, _ = await asyncio.to_thread(fetch_config, base(s), "s3cret",
                                            {"Origin": f"http://127.0.0.1:{s.port}"})  # the page's own origin
        assert status == 200
        status, headers, text = await get(s.port, "/webrtc/config?token=s3cret")
        assert status == 200 and headers["Content-Type"] == "application/json"
        assert headers["Cache-Control"] == "no-store"  # credentials that expire are never cached
        (entry,) = json.loads(text)["iceServers"]
        assert entry["urls"] == [turn]
        expiry, user = entry["username"].split(":")
        expiry = int(expiry)
        assert abs(expiry - (time.time() + 120)) < 5
        assert user.startswith("duplex-")  # a user name of its own (tests/test_security_turn.py)
        assert (entry["username"], entry["credential"]) == rest_credentials(SECRET, expiry - 120, 120, user)
        assert s.admission.live == 0  # asking for the config starts no conversation
    async with serving(ice_hosts=LOOPBACK) as s:  # nothing configured: the page gathers host candidates
        status, body = await asyncio.to_thread(fetch_config, base(s))
        assert (status, body) == (200, {"iceServers": []})


# ---- a real coturn -------------------------------------------------------------------------------

class Coturn:
    """`turnserver` on 127.0.0.1 only, no config file, use-auth-secret; its log kept (bounded)."""

    def __init__(self, tmp_path, secret: str = SECRET):
        self.port = free_port()
        self.log: collections.deque[str] = collections.deque(maxlen=20000)
        self.proc = subprocess.Popen(
            ["turnserver", "-n", "-v", "--simple-log", "--log-file=stdout", "--no-cli", "--no-tls", "--no-dtls",
             "--listening-ip=127.0.0.1", "--relay-ip=127.0.0.1", f"--listening-port={self.port}",
             "--use-auth-secret", f"--static-auth-secret={secret}", "--realm=duplex.test",
             "--allow-loopback-peers", "--no-tcp-relay", f"--pidfile={tmp_path / 'turnserver.pid'}",
             f"--db={tmp_path / 'turndb'}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.log.append(line.rstrip())

    def lines(self, pattern: str) -> list[str]:
        return [line for line in list(self.log) if re.search(pattern, line)]

    def wait_ready(self, timeout: float = 15) -> None:
        listening = f"UDP listener opened on: 127.0.0.1:{self.port}"
        assert wait_until(lambda: self.lines(re.escape(listening)) or self.proc.poll() is not None, timeout)
        assert self.proc.poll() is None, "\n".join(list(self.log)[-30:])

    def relay_addresses(self) -> set[tuple[str, int]]:
        return {(m[1], int(m[2])) for line in self.lines(r"Local relay addr: ")
                if (m := re.search(r"Local relay addr: ([\d.]+):(\d+)", line))}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)


@contextlib.contextmanager
def coturn(tmp_path, secret: str = SECRET):
    server = Coturn(tmp_path, secret)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


class _Quiet(asyncio.DatagramProtocol):
    pass


async def allocate(server: Coturn, username: str, credential: str) -> tuple[str, int] | None:
    """A TURN allocation on `server` with these credentials (aioice's client): its relayed
    address, or None when coturn refuses them."""
    import aioice.stun
    import aioice.turn

    try:
        transport, _ = await asyncio.wait_for(aioice.turn.create_turn_endpoint(
            _Quiet, server_addr=("127.0.0.1", server.port), username=username, password=credential), 10)
    except aioice.stun.TransactionFailed as exc:
        assert "401" in str(exc), exc
        return None
    try:
        return transport.get_extra_info("sockname")
    finally:
        transport.close()


@needs_coturn
async def test_coturn_takes_the_credentials_we_mint_and_refuses_expired_or_forged_ones(tmp_path):
    with coturn(tmp_path) as turn:
        now = time.time()
        relayed = await allocate(turn, *rest_credentials(SECRET, now, 3600))
        assert relayed is not None and relayed[0] == "127.0.0.1", relayed
        # coturn's log comes through a pipe and a thread: wait for it, briefly
        assert await await_until(lambda: tuple(relayed) in turn.relay_addresses(), 5), turn.relay_addresses()
        assert await allocate(turn, *rest_credentials(SECRET, now - 7200, 3600)) is None  # expired an hour ago
        assert await allocate(turn, *rest_credentials("a guessed secret", now, 3600)) is None
        user, credential = rest_credentials(SECRET, now, 3600)
        assert await allocate(turn, user.replace(":duplex", ":someone"), credential) is None  # not its HMAC
        assert await await_until(lambda: turn.lines("ALLOCATE processed, success"), 5)
        assert len(turn.lines("ALLOCATE processed, success")) == 1


def candidates(sdp: str) -> list[tuple[str, int, str]]:
    """(address, port, type) of each a=candidate line."""
    out = []
    for line in sdp.splitlines():
        if line.startswith("a=candidate:"):
            f = line.split()
            out.append((f[4], int(f[5]), f[f.index("typ") + 1]))
    return out


@needs_coturn
@pytest.mark.timeout(120)
async def test_a_conversation_goes_through_a_coturn_relay(tmp_path):
    with coturn(tmp_path) as turn:
        url = f"turn:127.0.0.1:{turn.port}?transport=udp"
        async with serving(ice_hosts=LOOPBACK, ice_servers=[url], turn_secret=SECRET) as s:
            status, body = await asyncio.to_thread(fetch_config, base(s))
            assert status == 200 and body["iceServers"][0]["urls"] == [url], body
            # the peer gets its TURN credentials from the page's config, and gathers relay only
            peer = await connect(base(s), question(), ice_servers=from_page_config(body), relay_only=True)
            try:
                offered = candidates(peer.pc.localDescription.sdp)
                assert offered and {typ for _, _, typ in offered} == {"relay"}, offered
                (inner,) = server_transports(s)
                # the server minted credentials of its own for this offer, and coturn took them
                answered = candidates(inner.pc.localDescription.sdp)
                assert {a for a, _, _ in answered} == {"127.0.0.1"}, answered
                server_relays = {(a, p) for a, p, typ in answered if typ == "relay"}
                assert server_relays, answered
                # both are allocations on this coturn (its log comes through a pipe and a thread)
                relays = {(a, p) for a, p, _ in offered} | server_relays
                assert await await_until(lambda: relays <= turn.relay_addresses(), 5), (relays, turn.relay_addresses())
                assert await await_until(lambda: len(turn.lines("ALLOCATE processed, success")) == 2, 5)

                assert await await_until(lambda: any(e["type"] == "bot_done" for e in peer.events), 30), \
                    [e["type"] for e in peer.events]
                assert await await_until(lambda: loud_s(peer.reply_pcm()) > 0.3, 10), "no reply audio came"
                # the peer's end of the pair ICE chose is its relay on coturn; relay-only, it has
                # no other socket (no host candidate was even gathered), so the reply came that way
                pairs = selected_pairs(peer.pc)
                assert pairs, "no nominated pair"
                for local, remote in pairs:
                    assert (local[0], local[1]) in {(a, p) for a, p, _ in offered}, pairs
                    assert remote[0] == "127.0.0.1", pairs
                assert turn.lines("CREATE_PERMISSION processed, success|CHANNEL_BIND processed, success")
            finally:
                await peer.close()
        # both allocations released (each peer connection closed sends coturn a zero-lifetime
        # refresh) and coturn's count of the packets it relayed from peers: the conversation's
        # media, some seconds at 50 packets/s each way
        assert await await_until(lambda: len(turn.lines(r"peer usage: ")) == 2, 15), turn.lines("usage")
        relayed = [int(re.search(r"rp=(\d+)", line)[1]) for line in turn.lines(r"peer usage: ")]
        assert sum(relayed) > 100, turn.lines("usage")
        print(f"peer relay {offered}, server candidates {answered}, pairs {pairs}; "
              f"coturn relayed {relayed} packets from peers")


@needs_coturn
@pytest.mark.browser
@pytest.mark.timeout(180)
def test_the_page_in_chromium_talks_through_the_relay(tmp_path):
    """The page itself (real Chromium, `?ice=relay`) gets its TURN credentials from
    /webrtc/config and its conversation goes through coturn, all in a namespace with only `lo`."""
    import numpy as np
    import soundfile as sf
    from doubles import burst
    from test_browser_e2e import CHROMIUM, own_network_namespace

    if CHROMIUM is None or not own_network_namespace():
        pytest.skip("needs Debian's chromium and unshare -rn")
    wav, out = tmp_path / "mic.wav", tmp_path / "page.json"
    sf.write(wav, np.concatenate([np.zeros(16000, np.float32), burst(1.0, seed=1), np.zeros(48000, np.float32)]),
             16000, subtype="PCM_16")
    script = os.path.join(os.path.dirname(__file__), "browser_turn_in_netns.py")
    proc = subprocess.run(["unshare", "-rn", sys.executable, script, str(wav), str(tmp_path), str(out)],
                          check=False, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    result = json.loads(out.read_text())
    kinds = [e["type"] for e in result["log"]]
    (ice,) = [e for e in result["log"] if e["type"] == "ice_servers"]
    assert len(ice["urls"]) == 1 and ice["urls"][0].startswith("turn:127.0.0.1:"), ice
    transport = next(e for e in result["log"] if e["type"] == "transport")
    assert transport["name"] == "webrtc", transport  # not the WebSocket fallback
    assert "player_started" in kinds, kinds  # the reply played
    pair = result["pair"]
    assert pair and pair["local"][2] == "relay", pair  # Chromium's end of the pair is its relay
    assert tuple(pair["local"][:2]) in {tuple(a) for a in result["relays"]}, (pair, result["relays"])
    assert pair["bytesReceived"] > 2000 and pair["bytesSent"] > 2000, pair
    assert max(result["peer_packets"]) > 50, result["peer_packets"]  # coturn relayed the media
    print(f"Chromium's pair {pair}; coturn relayed {result['peer_packets']} packets from peers")
