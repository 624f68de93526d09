"""What a caller presents on an HTTP upgrade: one header's value, the tokens it gives, and a
comparison of secrets that leaks nothing through its timing. Shared by the browser route's
access check (transport/web/access.py) and the carriers' (transport/telephony/signatures.py)."""
from __future__ import annotations

import base64
import binascii
import hmac
from urllib.parse import parse_qsl, urlsplit

from websockets.http11 import Request


def same_secret(given: str, expected: str) -> bool:
    # compare_digest: the time taken says nothing about how much of a wrong value was right
    return hmac.compare_digest(given.encode(), expected.encode())


def header(request: Request, name: str) -> str | None:
    """A header's value; None when it is absent or given more than once (ambiguous, refused)."""
    values = request.headers.get_all(name)
    return values[0] if len(values) == 1 else None


def _basic_password(credential: str) -> str | None:
    try:
        decoded = base64.b64decode(credential.strip(), validate=True).decode()
    except (binascii.Error, ValueError):
        return None
    return decoded.partition(":")[2] if ":" in decoded else None


def tokens_given(request: Request, basic: bool = False) -> list[str]:
    """`?token=` values and an `Authorization: Bearer` credential; with `basic`, also the
    password of `Authorization: Basic` (any user name)."""
    given = [v for k, v in parse_qsl(urlsplit(request.path).query, keep_blank_values=True) if k == "token"]
    scheme, _, credential = (header(request, "Authorization") or "").partition(" ")
    if scheme.lower() == "bearer":
        given.append(credential.strip())
    elif basic and scheme.lower() == "basic" and (password := _basic_password(credential)) is not None:
        given.append(password)
    return given


def has_token(request: Request, token: str, basic: bool = False) -> bool:
    return any(same_secret(g, token) for g in tokens_given(request, basic))
