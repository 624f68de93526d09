"""Who may open a phone media stream: each carrier's signature on the WebSocket upgrade, as the
carrier documents it, or the server's `--auth-token` where the carrier signs nothing.

Sans-I/O: every check reads only a `websockets.http11.Request` (its `.path`, query included, and
its `.headers`) and, where a scheme carries a time, a `now` passed in. `carrier_guards` builds
the `run_server(guards=...)` dict keyed by route path; a guard returns None to let the upgrade
through, or `(status, reason)` to refuse it before it opens.

What each carrier signs on the upgrade (read in their public docs, 2026):

- **Twilio** (/twilio): `X-Twilio-Signature` on the Media Streams upgrade: base64 HMAC-SHA1 of
  the full URL Twilio was given (`wss://...`, query included), followed by the sorted POST
  parameters, of which a GET upgrade has none; the key is the account's auth token.
  https://www.twilio.com/docs/usage/webhooks/webhooks-security,
  https://www.twilio.com/docs/global-infrastructure/firewall-configurations/media-streams-configuration
  (which says to validate the header on Media Streams). Twilio's `RequestValidator` accepts the
  URL with and without its default port; so does this check. A request signed with a Webhook
  Rule's SharedKey (`X-Twilio-Webhooks-Signature-Settings`) is refused: we hold no SharedKey.
- **Plivo** (/plivo): `X-Plivo-Signature-V3` (or `X-Plivo-Signature-Ma-V3`, the main
  account's) and `X-Plivo-Signature-V3-Nonce` on the upgrade: base64 HMAC-SHA256, keyed with the
  auth token, of `scheme://host/path` plus `?` and the query sorted by key (decoded, `k=v`
  joined by `&`) when there is one, then `.` and the nonce; the header may list several
  signatures, comma-separated. The audio-streaming guide says Plivo signs WebSocket connection
  requests and to validate them as a GET:
  https://www.plivo.com/docs/voice-agents/audio-streaming/concepts/audio-streaming-guide
  (the string signed is the one of the `plivo` SDK's `validate_v3_signature`). Which URL it
  signs is less clear: that guide says the full URI, scheme included, but Plivo's own
  `plivo-stream-sdk` (0.1.1, `plivo_stream/fastapi/streaming.py`) checks "http://" + the rest
  of the URL + "/websocket" (and the `plivo` SDK refuses a wss:// URI outright). Not having
  seen a real Plivo upgrade, this accepts either form. The V3 scheme carries no timestamp, so
  only its nonce tells a replayed upgrade from a fresh one (see Replays, below); TLS is the
  defence beyond that memory.
- **Vonage** (/vonage): with `"authorization": {"type": "vonage"}` on the NCCO websocket
  endpoint, the Voice API sends the JWT of its signed webhooks in `Authorization: Bearer`:
  HS256, keyed with the account's signature secret, with `iat` (and `api_key`,
  `application_id`, `payload_hash`) among its claims. See the `WebsocketAuthorization` type of
  `@vonage/voice` and https://developer.vonage.com/en/getting-started/concepts/webhooks
  (decoding signed webhooks). The token must be HS256, verify, and be younger than `max_age_s`
  by its `iat` (and not past an `exp`, if it has one); `payload_hash` is not checked (an
  upgrade has no body, and TLS protects the URL).
- **Telnyx** (/telnyx): signs its HTTP webhooks (`telnyx-signature-ed25519` over
  `timestamp|payload`, with `telnyx-timestamp`), but its media-streaming docs describe no
  signature on the WebSocket upgrade
  (https://developers.telnyx.com/api-reference/websockets/stream-call-media-over-websocket,
  https://developers.telnyx.com/docs/voice/programmable-voice/media-streaming). So /telnyx takes
  the `--auth-token`. Put it in the `stream_url` (`?token=`), or give it as the streaming
  command's `stream_auth_token`; Telnyx says that token is "sent as part of the WebSocket
  connection" but not how, so a Bearer or Basic `Authorization` header with it is accepted too.
- **Exotel** (/exotel): documents IP allow-listing or Basic auth written into the URL
  (`wss://USER:TOKEN@host/path`, sent as `Authorization: Basic`), and no signature
  (https://developer.exotel.com/docs/agentstream/stream-voicebot-applet). So /exotel takes the
  `--auth-token` too: `?token=` or as the Basic password (any user name).

Replays: a signed upgrade seen once is refused the next time, where the scheme gives something
to remember (`carrier_guards` turns this on): a Vonage JWT by its `jti` (or, without one, the
token itself) until it is too old to be taken anyway; a Plivo upgrade by its nonce, for a day.
Both memories are bounded (`SeenOnce`, the soonest to expire forgotten first when full). A
Twilio signature covers the fixed URL only, with nothing that changes per upgrade: one logged
upgrade opens /twilio for as long as the auth token is valid. Keep that URL secret (TLS end to
end) and rotate the auth token if an upgrade's headers leak.

Policy, per route: the carrier's own secret, when given, makes its signature required (a token
is no substitute); otherwise `auth_token`, when given, is required as `?token=TOKEN`,
`Authorization: Bearer TOKEN` or as a Basic password; with neither, the route stays open, as it
was before, and `unguarded_routes` names it so that the server can say so. A refused signature
is answered 403; a missing or wrong token 401, as /ws does. Twilio's <Stream> reference says its
url takes no query string (custom values go in <Parameter>, inside the stream), so with only
`auth_token` set /twilio refuses Twilio itself: give Twilio's auth token for that route.

The URL a carrier signs is the public one it was given. Behind a proxy whose Host differs, or
that strips a path prefix, pass `public_url` ("wss://agent.example.com", or with the prefix);
by default it is "wss://" + the Host header: the carriers above connect over wss only, so a
ws:// URL is never what they signed, and it is not tried.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import heapq
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from websockets.http11 import Request

from transport.credentials import has_token, header, same_secret

# same shape as transport.web.server.Guard (not imported, to keep this free of the server)
Refusal = tuple[HTTPStatus, str]
Guard = Callable[[Request], Refusal | None]

PHONE_ROUTES = ("/twilio", "/telnyx", "/plivo", "/exotel", "/vonage")
DEFAULT_PORTS = {"wss": 443, "https": 443, "ws": 80, "http": 80}


def signed_url(request: Request, public_url: str | None = None) -> str | None:
    """The URL the carrier was given, as it signs it: `public_url` (scheme, host and any path
    prefix a proxy strips, e.g. "wss://agent.example.com") followed by the request's path and
    query; without one, "wss://" + the Host header (carriers connect over wss only). None
    without a Host."""
    if public_url:
        return public_url.rstrip("/") + request.path
    host = header(request, "Host")
    return f"wss://{host}{request.path}" if host else None


def url_variants(url: str) -> list[str]:
    """The URL as given, and with its scheme's default port added or removed: carriers' own
    validators try both, since the port in what they sign can differ from what a proxy sends."""
    parts = urlsplit(url)
    default = DEFAULT_PORTS.get(parts.scheme)
    try:
        port = parts.port
    except ValueError:
        return [url]
    if default is None:
        return [url]
    if port is None:
        return [url, urlunsplit(parts._replace(netloc=f"{parts.netloc}:{default}"))]
    if port == default:
        return [url, urlunsplit(parts._replace(netloc=parts.netloc.removesuffix(f":{port}")))]
    return [url]


# --- Twilio -----------------------------------------------------------------------------------

def twilio_signature(auth_token: str, url: str, params: dict[str, str] | None = None) -> str:
    """Twilio's X-Twilio-Signature: base64(HMAC-SHA1(auth token, URL + sorted key+value pairs))."""
    data = url + "".join(k + v for k, v in sorted((params or {}).items()))
    return base64.b64encode(hmac.new(auth_token.encode(), data.encode(), hashlib.sha1).digest()).decode()


