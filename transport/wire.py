"""Pieces every wire format shares: one JSON control message, checked before anything reads it,
and a tally of a peer's bad messages."""
from __future__ import annotations

import json
import logging

from transport.base import ProtocolError


def json_object(message: str, max_chars: int, key: str) -> dict:
    """Parse a JSON text message that must be an object with a string `key` ("type", "event"),
    or raise ProtocolError saying what is wrong with it."""
    if len(message) > max_chars:
        raise ProtocolError("frame_too_large", f"text message of {len(message)} chars exceeds {max_chars}")
    try:
        obj = json.loads(message)
    except (ValueError, RecursionError) as exc:  # ValueError: JSONDecodeError, and an integer of
        # more digits than Python converts (4300: sys.get_int_max_str_digits), which is valid JSON
        raise ProtocolError("bad_json", f"malformed JSON: {str(exc)[:200]}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get(key), str):
        raise ProtocolError("bad_message", f"a message must be a JSON object with a string '{key}'")
    return obj


class BadInput:
    """Counts one peer's bad messages (`count`) and logs the first ten, then every 1000th: a
    broken peer must not flood the log, and one that reads no errors (a phone network) is still
    diagnosable."""

    def __init__(self, log: logging.Logger, what: str) -> None:
        self.log, self.what, self.count = log, what, 0

    def __call__(self, exc: ProtocolError, peer: str | None) -> None:
        self.count += 1
        if self.count <= 10 or self.count % 1000 == 0:
            self.log.warning("%s %s: %s (%s); skipped (%d bad so far)", self.what, peer, exc, exc.code, self.count)
