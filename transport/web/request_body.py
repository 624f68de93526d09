"""A bounded request body (POST /webrtc/offer) on the port that serves the page and /ws.

websockets parses every request on its server but refuses any with a body ("unsupported
request body"). `BodySplitter` is a small Sans-I/O filter in front of its parser: it passes the
bytes of a GET through untouched; for a POST it holds the head, reads the body that its
Content-Length announces (at most `max_body` bytes), and hands websockets the head alone, so
`process_request` sees an ordinary request and reads the body from the connection. This keeps
one listening socket, TLS included (the filter sees decrypted bytes), and websockets' own
handshake, limits and timeouts for everything else.

`BodyConnection` is that filter on websockets' connection (its documented `create_connection`
hook). A body that cannot be taken (too large, chunked, a bad length) leaves `body_error`
set, (status, reason), and what follows it is discarded. A head that websockets' parser would
drop without an answer (a malformed request or header line, a GET with a body) is answered 400
here, with one log line (`check_head`).
"""
from __future__ import annotations

import logging
import re
from http import HTTPStatus

from transport.websocket_io import ServerLink

MAX_HEAD = 16384
MAX_BODY = 65536
BAD_REQUEST = (b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: 17\r\n"
               b"Connection: close\r\n\r\nunreadable request")
log = logging.getLogger("duplex.web")


# what websockets' own parser takes (websockets.http11); a head it would refuse gets no answer
# from it, only a closed connection, so it is refused here with a 400 instead
_REQUEST_LINE = re.compile(rb"[A-Z]{1,16} [\x21-\x7e]+ HTTP/1\.[01]")
_HEADER_NAME = re.compile(rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+")
_HEADER_VALUE = re.compile(rb"[\x09\x20-\x7e\x80-\xff]*")


def check_head(head: bytes) -> None:
    """ValueError saying what is wrong with a request head that websockets would drop unanswered:
    its request line, a header line, or a GET with a body (the body of a POST is ours to read)."""
    request_line, *lines = head[:-4].split(b"\r\n")
    if not _REQUEST_LINE.fullmatch(request_line):
        raise ValueError("a malformed request line")
    names = []
    for line in lines:
        name, colon, value = line.partition(b":")
        if not colon or not _HEADER_NAME.fullmatch(name) or not _HEADER_VALUE.fullmatch(value.strip(b" \t")):
            raise ValueError("a malformed header line")
        names.append((name.lower(), value.strip()))
    if not request_line.startswith(b"POST ") and any(
            n == b"transfer-encoding" or n == b"content-length" and v != b"0" for n, v in names):
        raise ValueError(f"a body on a {request_line.split(b' ')[0].decode()} request")


class BodySplitter:
    def __init__(self, max_body: int = MAX_BODY, max_head: int = MAX_HEAD):
        self.max_body, self.max_head = max_body, max_head
        self._buf = b""
        self._state = "head"  # head -> body -> pass | discard
        self._head = b""
        self._length = 0
        self.body: bytes | None = None  # a POST's body, once read
        self.body_error: tuple[HTTPStatus, str] | None = None

    def feed(self, data: bytes) -> bytes:
        """The bytes to hand websockets' parser now (possibly none)."""
        if self._state == "pass":
            return data
        if self._state == "discard":
            return b""
        self._buf += data
        if self._state == "head":
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > self.max_head:  # websockets refuses it with its own limits
                    self._state = "pass"
                    return self._take()
                return b""
            head, self._buf = self._buf[:end + 4], self._buf[end + 4:]
            check_head(head)  # ValueError: BodyConnection answers 400
            if not head.startswith(b"POST "):
                self._state = "pass"
                return head + self._take()
            return self._post_head(head)
        return self._body()

    def _take(self) -> bytes:
        out, self._buf = self._buf, b""
        return out

    def _post_head(self, head: bytes) -> bytes:
        lines = head[:-4].split(b"\r\n")
        kept, lengths, chunked = [lines[0]], [], False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            key = name.strip().lower()
            if key == b"content-length":
                lengths.append(value.strip())
            elif key == b"transfer-encoding":
                chunked = True
            else:
                kept.append(line)
        self._head = b"\r\n".join(kept) + b"\r\n\r\n"
        if chunked:
            return self._refuse(HTTPStatus.LENGTH_REQUIRED, "send the body with a Content-Length, not chunked\n")
        # digits only, and few of them: int() of thousands of digits raises (and would take time)
        if len(set(lengths)) > 1 or (lengths and not (lengths[0].isdigit() and len(lengths[0]) <= 15)):
            return self._refuse(HTTPStatus.BAD_REQUEST, "a bad Content-Length header\n")
        self._length = int(lengths[0]) if lengths else 0
        if self._length > self.max_body:
            return self._refuse(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                                f"a body of {self._length} bytes is over the limit of {self.max_body}\n")
        self._state = "body"
        return self._body()

    def _body(self) -> bytes:
        if len(self._buf) < self._length:
            return b""
        self.body, self._buf = self._buf[:self._length], b""
        self._state = "discard"  # no pipelining: the response closes the connection
        return self._head

    def _refuse(self, status: HTTPStatus, reason: str) -> bytes:
        self.body_error = (status, reason)
        self._state, self._buf = "discard", b""
        return self._head


class BodyConnection(ServerLink):
    """websockets' server connection with a `BodySplitter` in front of its request parser."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.splitter = BodySplitter()

    def data_received(self, data: bytes) -> None:
        try:
            out = self.splitter.feed(data)
        except Exception as exc:  # noqa: BLE001 - a request it cannot read: one log line, then 400
            log.warning("unreadable request from %s: %s", self.remote_address, str(exc)[:200] or type(exc).__name__)
            self.transport.write(BAD_REQUEST)
            self.transport.close()
            return
        if out:
            super().data_received(out)
