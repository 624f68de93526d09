"""Who may open a browser conversation: a shared token, when one is set, and the page's Origin,
so that another web page the user visits cannot open ws://127.0.0.1:PORT/ws behind their back.
The phone routes are for carriers, which send no Origin: a browser page may not open them at
all unless its origin is listed (`foreign_page`)."""
from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import urlsplit

from websockets.http11 import Request

from transport.credentials import has_token, header

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]"})


def _origin(text: str) -> str:
    return text.strip().rstrip("/").lower()


@dataclass(frozen=True)
class BrowserAccess:
    """`token`: None lets anyone in. `allowed_origins`: besides the server's own origin (the
    request's Host), the pages that may connect; empty means http(s)://localhost and 127.0.0.1
    on any port. A request without an Origin header is not from a browser and is not checked."""

    token: str | None = None
    allowed_origins: frozenset[str] = frozenset()

    @classmethod
    def of(cls, token: str | None, allowed_origins: list[str] | None) -> BrowserAccess:
        return cls(token or None, frozenset(_origin(o) for o in allowed_origins or ()))

    def refusal(self, request: Request) -> tuple[HTTPStatus, str] | None:
        """The status and reason to refuse this upgrade with, or None to let it through."""
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
        if origin in (f"http://{host.lower()}", f"https://{host.lower()}"):
            return True
        if self.allowed_origins:
            return origin in self.allowed_origins
        parts = urlsplit(origin)
        hostname = parts.netloc.rsplit(":", 1)[0] if not parts.netloc.endswith("]") else parts.netloc
        return parts.scheme in ("http", "https") and hostname in LOOPBACK_HOSTS

