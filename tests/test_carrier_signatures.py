"""What each carrier signs on a phone media-stream upgrade, checked as it documents it
(transport.telephony.signatures): Twilio's X-Twilio-Signature against the `twilio` package's
own RequestValidator, Plivo's V3 signature against vectors made with the `plivo` SDK's
signature code, Vonage's HS256 JWT made with PyJWT, the shared token where a carrier signs
nothing, and the guards on real loopback sockets (a refused upgrade gets its status before it
opens)."""
from __future__ import annotations

import asyncio
import base64
import json

import pytest
from helpers import free_port
from twilio.request_validator import RequestValidator
from websockets.asyncio.client import connect
from websockets.datastructures import Headers
from websockets.exceptions import InvalidStatus
from websockets.http11 import Request

from transport.telephony.media_streams import DIALECTS, MediaStreamCall
from transport.telephony.media_streams_ws import MediaStreamTransport
from transport.telephony.signatures import (
    PHONE_ROUTES,
    PlivoSignature,
    TokenRequired,
    TwilioSignature,
    VonageSignature,
    carrier_guards,
    plivo_signature,
    twilio_signature,
    unguarded_routes,
    url_variants,
)
from transport.web.server import run_server

FORBIDDEN, UNAUTHORIZED = 403, 401
TWILIO_TOKEN = "12345678901234567890123456789012"
PLIVO_TOKEN = "MAXXXXXXXXXXXXXXXXXX-token"
VONAGE_SECRET = "a-vonage-signature-secret-of-32-bytes!"
TOKEN = "s3cret-duplex-token"


def upgrade(path: str, host: str = "agent.example.com", **headers: str) -> Request:
    h = Headers(Host=host)
    for name, value in headers.items():
        h[name.replace("_", "-")] = value
    return Request(path, h)


def status(refusal) -> int | None:
    return None if refusal is None else refusal[0].value


# --- Twilio ---------------------------------------------------------------------------------

URLS = ["wss://agent.example.com/twilio",
        "wss://agent.example.com/twilio?CallSid=CA123&lang=en",
        "wss://agent.example.com:8443/twilio?b=2&a=1&a=%20x",
        "wss://agent.example.com/duplex/twilio?caller=%2B14155550100&empty=",
        "https://mycompany.com/myapp.php?foo=1&bar=2"]


@pytest.mark.parametrize("url", URLS)
def test_twilio_signature_is_the_request_validators(url):
    validator = RequestValidator(TWILIO_TOKEN)
    assert twilio_signature(TWILIO_TOKEN, url) == validator.compute_signature(url, {})
    params = {"CallSid": "CA1234567890ABCDE", "Caller": "+12349013030", "Digits": "1234"}
    assert twilio_signature(TWILIO_TOKEN, url, params) == validator.compute_signature(url, params)


@pytest.mark.parametrize("path", ["/twilio", "/twilio?CallSid=CA123&lang=en", "/twilio?x=%20y"])
def test_twilio_accepts_what_request_validator_signs(path):
    url = f"wss://agent.example.com{path}"
    signature = RequestValidator(TWILIO_TOKEN).compute_signature(url, {})
    assert RequestValidator(TWILIO_TOKEN).validate(url, {}, signature)
    guard = TwilioSignature(TWILIO_TOKEN)
    assert guard(upgrade(path, X_Twilio_Signature=signature)) is None