@dataclass(frozen=True)
class TwilioSignature:
    auth_token: str
    public_url: str | None = None

    def __call__(self, request: Request) -> Refusal | None:
        return self.refusal(request)

    def refusal(self, request: Request) -> Refusal | None:
        given = header(request, "X-Twilio-Signature")
        if not given:
            return HTTPStatus.FORBIDDEN, "no X-Twilio-Signature: this route takes Twilio media streams only\n"
        if request.headers.get_all("X-Twilio-Webhooks-Signature-Settings"):
            return HTTPStatus.FORBIDDEN, ("signed with a Webhook Rule's SharedKey, which this server "
                                          "does not hold; it checks the auth token's signature\n")
        url = signed_url(request, self.public_url)
        if url is None:
            return HTTPStatus.FORBIDDEN, "no Host header to check X-Twilio-Signature against\n"
        if any(same_secret(given, twilio_signature(self.auth_token, u)) for u in url_variants(url)):
            return None
        return HTTPStatus.FORBIDDEN, (f"X-Twilio-Signature does not match {url} "
                                      "(wrong --twilio-auth-token, or set --public-url)\n")


# --- replays ----------------------------------------------------------------------------------

class SeenOnce:
    """A bounded, expiring memory of one-time values: `first(key, until, now)` is True the first
    time a key is offered and False for a replay before `until`. At most `capacity` are kept;
    when full, the one that expires soonest is forgotten first."""

    def __init__(self, capacity: int = 16384):
        self.capacity = capacity
        self._until: dict[str, float] = {}
        self._expiry: list[tuple[float, str]] = []  # heap of (until, key)

    def __len__(self) -> int:
        return len(self._until)

    def first(self, key: str, until: float, now: float) -> bool:
        while self._expiry and (self._expiry[0][0] <= now or len(self._until) >= self.capacity):
            when, old = heapq.heappop(self._expiry)
            if self._until.get(old) == when:
                del self._until[old]
        if key in self._until:
            return False
        self._until[key] = until
        heapq.heappush(self._expiry, (until, key))
        return True


