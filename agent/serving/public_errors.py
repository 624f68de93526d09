"""What a caller is told when something fails: a code and a plain sentence, never where things
are. An LLM server's error names its URL, a recognizer's names the replica's address; those go
to the server log, and the far end gets the sentence for the code. Messages with no URL or
address in them (a protocol error about the caller's own input, a drain) pass as they are.

`public` is Sans-I/O; `PublicErrorsTransport` applies it to a conversation's events on their way
out (errors, and the error in a turn's latency summary) and logs what it held back.
"""
from __future__ import annotations

import dataclasses
import logging
import re

from transport.base import PassThrough, Transport
from transport.events import SessionError, SessionEvent, TurnLatency

log = logging.getLogger("duplex.serve")

# a URL, an IPv4 address, a bracketed IPv6 address, or a host:port
_WHERE = re.compile(r"[a-z][a-z0-9+.-]*://\S+|\b\d{1,3}(?:\.\d{1,3}){3}\b|\[[0-9a-f:.%]+\]|\b[\w.-]+:\d{2,5}\b",
                    re.IGNORECASE)
PLAIN = {
    "reply_failed": "the reply could not be made; please say that again",
    "no_recognizer": "speech recognition is not available right now",
    "recognizer_lost": "speech recognition was lost",
}
GENERIC = "something went wrong on the server"


def public(code: str, message: str) -> str:
    """`message` if it says nothing of where things are, else the plain sentence for `code`."""
    return PLAIN.get(code, GENERIC) if _WHERE.search(message or "") else message


class PublicErrorsTransport(PassThrough):
    """A conversation's transport, passed through, with errors made fit for the caller."""

    def __init__(self, inner: Transport, session_id: str):
        super().__init__(inner)
        self.session_id = session_id

    async def send_event(self, event: SessionEvent) -> None:
        if isinstance(event, SessionError) and (told := public(event.code, event.message)) != event.message:
            log.warning("%s: %s: %s", self.session_id, event.code, event.message)
            event = dataclasses.replace(event, message=told)
        elif isinstance(event, TurnLatency) and isinstance(error := event.summary.get("error"), str):
            if (told := public("reply_failed", error)) != error:
                event = TurnLatency({**event.summary, "error": told})
        await self.inner.send_event(event)