def test_twilio_refuses_a_wrong_missing_or_moved_signature():
    guard = TwilioSignature(TWILIO_TOKEN)
    good = RequestValidator(TWILIO_TOKEN).compute_signature("wss://agent.example.com/twilio?lang=en", {})
    assert guard(upgrade("/twilio?lang=en", X_Twilio_Signature=good)) is None
    wrong = RequestValidator("another-auth-token").compute_signature("wss://agent.example.com/twilio?lang=en", {})
    assert status(guard(upgrade("/twilio?lang=en", X_Twilio_Signature=wrong))) == FORBIDDEN
    assert status(guard(upgrade("/twilio?lang=en"))) == FORBIDDEN  # missing
    assert status(guard(upgrade("/twilio?lang=en", X_Twilio_Signature=""))) == FORBIDDEN
    # the same signature on an altered URL: query, path, host, scheme
    assert status(guard(upgrade("/twilio?lang=fr", X_Twilio_Signature=good))) == FORBIDDEN
    assert status(guard(upgrade("/twilio", X_Twilio_Signature=good))) == FORBIDDEN
    assert status(guard(upgrade("/twilio?lang=en", host="evil.example.com", X_Twilio_Signature=good))) == FORBIDDEN
    ws = RequestValidator(TWILIO_TOKEN).compute_signature("ws://agent.example.com/twilio?lang=en", {})
    assert status(guard(upgrade("/twilio?lang=en", X_Twilio_Signature=ws))) == FORBIDDEN
    # signed with a Webhook Rule's SharedKey: not ours to check
    assert status(guard(upgrade("/twilio?lang=en", X_Twilio_Signature=good,
                                X_Twilio_Webhooks_Signature_Settings="key=k,algorithm=HMAC_SHA256"))) == FORBIDDEN


def test_twilio_url_behind_a_proxy_and_default_ports():
    signed_for = "wss://agent.example.com/twilio"
    signature = RequestValidator(TWILIO_TOKEN).compute_signature(signed_for, {})
    behind = upgrade("/twilio", host="127.0.0.1:8080", X_Twilio_Signature=signature)
    assert status(TwilioSignature(TWILIO_TOKEN)(behind)) == FORBIDDEN
    assert TwilioSignature(TWILIO_TOKEN, public_url="wss://agent.example.com")(behind) is None
    assert TwilioSignature(TWILIO_TOKEN, public_url="wss://agent.example.com/")(behind) is None
    # a proxy that strips a path prefix
    prefixed = RequestValidator(TWILIO_TOKEN).compute_signature("wss://agent.example.com/duplex/twilio", {})
    assert TwilioSignature(TWILIO_TOKEN, "wss://agent.example.com/duplex")(
        upgrade("/twilio", host="10.0.0.5", X_Twilio_Signature=prefixed)) is None
    # signed with the default port, received without it, and the other way round
    with_port = RequestValidator(TWILIO_TOKEN).compute_signature("wss://agent.example.com:443/twilio", {})
    assert TwilioSignature(TWILIO_TOKEN)(upgrade("/twilio", X_Twilio_Signature=with_port)) is None
    assert TwilioSignature(TWILIO_TOKEN)(
        upgrade("/twilio", host="agent.example.com:443", X_Twilio_Signature=signature)) is None
    assert url_variants("wss://a.example.com:8443/x") == ["wss://a.example.com:8443/x"]


# --- Plivo ----------------------------------------------------------------------------------

# (URL signed, nonce, X-Plivo-Signature-V3) made with plivo 4.63.0's plivo/utils/signature_v3.py
# (construct_get_url + get_signature_v3, the body of validate_v3_signature for a GET) and
# PLIVO_TOKEN: the guide's form (the stream URL itself) and the plivo-stream-sdk's form
# ("http://" + the rest + "/websocket").
PLIVO_VECTORS = [
    ("wss://agent.example.com/plivo", "05429567804466091622", "KycbnaY986ypT+yrF5ozuUkVMq3wyNqMvGVwSekpY90="),
    ("wss://agent.example.com/plivo?token=abc&lang=en", "12345678901234567890",
     "Gt2fNRodOVQ8C8TwV6FdGKqpUziciwSnJET4cfrxF3A="),
    ("wss://agent.example.com:8443/plivo?b=2&a=%20x&a=1&empty=", "nonce-3",
     "BvkML4gcUofZ7dcPS5Y8xj3wRbKRHaZcySZm6SWA3wg="),
    ("wss://agent.example.com/duplex/plivo?caller=%2B14155550100", "99", "NxteCMcUu3Fj/oaNdsfNJ6nP0rzaOdl6jMMjGNB0bW0="),
    ("http://agent.example.com/plivo/websocket", "05429567804466091622", "gP9BoJdzLSO5FGFCcIxntRrSes+uPy9NEkl0Px/Ryqg="),
    ("http://agent.example.com:8080/duplex/plivo?token=abc/websocket", "77", "1a0ayOc6paZjr7Laxd/DJv0SPY9Zq9fuvMFn1WMgfvg="),
]


