"""Safe defaults (issue 40): `duplex serve` will not listen beyond loopback without a token unless
told so loudly; a token given to the server guards the phone routes too; the shipped Dockerfile
and Kubernetes manifest need the token; AudioSocket takes calls only from allowed networks
(default loopback); every route's guard is logged at start-up."""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
import yaml
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from agent.serving import cli
from helpers import await_until, free_port
from test_serving import serving
from transport.telephony.audiosocket import UUID, encode_frame
from transport.telephony.audiosocket_server import networks, source_allowed

ROOT = Path(__file__).resolve().parents[1]


class ModelsWouldLoad(Exception):
    pass


@pytest.fixture
def no_models(monkeypatch):
    def refuse(args):
        raise ModelsWouldLoad
    monkeypatch.setattr(cli, "_load", refuse)
    monkeypatch.delenv("DUPLEX_AUTH_TOKEN", raising=False)


def test_serve_refuses_to_listen_off_loopback_without_a_token(no_models):
    with pytest.raises(SystemExit, match="without --auth-token"):
        cli.main(["serve", "--host", "0.0.0.0"])
    with pytest.raises(SystemExit, match="without --auth-token"):
        cli.main(["serve", "--host", "192.0.2.1"])
    # loopback, a token, or the explicit opt-out: it goes on to load the models
    for argv in (["serve"], ["serve", "--host", "::1"], ["serve", "--host", "0.0.0.0", "--auth-token", "t"],
                 ["serve", "--host", "0.0.0.0", "--insecure-no-auth"]):
        with pytest.raises(ModelsWouldLoad):
            cli.main(argv)


async def test_the_server_itself_refuses_and_the_opt_out_is_logged_loudly(caplog):
    with pytest.raises(ValueError, match="without --auth-token"):
        async with serving(host="0.0.0.0"):
            pass
    caplog.set_level(logging.INFO, logger="duplex.serve")
    async with serving(host="0.0.0.0", insecure_no_auth=True) as s:
        assert s.server.ready.is_set()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("--insecure-no-auth" in m and "NO TOKEN" in m for m in warnings), warnings


async def test_every_route_guard_is_logged_at_start(caplog):
    caplog.set_level(logging.INFO, logger="duplex.serve")
    async with serving(token="s3cret", audiosocket_port=free_port()):
        pass
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("guard: ")]
    for route in ("/ws", "/webrtc/offer", "/twilio", "/telnyx", "/plivo", "/exotel", "/vonage",
                  "AudioSocket", "/metrics"):
        assert any(route in line for line in lines), (route, lines)
    assert not [r for r in caplog.records if r.getMessage().startswith("guard: ") and r.levelno >= logging.WARNING]


@pytest.mark.usefixtures("virtual_clock")  # the server and its clients on this loop
async def test_a_server_token_guards_the_phone_routes():
    async with serving(token="s3cret") as s:
        for route in ("/twilio", "/telnyx", "/plivo", "/exotel", "/vonage"):
            with pytest.raises(InvalidStatus) as refused:
                async with connect(s.url(route)):
                    pass
            assert refused.value.response.status_code == 401, route
            async with connect(s.url(f"{route}?token=s3cret")):
                pass


def test_the_shipped_image_and_manifest_require_the_token():
    agent = next(d for d in yaml.safe_load_all((ROOT / "deploy/kubernetes/agent.yaml").read_text())
                 if d and d["kind"] == "Deployment")
    (container,) = agent["spec"]["template"]["spec"]["containers"]
    (token,) = [e for e in container["env"] if e["name"] == "DUPLEX_AUTH_TOKEN"]
    assert token["valueFrom"]["secretKeyRef"].get("optional", False) is False
    assert "--insecure-no-auth" not in container["args"] and "0.0.0.0" in container["args"]
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "--insecure-no-auth" not in dockerfile and '"0.0.0.0"' in dockerfile  # so the token is needed


def test_audiosocket_sources_are_checked_by_network():
    allowed = networks(["127.0.0.0/8", "::1", "10.1.0.0/16"])
    assert source_allowed("127.0.0.1", allowed) and source_allowed("::1", allowed)
    assert source_allowed("::ffff:10.1.2.3", allowed) and source_allowed("10.1.200.9", allowed)
    assert not source_allowed("10.2.0.1", allowed) and not source_allowed("192.0.2.1", allowed)
    assert not source_allowed(None, allowed) and not source_allowed("nonsense", allowed)
    with pytest.raises(ValueError, match="--audiosocket-allow"):
        networks(["10.0.0.0/33"])


async def audiosocket_call_admitted(s, port: int) -> bool:
    """Whether a call placed from 127.0.0.1 becomes a live conversation (else the server hangs up)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(encode_frame(UUID, bytes(range(16))) + encode_frame(0x10, bytes(320)))
        await writer.drain()
        admitted = asyncio.create_task(await_until(lambda: s.admission.live == 1, timeout=10))
        closed = asyncio.create_task(reader.read())  # b"" (or a reset) once the server drops it
        done, _ = await asyncio.wait([admitted, closed], return_when=asyncio.FIRST_COMPLETED)
        for task in (admitted, closed):
            task.cancel()
        await asyncio.gather(admitted, closed, return_exceptions=True)
        return admitted in done and admitted.result()
    finally:
        writer.close()


async def test_audiosocket_refuses_a_source_outside_its_allowlist():
    asp = free_port()
    async with serving(audiosocket_port=asp, audiosocket_allow=["10.0.0.0/8"]) as s:
        assert not await audiosocket_call_admitted(s, asp)
        assert s.admission.live == 0
    asp = free_port()
    async with serving(audiosocket_port=asp) as s:  # default: loopback
        assert await audiosocket_call_admitted(s, asp)


def test_serve_prints_every_routes_guard_at_start(monkeypatch, capsys):
    from agent.serving import server as serving
    from test_serving import doubles

    async def served(self):
        return None

    monkeypatch.setattr(cli, "_load", lambda args: doubles())
    monkeypatch.setattr(serving.Server, "run", served)
    monkeypatch.delenv("DUPLEX_AUTH_TOKEN", raising=False)
    cli.main(["serve", "--port", "0", "--twilio-auth-token", "tw", "--audiosocket", "0"])
    guards = [line for line in capsys.readouterr().out.splitlines() if line.startswith("duplex: guard: ")]
    assert any("/ws" in g and "NO TOKEN" in g for g in guards), guards
    assert any(g.startswith("duplex: guard: /twilio: Twilio's signature") for g in guards), guards
    assert any(g.startswith("duplex: guard: /exotel: OPEN") for g in guards), guards
    assert any("AudioSocket" in g and "127.0.0.0/8" in g for g in guards), guards