PLIVO_REPLAY_S = 86400.0  # Plivo's nonce carries no time: remembered this long (or until evicted)


# --- Plivo ------------------------------------------------------------------------------------

def plivo_signed_string(url: str) -> str:
    """What Plivo's V3 scheme signs for a GET, before '.' + nonce: scheme://host/path, then '?'
    and the query's pairs sorted by key (then value), decoded, as k=v joined by '&'."""
    parts = urlsplit(url)
    base = urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
    pairs = sorted(parse_qsl(parts.query, keep_blank_values=True))
    return base + ("?" + "&".join(f"{k}={v}" for k, v in pairs) if pairs else "")


def plivo_signed_urls(url: str) -> list[str]:
    """The URLs Plivo may have signed for the stream URL `url`: as its guide says (the URL
    itself), and as its stream SDK checks ("http://" + the rest + "/websocket")."""
    rest = url.split("://", 1)[-1]
    return [*url_variants(url), *url_variants(f"http://{rest}/websocket")]


def plivo_signature(auth_token: str, url: str, nonce: str) -> str:
    """Plivo's X-Plivo-Signature-V3 of a GET (a WebSocket upgrade)."""
    data = f"{plivo_signed_string(url)}.{nonce}"
    return base64.b64encode(hmac.new(auth_token.encode(), data.encode(), hashlib.sha256).digest()).decode()


