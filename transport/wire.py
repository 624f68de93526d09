"""Pieces every wire format shares: one JSON control message, checked before anything reads it."""
from __future__ import annotations

import json

from transport.base import ProtocolError


def json_object(message: str, max_chars: int, key: str) -> dict:
    """Parse a JSON text message that must be an object with a string `key` ("type", "event"),
    or raise ProtocolError saying what is wrong with it."""
    if len(message) > max_chars:
        raise ProtocolError("frame_too_large", f"text message of {len(message)} chars exceeds {max_chars}")
    try:
        obj = json.loads(message)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ProtocolError("bad_json", f"malformed JSON: {exc}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get(key), str):
        raise ProtocolError("bad_message", f"a message must be a JSON object with a string '{key}'")
    return obj
