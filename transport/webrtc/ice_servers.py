"""The STUN/TURN servers of a WebRTC conversation, for both peers: the server's own aiortc peer
and the page, which gets them from `GET /webrtc/config` before it makes its offer. Sans-I/O:
every answer is a function of the options and a clock reading (unix time).

`--ice-server` takes three forms:

- `stun:HOST:PORT`;
- `USER:PASSWORD@turn:HOST:PORT?transport=udp`: static TURN credentials. The page is handed
  them as they are, so whoever may open the page can read them and use the relay;
- `turn:HOST:PORT?transport=udp` with a TURN secret: coturn's `use-auth-secret` ("TURN REST
  API") credentials, which expire (default after 10 minutes: they only need to last until the
  relay is allocated). Each /webrtc/config answer and each offer the server answers gets its
  own: username `"<expiry unix time>:duplex-<random>"` (unique, so coturn's logs and quotas can
  tell them apart), credential base64(HMAC-SHA1(secret, username)). coturn, holding the same
  secret, checks both. /webrtc/config is behind the same token and Origin checks as the offer,
  and the server limits how often one address asks (transport/limits.py).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass

CONFIG_PATH = "/webrtc/config"
DEFAULT_TTL_S = 600.0
REST_USER = "duplex"


def unique_user() -> str:
    """A user name of its own for one set of credentials."""
    return f"{REST_USER}-{secrets.token_hex(8)}"


@dataclass(frozen=True)
class IceServer:
    """One server in the browser's RTCIceServer terms (a single URL)."""

    url: str
    username: str | None = None
    credential: str | None = None

    @property
    def is_turn(self) -> bool:
        return self.url.startswith(("turn:", "turns:"))

    def to_page(self) -> dict:
        entry: dict = {"urls": [self.url]}
        if self.username is not None:
            entry["username"], entry["credential"] = self.username, self.credential or ""
        return entry


def parse(spec: str) -> IceServer:
    """`stun:...`, `turn:...` or `USER:PASSWORD@turn:...`; credentials are not required here
    (a TURN secret may supply them: `IceServers` checks)."""
    creds, _, url = spec.rpartition("@") if "@" in spec else ("", "", spec)
    if not url.startswith(("stun:", "turn:", "turns:")):
        raise ValueError(f"--ice-server needs a stun:, turn: or turns: URL, got {url!r}")
    if creds and not url.startswith(("turn:", "turns:")):
        raise ValueError(f"only a TURN server takes credentials, not {url!r}")
    user, sep, password = creds.partition(":")
    if creds and not (user and sep and password):
        raise ValueError(f"TURN credentials are USER:PASSWORD@{url}")
    return IceServer(url, user or None, password or None)


def rest_credentials(secret: str, now: float, ttl_s: float = DEFAULT_TTL_S,
                     user: str = REST_USER) -> tuple[str, str]:
    """coturn's use-auth-secret credentials, valid until `now + ttl_s` (unix time)."""
    username = f"{int(now + ttl_s)}:{user}"
    digest = hmac.new(secret.encode(), username.encode(), hashlib.sha1).digest()
    return username, base64.b64encode(digest).decode()


@dataclass(frozen=True)
class IceServers:
    """The `--ice-server` list, `--turn-secret` and `--turn-ttl`, checked when made (so a bad
    setting stops `duplex serve` at start, not at the first call)."""

    specs: tuple[str, ...] = ()
    turn_secret: str | None = None
    turn_ttl_s: float = DEFAULT_TTL_S

    def __post_init__(self):
        servers = [parse(s) for s in self.specs]
        needing = [s.url for s in servers if s.is_turn and s.username is None]
        if needing and not self.turn_secret:
            raise ValueError(f"TURN server {needing[0]} has no credentials: give USER:PASSWORD@{needing[0]}, "
                             "or --turn-secret / $DUPLEX_TURN_SECRET (coturn's static-auth-secret)")
        if self.turn_secret and not needing:
            raise ValueError("a TURN secret is set but no --ice-server turn:HOST:PORT without credentials uses it")
        if not self.turn_ttl_s > 0:
            raise ValueError(f"--turn-ttl must be positive, got {self.turn_ttl_s}")

    def at(self, now: float, user: str = REST_USER) -> list[IceServer]:
        """The servers with their credentials as of `now` (unix time): static ones as given,
        the others minted from the secret for `user` (give each caller its own: `unique_user`)."""
        out = []
        for server in map(parse, self.specs):
            if server.is_turn and server.username is None:
                user_name, credential = rest_credentials(self.turn_secret, now, self.turn_ttl_s, user)
                server = IceServer(server.url, user_name, credential)
            out.append(server)
        return out

    def page_config(self, now: float, user: str = REST_USER) -> dict:
        """The body of GET /webrtc/config: `{"iceServers": [RTCIceServer, ...]}` (empty list:
        host candidates only, as on a LAN or the same host)."""
        return {"iceServers": [s.to_page() for s in self.at(now, user)]}


def from_page_config(body: dict) -> list[IceServer]:
    """The servers in a /webrtc/config body, for a peer that is not a browser (aiortc)."""
    out = []
    for entry in body.get("iceServers", []):
        urls = entry["urls"] if isinstance(entry["urls"], list) else [entry["urls"]]
        out += [IceServer(u, entry.get("username"), entry.get("credential")) for u in urls]
    return out


__all__ = ["CONFIG_PATH", "DEFAULT_TTL_S", "IceServer", "IceServers", "from_page_config", "parse",
           "rest_credentials", "unique_user"]