@dataclass(frozen=True)
class PlivoSignature:
    """`replays`: when given, a nonce already taken is refused (a replayed upgrade)."""

    auth_token: str
    public_url: str | None = None
    replays: SeenOnce | None = field(default=None, compare=False, repr=False)
    clock: Callable[[], float] = field(default=time.time, compare=False)

    def __call__(self, request: Request) -> Refusal | None:
        return self.refusal(request)

    def refusal(self, request: Request) -> Refusal | None:
        headers = request.headers
        given = [s.strip() for name in ("X-Plivo-Signature-V3", "X-Plivo-Signature-Ma-V3")
                 for value in headers.get_all(name) for s in value.split(",") if s.strip()]
        nonce = header(request, "X-Plivo-Signature-V3-Nonce")
        if not given or not nonce:
            return HTTPStatus.FORBIDDEN, ("no X-Plivo-Signature-V3 and nonce: this route takes "
                                          "Plivo audio streams only\n")
        url = signed_url(request, self.public_url)
        if url is None:
            return HTTPStatus.FORBIDDEN, "no Host header to check X-Plivo-Signature-V3 against\n"
        expected = [plivo_signature(self.auth_token, u, nonce) for u in plivo_signed_urls(url)]
        if any(same_secret(g, e) for g in given for e in expected):
            now = self.clock()
            if self.replays is not None and not self.replays.first(f"plivo:{nonce}", now + PLIVO_REPLAY_S, now):
                return HTTPStatus.FORBIDDEN, "this Plivo upgrade (its nonce) was seen before: a replay\n"
            return None
        return HTTPStatus.FORBIDDEN, (f"X-Plivo-Signature-V3 does not match {url} "
                                      "(wrong --plivo-auth-token, or set --public-url)\n")


# --- Vonage -----------------------------------------------------------------------------------

class BadToken(ValueError):
    pass