@pytest.mark.parametrize("url,nonce,expected", PLIVO_VECTORS)
def test_plivo_signature_is_the_plivo_sdks(url, nonce, expected):
    assert plivo_signature(PLIVO_TOKEN, url, nonce) == expected


def plivo_headers(url: str, nonce: str = "31415926535897932384", token: str = PLIVO_TOKEN) -> dict:
    return {"X_Plivo_Signature_V3": plivo_signature(token, url, nonce), "X_Plivo_Signature_V3_Nonce": nonce}


def test_plivo_accepts_either_signed_form_and_refuses_the_rest():
    guard = PlivoSignature(PLIVO_TOKEN)
    path = "/plivo?lang=en"
    assert guard(upgrade(path, **plivo_headers(f"wss://agent.example.com{path}"))) is None
    assert guard(upgrade(path, **plivo_headers(f"http://agent.example.com{path}/websocket"))) is None
    # several signatures, comma-separated, one of them right; the main account's header
    ok = plivo_headers(f"wss://agent.example.com{path}")
    listed = {**ok, "X_Plivo_Signature_V3": "bm90IGl0," + ok["X_Plivo_Signature_V3"]}
    assert guard(upgrade(path, **listed)) is None
    main = {"X_Plivo_Signature_Ma_V3": ok["X_Plivo_Signature_V3"],
            "X_Plivo_Signature_V3_Nonce": ok["X_Plivo_Signature_V3_Nonce"]}
    assert guard(upgrade(path, **main)) is None
    # wrong token, missing signature, missing nonce, another nonce, an altered query
    assert status(guard(upgrade(path, **plivo_headers(f"wss://agent.example.com{path}", token="other")))) == FORBIDDEN
    assert status(guard(upgrade(path, X_Plivo_Signature_V3_Nonce="1"))) == FORBIDDEN
    assert status(guard(upgrade(path, X_Plivo_Signature_V3=ok["X_Plivo_Signature_V3"]))) == FORBIDDEN
    assert status(guard(upgrade(path, **{**ok, "X_Plivo_Signature_V3_Nonce": "2"}))) == FORBIDDEN
    assert status(guard(upgrade("/plivo?lang=fr", **ok))) == FORBIDDEN
    # a header given twice is ambiguous: refused, not an error
    twice = upgrade(path, **ok)
    twice.headers["X-Plivo-Signature-V3-Nonce"] = "another"
    assert status(guard(twice)) == FORBIDDEN
    # behind a proxy
    assert PlivoSignature(PLIVO_TOKEN, "wss://agent.example.com")(upgrade(path, host="127.0.0.1:9", **ok)) is None


# --- Vonage ---------------------------------------------------------------------------------

NOW = 1_800_000_000.0


def vonage_jwt(secret: str = VONAGE_SECRET, **claims) -> str:
    jwt = pytest.importorskip("jwt")  # PyJWT, which twilio depends on
    body = {"iat": int(NOW), "jti": "c5ba8f24-1a14-4c10-bfdf-3fbe8ce511b5", "iss": "Vonage",
            "api_key": "a1b2c3d4", "application_id": "aaaaaaaa-bbbb-cccc-dddd-0123456789ab",
            "payload_hash": "d6c0e74b6857df20e3b7e51b30c0c2a40ec73a77879b6f074ddc7a2317dd031b", **claims}
    return jwt.encode({k: v for k, v in body.items() if v is not None}, secret, algorithm="HS256")


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def test_vonage_jwt_accepted_when_signed_and_fresh():
    guard = VonageSignature(VONAGE_SECRET)
    assert guard.refusal(upgrade("/vonage", **bearer(vonage_jwt())), now=NOW) is None
    assert guard.refusal(upgrade("/vonage", **bearer(vonage_jwt())), now=NOW + 290) is None
    pinned = VonageSignature(VONAGE_SECRET, application_id="aaaaaaaa-bbbb-cccc-dddd-0123456789ab")
    assert pinned.refusal(upgrade("/vonage", **bearer(vonage_jwt())), now=NOW) is None
    # the guard's own clock when called as run_server calls it
    assert VonageSignature(VONAGE_SECRET, clock=lambda: NOW + 1)(upgrade("/vonage", **bearer(vonage_jwt()))) is None


