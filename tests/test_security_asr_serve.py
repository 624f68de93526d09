"""`duplex asr-serve`'s key (issue 40): the well-known default key only on loopback, keys from a
file or the environment (not only argv, which `ps` shows), compared in constant time over every
key, and a duplicated key header answered 400 (it was a 500 with a traceback). Real sockets on
127.0.0.1 against AsrServer with a stub recognizer: the key is checked before any stream."""
from __future__ import annotations

import contextlib

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

import asr.serving.server as asr_server
from asr.engine.scheduler import NoFreeSlot
from asr.serving.server import PATH, AsrServer, api_keys, parse_args
from helpers import self_signed_cert


class NoSlots:
    """A recognizer that refuses every stream (after the upgrade, in the protocol)."""

    name, batch_size, sessions = "stub", 1, []

    async def open_session(self):
        raise NoFreeSlot("stub")


async def upgrade_status(port: int, headers) -> int | None:
    try:
        async with connect(f"ws://127.0.0.1:{port}{PATH}", additional_headers=headers, open_timeout=10):
            return None
    except InvalidStatus as exc:
        return exc.response.status_code


@contextlib.asynccontextmanager
async def asr(keys):
    async with AsrServer(NoSlots(), keys).serving("127.0.0.1", 0) as port:
        yield port


async def test_a_duplicated_key_header_is_a_400_and_keys_are_checked():
    async with asr(("k1", "k2")) as port:
        assert await upgrade_status(port, [("kyutai-api-key", "k1"), ("kyutai-api-key", "k1")]) == 400
        assert await upgrade_status(port, [("kyutai-api-key", "k2")]) is None
        assert await upgrade_status(port, [("kyutai-api-key", "k3")]) == 401
        assert await upgrade_status(port, []) == 401


def test_every_key_is_compared_in_constant_time(monkeypatch):
    calls = []
    real = asr_server.hmac.compare_digest

    def counting(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(asr_server.hmac, "compare_digest", counting)
    assert asr_server.key_accepted("k1", frozenset({"k1", "k2", "k3"}))
    assert len(calls) == 3  # no early exit on the match


def test_no_default_key_off_loopback_and_keys_from_a_file_or_the_environment(tmp_path):
    assert api_keys(parse_args([]), environ={}) == ("public_token",)  # loopback: moshi-server's default
    with pytest.raises(SystemExit, match="well-known default key"):
        api_keys(parse_args(["--host", "0.0.0.0"]), environ={})
    keyfile = tmp_path / "keys"
    keyfile.write_text("# the agents' key\nfile-key\n\n")
    assert api_keys(parse_args(["--host", "0.0.0.0", "--api-key-file", str(keyfile)]), environ={}) == ("file-key",)
    assert api_keys(parse_args(["--host", "0.0.0.0"]), environ={"DUPLEX_ASR_API_KEY": "a, b"}) == ("a", "b")
    assert api_keys(parse_args(["--host", "0.0.0.0", "--no-auth"]), environ={}) is None
    with pytest.raises(SystemExit, match="api-key-file"):
        api_keys(parse_args(["--api-key-file", str(tmp_path / "missing")]), environ={})


def test_asr_serve_refuses_before_loading_a_model(monkeypatch):
    def would_load(args):
        raise AssertionError("the model would load")

    monkeypatch.setattr(asr_server, "build_recognizer", would_load)
    monkeypatch.delenv("DUPLEX_ASR_API_KEY", raising=False)
    with pytest.raises(SystemExit, match="well-known default key"):
        asr_server.main(["--host", "0.0.0.0"])


async def test_asr_serve_speaks_tls_with_a_certificate_the_test_makes(tmp_path):
    import asyncio
    import ssl
    import urllib.request

    from websockets.exceptions import InvalidMessage

    from asr.serving.server import tls_context

    cert, key, trust = self_signed_cert(tmp_path)
    async with AsrServer(NoSlots(), ("k1",)).serving("127.0.0.1", 0, ssl=tls_context(str(cert), str(key))) as port:
        async with connect(f"wss://127.0.0.1:{port}{PATH}", additional_headers={"kyutai-api-key": "k1"},
                           ssl=trust, open_timeout=10):
            pass
        with pytest.raises(InvalidStatus):  # TLS does not replace the key
            async with connect(f"wss://127.0.0.1:{port}{PATH}", ssl=trust, open_timeout=10):
                pass
        with pytest.raises(InvalidMessage):  # plain ws:// to the TLS port
            async with connect(f"ws://127.0.0.1:{port}{PATH}", open_timeout=5):
                pass
        with pytest.raises(ssl.SSLCertVerificationError):  # a client that does not trust the certificate
            async with connect(f"wss://127.0.0.1:{port}{PATH}", ssl=ssl.create_default_context(), open_timeout=5):
                pass

        def probe() -> int:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", timeout=10, context=trust) as r:
                return r.status
        assert await asyncio.to_thread(probe) == 200