def _b64url(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise BadToken("not base64url") from exc


def verify_hs256(token: str, secret: str) -> dict:
    """The claims of an HS256 JWT whose signature `secret` makes, or BadToken. Only HS256 is
    taken: a token naming another algorithm ("none" among them) is refused, never trusted."""
    parts = token.split(".")
    if len(parts) != 3:
        raise BadToken("not a JWT")
    try:
        header = json.loads(_b64url(parts[0]))
        claims = json.loads(_b64url(parts[1]))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError among them
        raise BadToken("not a JWT") from exc
    if not isinstance(header, dict) or header.get("alg") != "HS256":
        raise BadToken("not signed with HS256")
    mac = hmac.new(secret.encode(), f"{parts[0]}.{parts[1]}".encode(), hashlib.sha256).digest()
    if not hmac.compare_digest(mac, _b64url(parts[2])):
        raise BadToken("signature does not match the signature secret")
    if not isinstance(claims, dict):
        raise BadToken("claims are not an object")
    return claims


def _number(claims: dict, name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadToken(f"{name} is not a number")
    return float(value)


@dataclass(frozen=True)
class VonageSignature:
    """`max_age_s`: how old (by `iat`) a token may be; `leeway_s`: clock skew allowed either
    way. `application_id`, when set, must be the token's `application_id` claim (the signature
    secret is the account's, shared by all its applications)."""

    signature_secret: str
    application_id: str | None = None
    max_age_s: float = 300.0
    leeway_s: float = 30.0
    clock: Callable[[], float] = field(default=time.time, compare=False)
    replays: SeenOnce | None = field(default=None, compare=False, repr=False)  # refuse a token seen before

    def __call__(self, request: Request) -> Refusal | None:
        return self.refusal(request)

    def refusal(self, request: Request, now: float | None = None) -> Refusal | None:
        scheme, _, token = (header(request, "Authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return HTTPStatus.FORBIDDEN, ("no Authorization: Bearer JWT: give the NCCO websocket endpoint "
                                          '"authorization": {"type": "vonage"}\n')
        now = self.clock() if now is None else now
        try:
            claims = verify_hs256(token.strip(), self.signature_secret)
            iat, exp, nbf = (_number(claims, n) for n in ("iat", "exp", "nbf"))
            if iat is None:
                raise BadToken("no iat")
            if iat > now + self.leeway_s or (nbf is not None and nbf > now + self.leeway_s):
                raise BadToken("issued in the future")
            if now - iat > self.max_age_s + self.leeway_s:
                raise BadToken(f"issued {now - iat:.0f} s ago, more than {self.max_age_s:.0f} s")
            if exp is not None and now > exp + self.leeway_s:
                raise BadToken("expired")
            if self.application_id is not None and claims.get("application_id") != self.application_id:
                raise BadToken("for another application")
            jti = claims.get("jti")
            key = f"jti:{jti}" if isinstance(jti, str) and jti else "jwt:" + hashlib.sha256(token.encode()).hexdigest()
            until = iat + self.max_age_s + 2 * self.leeway_s  # after that it is too old anyway
            if self.replays is not None and not self.replays.first(key, until, now):
                raise BadToken("already used (a replay)")
        except BadToken as exc:
            return HTTPStatus.FORBIDDEN, f"the Vonage JWT is refused: {exc}\n"
        return None


# --- the shared token, where a carrier signs nothing ------------------------------------------

# why each route wants the token, and how that carrier can send it
TOKEN_HINTS = {
    "/twilio": ("Twilio's <Stream> URL takes no query string: set --twilio-auth-token so that its "
                "signature is checked instead"),
    "/telnyx": "Telnyx signs nothing on this upgrade: put ?token=TOKEN in stream_url",
    "/plivo": "set --plivo-auth-token to check Plivo's signature, or put ?token=TOKEN in the <Stream> URL",
    "/exotel": "Exotel signs nothing: put ?token=TOKEN in the URL, or wss://duplex:TOKEN@host/exotel",
    "/vonage": ("set --vonage-signature-secret (NCCO authorization type vonage), or put ?token=TOKEN "
                "in the websocket uri"),
}


@dataclass(frozen=True)
class TokenRequired:
    """The server's `--auth-token`, as `?token=`, `Authorization: Bearer`, or the password of
    `Authorization: Basic` (any user name: Exotel sends wss://USER:TOKEN@host that way)."""

    token: str
    hint: str = "put ?token=TOKEN in the stream URL"

    def __call__(self, request: Request) -> Refusal | None:
        return self.refusal(request)

    def refusal(self, request: Request) -> Refusal | None:
        if has_token(request, self.token, basic=True):
            return None
        return HTTPStatus.UNAUTHORIZED, f"a token is required ({self.hint})\n"


# --- the entry point --------------------------------------------------------------------------

def carrier_guards(*, twilio_auth_token: str | None = None, plivo_auth_token: str | None = None,
                   vonage_signature_secret: str | None = None, vonage_application_id: str | None = None,
                   auth_token: str | None = None, public_url: str | None = None,
                   max_age_s: float = 300.0, clock: Callable[[], float] = time.time) -> dict[str, Guard]:
    """The guards for `run_server(guards=...)`, by route path. A carrier's own secret makes its
    signature required; else `auth_token` is required as ?token= (or Authorization); a route
    with neither gets no guard and stays open (see `unguarded_routes`). `public_url`: the
    scheme and host (and any path prefix) the carriers were given, when a proxy in front makes
    the Host seen here differ; default "wss://" + Host. Empty strings count as unset."""
    guards: dict[str, Guard] = {}
    token = auth_token or None
    if twilio_auth_token:
        guards["/twilio"] = TwilioSignature(twilio_auth_token, public_url or None)
    if plivo_auth_token:
        guards["/plivo"] = PlivoSignature(plivo_auth_token, public_url or None, replays=SeenOnce(), clock=clock)
    if vonage_signature_secret:
        guards["/vonage"] = VonageSignature(vonage_signature_secret, vonage_application_id or None,
                                            max_age_s=max_age_s, clock=clock, replays=SeenOnce())
    if token is not None:
        for route in PHONE_ROUTES:
            guards.setdefault(route, TokenRequired(token, TOKEN_HINTS[route]))
    return guards


def unguarded_routes(guards: dict[str, Guard]) -> list[str]:
    """The phone routes anyone who can reach the port may open (for a warning at start)."""
    return [r for r in PHONE_ROUTES if r not in guards]