def test_vonage_jwt_refused_when_wrong_missing_or_stale():
    guard = VonageSignature(VONAGE_SECRET)

    def refused(request, now=NOW) -> bool:
        return status(guard.refusal(request, now=now)) == FORBIDDEN

    assert refused(upgrade("/vonage", **bearer(vonage_jwt(secret="another-secret-another-secret-another"))))
    assert refused(upgrade("/vonage"))  # missing
    assert refused(upgrade("/vonage", Authorization="Basic dXNlcjpwYXNz"))
    assert refused(upgrade("/vonage", **bearer("not.a.jwt")))
    assert refused(upgrade("/vonage", **bearer("garbage")))
    assert refused(upgrade("/vonage", **bearer(vonage_jwt())), now=NOW + 301 + 30)  # too old by iat
    assert refused(upgrade("/vonage", **bearer(vonage_jwt(iat=int(NOW) + 120))))  # from the future
    assert refused(upgrade("/vonage", **bearer(vonage_jwt(iat=None))))  # no iat
    assert refused(upgrade("/vonage", **bearer(vonage_jwt(exp=int(NOW) - 60))))  # expired
    assert refused(upgrade("/vonage", **bearer(vonage_jwt(iat="yesterday"))))
    pinned = VonageSignature(VONAGE_SECRET, application_id="another-application")
    assert status(pinned.refusal(upgrade("/vonage", **bearer(vonage_jwt())), now=NOW)) == FORBIDDEN
    # a tampered claim, and an unsigned token ("alg": "none") with the same claims
    head, claims, sig = vonage_jwt().split(".")
    forged = json.loads(base64.urlsafe_b64decode(claims + "==")) | {"application_id": "other"}
    forged_b64 = base64.urlsafe_b64encode(json.dumps(forged).encode()).rstrip(b"=").decode()
    assert refused(upgrade("/vonage", **bearer(f"{head}.{forged_b64}.{sig}")))
    none = base64.urlsafe_b64encode(b'{"alg":"none","typ":"JWT"}').rstrip(b"=").decode()
    assert refused(upgrade("/vonage", **bearer(f"{none}.{claims}.")))
    deep = base64.urlsafe_b64encode(b"[" * 100_000).rstrip(b"=").decode()
    assert refused(upgrade("/vonage", **bearer(f"{deep}.{claims}.{sig}")))
    twice = upgrade("/vonage", **bearer(vonage_jwt()))
    twice.headers["Authorization"] = "Bearer x"
    assert refused(twice)


# --- the shared token (Telnyx, Exotel; any carrier without its secret) ----------------------

def test_token_taken_from_query_bearer_or_basic_password():
    guard = TokenRequired(TOKEN)
    assert guard(upgrade(f"/telnyx?token={TOKEN}")) is None
    assert guard(upgrade(f"/telnyx?lang=en&token={TOKEN}")) is None
    assert guard(upgrade("/telnyx", **bearer(TOKEN))) is None
    basic = base64.b64encode(f"duplex:{TOKEN}".encode()).decode()
    assert guard(upgrade("/exotel", Authorization=f"Basic {basic}")) is None
    two_hosts = upgrade("/twilio", X_Twilio_Signature=twilio_signature(TWILIO_TOKEN, "wss://agent.example.com/twilio"))
    two_hosts.headers["Host"] = "evil.example.com"
    assert status(TwilioSignature(TWILIO_TOKEN)(two_hosts)) == FORBIDDEN
    for refused in (upgrade("/telnyx"), upgrade("/telnyx?token="), upgrade("/telnyx?token=wrong"),
                    upgrade("/telnyx", **bearer("wrong")),
                    upgrade("/exotel", Authorization="Basic " + base64.b64encode(f"{TOKEN}:x".encode()).decode()),
                    upgrade("/exotel", Authorization="Basic !!!")):
        assert status(guard(refused)) == UNAUTHORIZED
        assert guard(refused)[1].endswith("\n")


