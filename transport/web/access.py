"""Who may open a browser conversation: a shared token, when one is set, and the page's Origin,
so that another web page the user visits cannot open ws://127.0.0.1:PORT/ws behind their back.
The phone routes are for carriers, which send no Origin: a browser page may not open them at
all unless its origin is listed (`foreign_page`).

DNS rebinding: a page on evil.example whose name is made to resolve to 127.0.0.1 is same-origin
with the server as far as the browser knows, so its Origin matches its Host. The Host is checked
first (`host_refusal`, every request): a rebinding needs a name, so IP literals pass, and names
pass only if they are loopback ones or listed (--allowed-host, the bound host, the public URL's)."""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import urlsplit

from websockets.http11 import Request

from transport.credentials import has_token, header

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]"})


def _origin(text: str) -> str:
    return text.strip().rstrip("/").lower()


def host_name(authority: str) -> str:
    """The name in a Host header or an origin's netloc, lower case, without port or final dot:
    'Example.COM.:8080' -> 'example.com', '[::1]:80' -> '[::1]'."""
    authority = authority.strip().lower().rpartition("@")[2]
    if authority.startswith("["):
        return authority[:authority.find("]") + 1]
    return authority.partition(":")[0].rstrip(".")


def is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


def loopback_name(name: str) -> bool:
    # RFC 6761: *.localhost resolves to loopback, never through DNS
    return name in LOOPBACK_HOSTS or name.endswith(".localhost")


@dataclass(frozen=True)
class BrowserAccess:
    """`token`: None lets anyone in. `allowed_origins`: besides the server's own origin (the
    request's Host), the pages that may connect; empty means http(s)://localhost and 127.0.0.1
    on any port. A request without an Origin header is not from a browser and is not checked."""

    token: str | None = None
    allowed_origins: frozenset[str] = frozenset()
    allowed_hosts: frozenset[str] = frozenset()  # host names besides loopback ones and IP literals

    @classmethod
    def of(cls, token: str | None, allowed_origins: list[str] | None,
           allowed_hosts: list[str] | None = None) -> BrowserAccess:
        return cls(token or None, frozenset(_origin(o) for o in allowed_origins or ()),
                   frozenset(host_name(h) for h in allowed_hosts or () if h))

    def host_allowed(self, name: str) -> bool:
        return is_ip_literal(name) or loopback_name(name) or name in self.allowed_hosts

    def host_refusal(self, request: Request) -> tuple[HTTPStatus, str] | None:
        """Every request's first check: one Host header naming this server (DNS rebinding)."""
        host = header(request, "Host")
        if host is None:
            return HTTPStatus.BAD_REQUEST, "exactly one Host header is required\n"
        if not self.host_allowed(host_name(host)):
            return HTTPStatus.FORBIDDEN, f"host {host_name(host)[:100]} is not served here (see --allowed-host)\n"
        return None

    def refusal(self, request: Request) -> tuple[HTTPStatus, str] | None:
        """The status and reason to refuse this upgrade with, or None to let it through."""
        if (refusal := self.host_refusal(request)) is not None:
            return refusal
        origins = request.headers.get_all("Origin")
        if len(origins) > 1:
            return HTTPStatus.FORBIDDEN, "more than one Origin header\n"
        if origins and not self._origin_allowed(_origin(origins[0]), header(request, "Host") or ""):
            return HTTPStatus.FORBIDDEN, f"origin {origins[0]} is not allowed (see --allowed-origin)\n"
        if self.token is not None and not has_token(request, self.token):
            return HTTPStatus.UNAUTHORIZED, "a token is required: ?token=TOKEN or Authorization: Bearer TOKEN\n"
        return None

    def foreign_page(self, request: Request) -> tuple[HTTPStatus, str] | None:
        """A phone route's check before the carrier's own: carriers send no Origin header and
        browsers always do, so an upgrade with one is a web page, refused unless its origin is
        in `allowed_origins` (the server's own and loopback pages are not let in by default:
        no page of ours opens a phone route)."""
        origins = request.headers.get_all("Origin")
        if not origins:
            return None
        if len(origins) == 1 and _origin(origins[0]) in self.allowed_origins:
            return None
        return HTTPStatus.FORBIDDEN, (f"a web page (origin {origins[0][:100]}) may not open a phone route "
                                      "(see --allowed-origin)\n")

    def _origin_allowed(self, origin: str, host: str) -> bool:
        # the page's own origin: its Host has passed `host_refusal`, so it names this server
        if origin in (f"http://{host.lower()}", f"https://{host.lower()}"):
            return True
        if self.allowed_origins:
            return origin in self.allowed_origins
        parts = urlsplit(origin)
        hostname = parts.netloc.rsplit(":", 1)[0] if not parts.netloc.endswith("]") else parts.netloc
        return parts.scheme in ("http", "https") and hostname in LOOPBACK_HOSTS