def test_carrier_guards_policy():
    assert carrier_guards() == {}
    assert unguarded_routes(carrier_guards()) == list(PHONE_ROUTES)
    assert carrier_guards(auth_token="", twilio_auth_token="") == {}  # empty means unset
    tokened = carrier_guards(auth_token=TOKEN)
    assert set(tokened) == set(PHONE_ROUTES) and unguarded_routes(tokened) == []
    assert all(isinstance(g, TokenRequired) for g in tokened.values())
    signed = carrier_guards(twilio_auth_token=TWILIO_TOKEN, plivo_auth_token=PLIVO_TOKEN,
                            vonage_signature_secret=VONAGE_SECRET, auth_token=TOKEN,
                            public_url="wss://agent.example.com")
    assert isinstance(signed["/twilio"], TwilioSignature) and signed["/twilio"].public_url == "wss://agent.example.com"
    assert isinstance(signed["/plivo"], PlivoSignature) and isinstance(signed["/vonage"], VonageSignature)
    assert isinstance(signed["/telnyx"], TokenRequired) and isinstance(signed["/exotel"], TokenRequired)
    # where the carrier signs, the token is no substitute for its signature
    assert status(signed["/twilio"](upgrade(f"/twilio?token={TOKEN}"))) == FORBIDDEN
    only_twilio = carrier_guards(twilio_auth_token=TWILIO_TOKEN)
    assert set(only_twilio) == {"/twilio"}
    assert unguarded_routes(only_twilio) == ["/telnyx", "/plivo", "/exotel", "/vonage"]
    # the clock and window reach the Vonage guard
    aged = carrier_guards(vonage_signature_secret=VONAGE_SECRET, max_age_s=10, clock=lambda: NOW + 100)
    assert status(aged["/vonage"](upgrade("/vonage", **bearer(vonage_jwt())))) == FORBIDDEN


# --- over real sockets ----------------------------------------------------------------------

async def test_guards_refuse_before_the_upgrade_on_real_sockets():
    port, ready = free_port(), asyncio.Event()
    opened: list[str] = []

    async def handler(transport):
        opened.append(transport.call.name)
        while await transport.receive() is not None:
            pass

    routes = {r: (lambda ws, d=d: MediaStreamTransport(ws, MediaStreamCall(DIALECTS[d])))
              for r, d in (("/twilio", "twilio"), ("/telnyx", "telnyx"))}
    guards = carrier_guards(twilio_auth_token=TWILIO_TOKEN, auth_token=TOKEN)
    server = asyncio.create_task(run_server(handler, "127.0.0.1", port, 16000, ready, routes=routes,
                                            guards=guards))
    try:
        await asyncio.wait_for(ready.wait(), 10)
        url = f"ws://127.0.0.1:{port}/twilio"
        # what Twilio signs is the wss:// URL it was given; here the Host the client sends
        signature = RequestValidator(TWILIO_TOKEN).compute_signature(f"wss://127.0.0.1:{port}/twilio", {})

        async def refused_status(url: str, **headers) -> int | None:
            try:
                async with connect(url, additional_headers=headers, open_timeout=5) as ws:
                    await ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
                    return None
            except InvalidStatus as exc:
                return exc.response.status_code

        assert await refused_status(url, **{"X-Twilio-Signature": signature}) is None
        wrong = RequestValidator("not-the-auth-token").compute_signature(f"wss://127.0.0.1:{port}/twilio", {})
        assert await refused_status(url, **{"X-Twilio-Signature": wrong}) == FORBIDDEN
        assert await refused_status(url) == FORBIDDEN
        assert await refused_status(f"{url}?token={TOKEN}") == FORBIDDEN
        assert await refused_status(f"ws://127.0.0.1:{port}/telnyx?token={TOKEN}") is None
        assert await refused_status(f"ws://127.0.0.1:{port}/telnyx", Authorization=f"Bearer {TOKEN}") is None
        assert await refused_status(f"ws://127.0.0.1:{port}/telnyx") == UNAUTHORIZED
        assert await refused_status(f"ws://127.0.0.1:{port}/telnyx?token=nope") == UNAUTHORIZED
        for _ in range(200):  # the handler runs once the upgrade is through
            if len(opened) == 3:
                break
            await asyncio.sleep(0.01)
        assert sorted(opened) == ["telnyx", "telnyx", "twilio"]  # the refused ones never reached it
    finally:
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)
