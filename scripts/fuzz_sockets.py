#!/usr/bin/env python
"""Fuzz a running `duplex serve` over real sockets: random and mutated messages against every
WebSocket route (/ws, /twilio, /telnyx, /plivo, /exotel, /vonage), the AudioSocket port, the
WebRTC offer (POST) and config (GET) and the WebRTC data channel (aiortc peers on loopback),
while normal browser conversations run alongside and afterwards; and peers that hold on: pages
that say hello and then nothing (the server's idle timeout must end them), upgrades sent a byte
a second (its open timeout must drop them), and the cap + 4 pages at once (the rest get 503).

    python scripts/fuzz_sockets.py --host 127.0.0.1 --port 8080 --audiosocket-port 9092 --messages 10000 \
        --token T [--twilio-auth-token T --plivo-auth-token T --vonage-signature-secret S]
    python scripts/fuzz_sockets.py --self-serve --messages 10000   # a server with test doubles, in a child

The server's guards are on: the self-served one has the token and every carrier's secret, and
the fuzzer presents them (a fresh Plivo nonce and Vonage JWT per connection), so its messages
reach the sessions; `--no-guards` serves without them.

Each route gets `--messages` messages, spread over connections of a few to a few hundred
messages each; a connection ends with a close handshake, a dropped TCP connection (no close), or
the protocol's own end (a phone `stop`, an AudioSocket hangup). A mix per message: valid messages
(from the protocol modules' formats), valid ones mutated (junk values and types, dropped keys,
huge numbers, NaN, deep nesting, unicode, bit flips, truncation, bad base64, wrong sample rates,
binary for text and text for binary), and random bytes or text; events come in any order.

Before a connection is closed cleanly it must still answer: a WebSocket ping (and on /ws a
`ping` message), or for AudioSocket a hangup frame answered by the server's hangup and EOF. A
send or an answer that waits longer than `--hang-timeout` counts as hung.

Exit status: 0 when every route answered throughout, no connection or request hung, every
normal conversation got a final transcript and reply audio, every idle page and slow upgrade was
ended by the server, no more pages than the cap opened, the server still answers /healthz and
every route afterwards, /readyz is 200 and duplex_sessions_active 0 (every slot free), and (with
--self-serve or --server-log) its log has no traceback; else 1.
Everything is bounded: messages per route, per-send and per-answer timeouts, `--max-seconds`.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import hashlib
import hmac
import json
import os
import random
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from transport.audio import INPUT_RATE, read_mono
from transport.telephony.media_streams import DIALECTS, Dialect

WS_ROUTES = ["/ws", "/twilio", "/telnyx", "/plivo", "/exotel", "/vonage"]
AUDIOSOCKET = "audiosocket"
ALL_ROUTES = WS_ROUTES + [AUDIOSOCKET]
# lines in a server log that mean an exception escaped where it should not have
CRASH_PATTERNS = ("Traceback (most recent call last)", "session failed", "Task exception was never retrieved",
                  "Exception in callback", "connection handler failed", "Unhandled exception")


# ---- the report ---------------------------------------------------------------------------------
@dataclass
class RouteStats:
    route: str
    sent: int = 0
    connections: int = 0
    kinds: Counter = field(default_factory=Counter)  # what we sent: valid, mutated, random, ...
    endings: Counter = field(default_factory=Counter)  # how our connections ended, from our side
    server_closes: Counter = field(default_factory=Counter)  # closes the server made: "1000", "1009", "eof"
    refused: Counter = field(default_factory=Counter)  # upgrades refused, by HTTP status
    errors: Counter = field(default_factory=Counter)  # /ws error events, by code
    answers: Counter = field(default_factory=Counter)  # what the server sent: text types, audio
    liveness_ok: int = 0
    hung: list[str] = field(default_factory=list)
    connect_failures: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        return {"route": self.route, "sent": self.sent, "connections": self.connections,
                "kinds": dict(self.kinds), "endings": dict(self.endings),
                "server_closes": dict(self.server_closes), "refused": dict(self.refused),
                "errors": dict(self.errors.most_common(12)), "answers": dict(self.answers.most_common(12)),
                "liveness_ok": self.liveness_ok, "hung": self.hung[:10], "hung_count": len(self.hung),
                "connect_failures": self.connect_failures[:5]}


@dataclass
class Conversation:
    when: str  # "during" or "after"
    ok: bool
    seconds: float
    why: str = ""
    final: str = ""
    audio_frames: int = 0


@dataclass
class Report:
    routes: dict[str, RouteStats]
    conversations: list[Conversation] = field(default_factory=list)
    healthz_after: bool = False
    routes_after: dict[str, str] = field(default_factory=dict)  # route -> "ok" or why not
    deadline_hit: bool = False
    seconds: float = 0.0
    server_log_crashes: list[str] = field(default_factory=list)
    server_exit: int | None = None  # a self-served server that exited
    holders: Holders | None = None  # idle, slow and over-the-cap peers, when they ran
    readyz_after: int | None = None  # /readyz's status once everything had ended
    sessions_after: float | None = None  # duplex_sessions_active then

    @property
    def failures(self) -> list[str]:
        out = []
        for r in self.routes.values():
            if r.hung:
                out.append(f"{r.route}: {len(r.hung)} connection(s) hung, first: {r.hung[0]}")
            if r.connect_failures:
                out.append(f"{r.route}: {len(r.connect_failures)} connection(s) failed to open, first: "
                           f"{r.connect_failures[0]}")
        for c in self.conversations:
            if not c.ok:
                out.append(f"normal conversation ({c.when}) failed: {c.why}")
        if not any(c.when == "during" for c in self.conversations):
            out.append("no normal conversation ran alongside the fuzzing")
        if not any(c.when == "after" for c in self.conversations):
            out.append("no normal conversation ran after the fuzzing")
        if not self.healthz_after:
            out.append("/healthz did not answer 200 after the fuzzing")
        out += [f"{route} after the fuzzing: {why}" for route, why in self.routes_after.items() if why != "ok"]
        if self.holders is not None:
            h = self.holders
            out += h.problems
            if h.idle_ended_by_server < h.idle_sent:
                out.append(f"idle pages: {h.idle_sent - h.idle_ended_by_server} of {h.idle_sent} not ended by the server")
            if h.slow_closed_by_server < h.slow_sent:
                out.append(f"slow upgrades: {h.slow_sent - h.slow_closed_by_server} of {h.slow_sent} not dropped")
        if self.readyz_after not in (None, 200):
            out.append(f"/readyz answered {self.readyz_after} after the fuzzing (a slot still taken?)")
        if self.sessions_after not in (None, 0):
            out.append(f"duplex_sessions_active was {self.sessions_after} after the fuzzing")
        if self.deadline_hit:
            out.append("--max-seconds ran out before every message was sent")
        out += [f"server log: {line}" for line in self.server_log_crashes[:5]]
        if self.server_exit is not None:
            out.append(f"the server exited with {self.server_exit}")
        return out

    def to_dict(self) -> dict:
        return {"seconds": round(self.seconds, 1), "routes": [r.summary() for r in self.routes.values()],
                "conversations": [c.__dict__ for c in self.conversations], "healthz_after": self.healthz_after,
                "routes_after": self.routes_after, "server_log_crashes": self.server_log_crashes[:20],
                "holders": self.holders.summary() if self.holders else None, "readyz_after": self.readyz_after,
                "sessions_after": self.sessions_after, "failures": self.failures}

    def table(self) -> str:
        rows = [f"{'route':<12} {'sent':>6} {'conns':>5} {'live':>5} {'hung':>4}  server answered"]
        for r in self.routes.values():
            answered = []
            if r.errors:
                answered.append(f"{sum(r.errors.values())} error events "
                                f"({', '.join(f'{k} {v}' for k, v in r.errors.most_common(5))})")
            other = {k: v for k, v in r.answers.items() if k != "error"}
            if other:
                answered.append(", ".join(f"{k} {v}" for k, v in Counter(other).most_common(6)))
            if r.server_closes:
                answered.append("server closed: " + ", ".join(f"{k} x{v}" for k, v in r.server_closes.most_common()))
            if r.refused:
                answered.append("refused: " + ", ".join(f"HTTP {k} x{v}" for k, v in r.refused.items()))
            rows.append(f"{r.route:<12} {r.sent:>6} {r.connections:>5} {r.liveness_ok:>5} {len(r.hung):>4}  "
                        f"{'; '.join(answered) or 'nothing'}")
            rows.append(f"{'':<12} sent: {dict(r.kinds)}; our endings: {dict(r.endings)}")
        for c in self.conversations:
            rows.append(f"conversation {c.when:<6} {'ok  ' if c.ok else 'FAIL'} {c.seconds:5.1f} s  "
                        f"final={c.final!r} audio_frames={c.audio_frames} {c.why}")
        rows.append(f"/healthz after: {'200' if self.healthz_after else 'FAILED'}; routes after: {self.routes_after}")
        if self.holders is not None:
            rows.append(f"holders: {self.holders.summary()}")
        rows.append(f"/readyz after: {self.readyz_after}; duplex_sessions_active after: {self.sessions_after}")
        if self.server_log_crashes:
            rows.append(f"server log: {len(self.server_log_crashes)} crash line(s), first: {self.server_log_crashes[0]}")
        return "\n".join(rows)


# ---- junk -----------------------------------------------------------------------------------------
BIG = "\x00BIG\x00"  # replaced in the JSON text by a raw number too long for a Python int conversion
UNICODE = ["", " ", "☃", "\u202etxet", "𝄞" * 3, "\u0000", "日本語", "\ufeff", "e\u0301", "\U0010ffff",
           "\\", "\"", "null", "NaN", "-1", "8000", "16000Hz", "audio/x-mulaw", "s1", "e1"]


def junk_value(rng: random.Random, depth: int = 0):
    r = rng.random()
    if r < 0.10:
        return None
    if r < 0.16:
        return rng.choice([True, False])
    if r < 0.30:
        return rng.choice([0, -1, 1, 7, 8000, 16000, 44100, 2**31, 2**63, -2**63, 10**30, 255, 65536, 192000])
    if r < 0.38:
        return rng.choice([0.5, -0.0, 1e308, -1e308, 1e-320, float("nan"), float("inf"), float("-inf"), 8000.0])
    if r < 0.42:
        return BIG
    if r < 0.62:
        s = rng.choice(UNICODE)
        if rng.random() < 0.2:
            s = s * rng.randint(1, 300) if s else "A" * rng.randint(1, 5000)
        return s
    if r < 0.70:
        return "".join(chr(rng.choice([rng.randint(0x20, 0x7e), rng.randint(0xa0, 0xd7ff),
                                       rng.randint(0xe000, 0x10ffff)])) for _ in range(rng.randint(1, 40)))
    if depth > 3:
        return rng.randint(-5, 5)
    if r < 0.85:
        return [junk_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(["event", "type", "media", "start", "payload", "x", "☃", ""]): junk_value(rng, depth + 1)
            for _ in range(rng.randint(0, 4))}


DEEP = "\x00DEEP\x00"  # replaced by a deeply nested array


def dumps(obj, depth: int = 1000) -> str:
    """JSON as Python writes it (NaN and Infinity bare), with BIG and DEEP put in as raw text."""
    text = json.dumps(obj, ensure_ascii=len(repr(obj)) % 2 == 0)
    text = text.replace(json.dumps(BIG), "9" * (4301, 5000, 20000)[len(text) % 3])
    return text.replace(json.dumps(DEEP), "[" * depth + "1" + "]" * depth)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


def _set(obj, path, value):
    for p in path[:-1]:
        obj = obj[p]
    obj[path[-1]] = value


def _delete(obj, path):
    for p in path[:-1]:
        obj = obj[p]
    del obj[path[-1]]


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.random()
        if op < 0.35 and b:
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif op < 0.55 and b:
            del b[rng.randrange(len(b)):]
        elif op < 0.75:
            i = rng.randint(0, len(b))
            b[i:i] = rng.randbytes(rng.randint(1, 16))
        elif op < 0.9 and b:
            i = rng.randrange(len(b))
            j = rng.randint(i, min(len(b), i + 64))
            b[i:i] = b[i:j] * rng.randint(1, 8)
        elif b:
            i = rng.randrange(len(b))
            del b[i:i + rng.randint(1, 16)]
    return bytes(b)


def mutate_json(rng: random.Random, obj: dict, keys: tuple[str, ...]) -> tuple[str, str | bytes]:
    """One mutated form of a valid JSON message: (what was done, the message)."""
    op = rng.random()
    obj = json.loads(json.dumps(obj))  # a copy
    if op < 0.30:
        paths = [p for p in _paths(obj) if p]
        if paths:
            _set(obj, rng.choice(paths), junk_value(rng))
        return "junk_value", dumps(obj)
    if op < 0.40:
        paths = [p for p in _paths(obj) if p]
        if paths:
            _delete(obj, rng.choice(paths))
        return "dropped_key", dumps(obj)
    if op < 0.48:
        key = "type" if "type" in obj else "event"
        obj[key] = rng.choice([*keys, *(k.upper() for k in keys), "", "x" * 100, None, 5, ["start"], {"a": 1}])
        return "wrong_event", dumps(obj)
    if op < 0.53:
        for _ in range(rng.randint(1, 50)):
            obj[rng.choice(UNICODE) + str(rng.randint(0, 999))] = junk_value(rng)
        return "extra_keys", dumps(obj)
    if op < 0.58:
        paths = [p for p in _paths(obj) if p]
        if paths:
            _set(obj, rng.choice(paths), DEEP)
        return "deep_nesting", dumps(obj, rng.choice([10, 100, 1000, 5000, 30000]))
    if op < 0.62:
        return "not_an_object", rng.choice([dumps([obj]), dumps(list(obj.values())), "null", "1", "\"hello\"",
                                            dumps(obj)[:-1] + "," + dumps(obj)[1:]])
    if op < 0.80:
        data = mutate_bytes(rng, dumps(obj).encode())
        return "bit_flipped", data.decode("utf-8", errors=rng.choice(["replace", "ignore"]))
    if op < 0.90:
        text = dumps(obj)
        return "truncated", text[:rng.randrange(max(1, len(text)))]
    return "as_binary", dumps(obj).encode()


def random_message(rng: random.Random) -> tuple[str, str | bytes]:
    r = rng.random()
    if r < 0.40:
        return "random_bytes", rng.randbytes(rng.choice([0, 1, 2, 3, 17, 160, 320, 640, 641, 1000, 4096]))
    if r < 0.45:
        return "random_bytes", rng.randbytes(rng.choice([47999, 48000, 48001, 100_000]))
    if r < 0.75:
        return "random_text", "".join(chr(rng.choice([rng.randint(0, 0x7f), rng.randint(0x80, 0xd7ff)]))
                                      for _ in range(rng.randint(0, 300)))
    if r < 0.95:
        return "random_json", dumps(junk_value(rng))
    return "random_text", rng.choice(["{", "}", "[]", "{}", "{\"type\":", "\"", "NaN", "-Infinity", "1e999",
                                      "{\"event\":\"media\"}", "{\"type\":\"hello\"}", " " * 5000])


def pcm_bytes(rng: random.Random, n_samples: int, loud: bool | None = None) -> bytes:
    loud = rng.random() < 0.5 if loud is None else loud
    level = rng.choice([0.05, 0.2, 0.9]) if loud else 0.0
    x = np.random.default_rng(rng.getrandbits(32)).standard_normal(n_samples) * level
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


def bad_base64(rng: random.Random, good: str) -> str:
    return rng.choice([good[:-1], good + "=", good.replace("A", "-").replace("/", "_"), "@@@", " " + good,
                       good[: len(good) // 2] + "\n" + good[len(good) // 2:], "====", "A", "AB=",
                       base64.b64encode(b"\x00" * 3).decode() * 20000, "é" + good])


# ---- message sources, one per route ---------------------------------------------------------------
class Source:
    """Messages for one route: a prelude (what a real peer sends first) and then a random mix."""

    keys: tuple[str, ...] = ()  # the route's event names, for mutations that swap them

    def __init__(self, rng: random.Random):
        self.rng = rng

    def prelude(self) -> list[str | bytes]:
        return []

    def valid(self) -> tuple[str, str | bytes | dict]:
        raise NotImplementedError

    def special(self) -> tuple[str, str | bytes] | None:
        return None

    def end(self) -> list[str | bytes] | None:
        """A message that ends the call, where the protocol has one."""
        return None

    def next(self) -> tuple[str, str | bytes]:
        rng, r = self.rng, self.rng.random()
        if r < 0.40:
            _, msg = self.valid()
            return "valid", dumps(msg) if isinstance(msg, dict) else msg
        if r < 0.75:
            _, msg = self.valid()
            if isinstance(msg, dict):
                _, out = mutate_json(rng, msg, self.keys)
            elif rng.random() < 0.5:
                out = msg.decode("latin-1")  # audio as a text frame
            else:
                out = mutate_bytes(rng, msg)
            return "mutated", out
        if r < 0.85 and (s := self.special()) is not None:
            return s
        if r < 0.855:
            return "oversize", rng.choice([b"\x00" * (64 * 1024 + 1), b"\x00" * (1 << 20) + b"\x00",
                                           "x" * ((1 << 20) + 1)])  # over the server's max_size (64 KiB)
        return random_message(rng)


class PageSource(Source):
    keys = ("hello", "played", "ping", "metrics")

    def __init__(self, rng):
        super().__init__(rng)
        self.rate = INPUT_RATE

    def prelude(self):
        self.rate = self.rng.choice([16000, 16000, 8000, 48000])
        return [json.dumps({"type": "hello", "sample_rate": self.rate})]

    def valid(self):
        rng, r = self.rng, self.rng.random()
        if r < 0.55:
            return "audio", pcm_bytes(rng, self.rate // 50)
        if r < 0.65:
            self.rate = rng.choice([8000, 11025, 16000, 22050, 24000, 44100, 48000])
            return "hello", {"type": "hello", "sample_rate": self.rate}
        if r < 0.75:
            return "ping", {"type": "ping", "t": rng.random() * 1e6}
        if r < 0.90:
            return "played", {"type": "played", "id": rng.randint(0, 50), "event": rng.choice(["start", "end"]),
                              "t": rng.random() * 1e6, "server_ms": rng.random() * 1e6}
        return "metrics", {"type": "metrics", "turn": rng.randint(0, 5), "mouth_to_ear_ms": rng.random() * 900}

    def special(self):
        rng = self.rng
        return rng.choice([
            ("wrong_rate", json.dumps({"type": "hello", "sample_rate": rng.choice(
                [0, -16000, 7999, 48001, 192000, 16000.5, "16000", None, True, 10**20])})),
            ("odd_audio", pcm_bytes(rng, 160)[:-1]),
            ("empty_audio", b""),
            ("big_audio", pcm_bytes(rng, rng.choice([24000, 24001]))),
            ("audio_burst", pcm_bytes(rng, self.rate // 50, loud=True)),
        ])


class MediaStreamSource(Source):
    """Twilio, Telnyx, Plivo and Exotel: JSON text only, audio base64 in `media`."""

    def __init__(self, rng, dialect: Dialect):
        super().__init__(rng)
        self.d = dialect
        self.keys = ("connected", "start", "media", "dtmf", "stop", *dialect.mark_echoes, *dialect.ignored,
                     "mark", "checkpoint", "playAudio", "clear")
        self.sid = "MZ" + uuid.uuid4().hex
        self.encoding, self.rate = dialect.default_encoding, dialect.rates[0]
        self.chunk = 0

    def start_message(self, encoding=None, rate=None) -> dict:
        d, rng = self.d, self.rng
        self.encoding = encoding or rng.choice(sorted(d.encodings))
        self.rate = rate or rng.choice(d.rates)
        fmt = {"encoding": self.encoding, d.rate: str(self.rate) if d.name == "exotel" and rng.random() < 0.5
               else self.rate, "channels": 1}
        params = "k1=v1;k2=v2" if d.name == "plivo" else {"caller": "+15551234567", "lang": "en"}
        return {"event": "start", d.stream_id: self.sid,
                "start": {d.stream_id: self.sid, d.call_id: "CA" + uuid.uuid4().hex, "accountSid": "AC1",
                          "tracks": ["inbound"], d.params: params, d.format: fmt}}

    def payload(self, loud: bool | None = None) -> bytes:
        codec = self.d.encodings.get(self.encoding.lower())
        pcm = np.frombuffer(pcm_bytes(self.rng, self.rate // 50, loud), "<i2")
        if codec is None:
            return pcm.tobytes()
        return codec.encode(pcm)

    def prelude(self):
        self.sid = "MZ" + uuid.uuid4().hex
        out = [] if self.d.name == "plivo" else [json.dumps({"event": "connected", "protocol": "Call",
                                                             "version": "1.0.0"})]
        return out + [json.dumps(self.start_message())]

    def media(self, payload: str) -> dict:
        self.chunk += 1
        return {"event": "media", self.d.stream_id: self.sid,
                "media": {"track": self.rng.choice(["inbound", "inbound", "inbound_track", "outbound"]),
                          "chunk": str(self.chunk), "timestamp": str(self.chunk * 20), "payload": payload}}

    def valid(self):
        rng, d, r = self.rng, self.d, self.rng.random()
        if r < 0.60:
            return "media", self.media(base64.b64encode(self.payload()).decode())
        if r < 0.72:
            name = f"{rng.choice('se')}{rng.randint(0, 40)}"
            body = {"name": name} if d.flat_marks else {"mark": {"name": name}}
            return "mark", {"event": rng.choice(d.mark_echoes), d.stream_id: self.sid, **body}
        if r < 0.82:
            return "dtmf", {"event": "dtmf", d.stream_id: self.sid,
                            "dtmf": {"track": "inbound_track", "digit": rng.choice("0123456789*#ABCD")}}
        if r < 0.90:
            return "start", self.start_message()
        if r < 0.95:
            return "connected", {"event": "connected", "protocol": "Call", "version": "1.0.0"}
        if d.ignored:
            return "ignored", {"event": rng.choice(sorted(d.ignored)), d.stream_id: self.sid}
        return "media", self.media(base64.b64encode(self.payload(loud=True)).decode())

    def special(self):
        rng = self.rng
        good = base64.b64encode(self.payload()).decode()
        return rng.choice([
            ("bad_base64", json.dumps(self.media(bad_base64(rng, good)))),
            ("wrong_rate", json.dumps(self.start_message(rate=rng.choice([0, 1, 7999, 8001, 11025, 16000, 24000,
                                                                            48000, 192000, 999999])))),
            ("wrong_encoding", json.dumps(self.start_message(encoding=rng.choice(
                ["audio/x-mulaw", "audio/x-alaw", "PCMU", "pcma", "audio/x-l16", "audio/x-raw", "opus", "", "☃"])))),
            ("odd_payload", json.dumps(self.media(base64.b64encode(self.payload()[:-1]).decode()))),
            ("empty_payload", json.dumps(self.media(""))),
            ("huge_payload", json.dumps(self.media(base64.b64encode(rng.randbytes(rng.choice(
                [47999, 48000, 48001, 60000]))).decode()))),
            ("binary_frame", self.payload()),
            ("media_no_start", json.dumps(self.media(good))),
        ])

    def end(self):
        if d := ("stop" if self.d.name != "plivo" else None):
            return [json.dumps({"event": d, self.d.stream_id: self.sid, "stop": {self.d.call_id: "CA1"}})]
        return None


class VonageSource(Source):
    keys = ("websocket:connected", "websocket:dtmf", "websocket:notify", "websocket:cleared")

    def __init__(self, rng):
        super().__init__(rng)
        self.rate = INPUT_RATE

    def connected(self, rate=None) -> dict:
        self.rate = rate or self.rng.choice([8000, 16000, 24000])
        return {"event": "websocket:connected", "content-type": f"audio/l16;rate={self.rate}",
                "uuid": str(uuid.uuid4()), "caller": "+15551234567", "n": 5}

    def prelude(self):
        return [json.dumps(self.connected())]

    def valid(self):
        rng, r = self.rng, self.rng.random()
        if r < 0.60:
            return "audio", pcm_bytes(rng, self.rate // 50)
        if r < 0.72:
            return "notify", {"event": "websocket:notify", "payload": {"mark": f"{rng.choice('se')}{rng.randint(0, 40)}"}}
        if r < 0.82:
            return "dtmf", {"event": "websocket:dtmf", "digit": rng.choice("0123456789*#"), "duration": 260}
        if r < 0.90:
            return "connected", self.connected()
        return "cleared", {"event": "websocket:cleared"}

    def special(self):
        rng = self.rng
        return rng.choice([
            ("wrong_rate", json.dumps({**self.connected(), "content-type": rng.choice(
                ["audio/l16;rate=44100", "audio/l16;rate=0", "audio/l16", "audio/pcmu;rate=8000", "", None, 16000,
                 "audio/l16;rate=99999999999999", "AUDIO/L16 ; RATE = 16000"])})),
            ("odd_audio", pcm_bytes(rng, 160)[:-1]),
            ("empty_audio", b""),
            ("big_audio", pcm_bytes(rng, rng.choice([24000, 24001]))),
            ("nested_dtmf", json.dumps({"event": "websocket:dtmf", "dtmf": rng.choice(
                [{"digit": "5"}, {"digit": 5}, "5", None, {"digit": ["5"]}])})),
        ])


# AudioSocket frames (docs.asterisk.org): kind byte, 2-byte big-endian length, payload
AS_HANGUP, AS_UUID, AS_DTMF, AS_ERROR = 0x00, 0x01, 0x03, 0xFF
AS_AUDIO = {0x10: 8000, 0x11: 12000, 0x12: 16000, 0x13: 24000, 0x14: 32000, 0x15: 44100, 0x16: 48000,
            0x17: 96000, 0x18: 192000}


def as_frame(kind: int, payload: bytes = b"") -> bytes:
    return struct.pack(">BH", kind, len(payload)) + payload


class AudioSocketSource:
    """Writes to an AudioSocket TCP connection: (what, bytes), each one message."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.kind = 0x10

    def prelude(self) -> list[bytes]:
        return [as_frame(AS_UUID, uuid.uuid4().bytes)]

    def audio(self, loud=None) -> bytes:
        return as_frame(self.kind, pcm_bytes(self.rng, AS_AUDIO[self.kind] // 50, loud))

    def next(self) -> tuple[str, bytes]:
        rng, r = self.rng, self.rng.random()
        if r < 0.40:
            if rng.random() < 0.05:
                self.kind = rng.choice(list(AS_AUDIO))
            if rng.random() < 0.9:
                return "valid", self.audio()
            return "valid", rng.choice([as_frame(AS_DTMF, rng.choice(b"0123456789*#").to_bytes(1, "big")),
                                        as_frame(AS_UUID, uuid.uuid4().bytes), as_frame(AS_ERROR, b"\x02"),
                                        as_frame(AS_ERROR)])
        if r < 0.70:
            return "mutated", mutate_bytes(rng, self.audio() if rng.random() < 0.7 else as_frame(AS_UUID, uuid.uuid4().bytes))
        if r < 0.90:
            return rng.choice([
                ("wrong_kind", as_frame(rng.choice([0x02, 0x04, 0x0f, 0x19, 0x20, 0x42, 0x80, 0xfe]), rng.randbytes(rng.randint(0, 400)))),
                ("length_lies", struct.pack(">BH", rng.choice([0x10, 0x12, AS_UUID, AS_DTMF]), rng.randint(0, 0xFFFF))
                 + rng.randbytes(rng.randint(0, 700))),
                ("huge_length", struct.pack(">BH", 0x10, 0xFFFF) + pcm_bytes(rng, rng.randint(0, 20000))),
                ("max_frame", as_frame(rng.choice(list(AS_AUDIO)), pcm_bytes(rng, 0xFFFF // 2))),
                ("odd_audio", as_frame(0x10, rng.randbytes(321))),
                ("empty_audio", as_frame(rng.choice(list(AS_AUDIO)))),
                ("bad_uuid", as_frame(AS_UUID, rng.randbytes(rng.choice([0, 15, 17, 36])))),
                ("bad_dtmf", as_frame(AS_DTMF, rng.choice([b"", b"55", b"x", b"\xff", b"\x00"]))),
                ("partial_header", bytes([rng.choice([0x10, 0x01])]) if rng.random() < 0.5 else b"\x10\x01"),
                ("burst", b"".join(self.audio(loud=True) for _ in range(rng.randint(2, 50)))),
            ])
        return "random_bytes", rng.randbytes(rng.choice([1, 2, 3, 16, 100, 1000, 4096, 20000]))


class FrameMirror:
    """What the server's frame parser holds after the bytes we sent (to end a call cleanly)."""

    def __init__(self):
        self.buf = bytearray()

    def feed(self, data: bytes) -> list[int]:
        self.buf += data
        kinds = []
        while len(self.buf) >= 3:
            kind, n = struct.unpack_from(">BH", self.buf)
            if len(self.buf) - 3 < n:
                break
            kinds.append(kind)
            del self.buf[:3 + n]
        return kinds

    def filler(self) -> bytes:
        """Bytes that finish the frame in progress (harmless: an AUDIO-less, zero-length frame or
        zeros as its payload), so the next frame we send is read as a frame."""
        if not self.buf:
            return b""
        if len(self.buf) < 3:
            return b"\x00" * (3 - len(self.buf))  # a zero length: the frame ends with its header
        _, n = struct.unpack_from(">BH", self.buf)
        return b"\x00" * (n - (len(self.buf) - 3))


# ---- connections ----------------------------------------------------------------------------------
@dataclass
class Secrets:
    """What the server checks on each upgrade (its guards); the fuzzer presents them, so that its
    messages reach the sessions. The self-served server is given these."""

    token: str | None = None
    twilio: str | None = None
    plivo: str | None = None
    vonage: str | None = None


GUARDED = Secrets(token="fuzz-token-0123456789", twilio="fuzz-twilio-auth-token-0123456789",
                  plivo="fuzz-plivo-auth-token", vonage="fuzz-vonage-signature-secret-0123456789")


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def vonage_jwt(secret: str) -> str:
    """A Vonage-style HS256 JWT, fresh (its own jti, issued now)."""
    head = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    claims = _b64url(json.dumps({"iat": int(time.time()), "jti": str(uuid.uuid4()), "iss": "Vonage"}).encode())
    sig = hmac.new(secret.encode(), f"{head}.{claims}".encode(), hashlib.sha256).digest()
    return f"{head}.{claims}.{_b64url(sig)}"


@dataclass
class Target:
    host: str
    port: int
    audiosocket_port: int | None
    token: str | None = None
    secrets: Secrets = field(default_factory=Secrets)
    max_sessions: int = 16  # the server's cap, for the over-the-cap peers

    def __post_init__(self):
        if self.token and not self.secrets.token:
            self.secrets = dataclasses.replace(self.secrets, token=self.token)

    @property
    def base(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _signed_by_carrier(self, path: str) -> str | None:
        return {"/twilio": self.secrets.twilio, "/plivo": self.secrets.plivo, "/vonage": self.secrets.vonage}.get(path)

    def url(self, path: str) -> str:
        token = self.secrets.token
        q = f"?token={token}" if token and not self._signed_by_carrier(path) else ""
        return f"ws://{self.host}:{self.port}{path}{q}"

    def headers(self, path: str) -> dict[str, str]:
        """The carrier's signature on this upgrade (fresh: a nonce or JWT of its own), if it signs."""
        from transport.telephony.signatures import plivo_signature, twilio_signature

        secret = self._signed_by_carrier(path)
        if secret is None:
            return {}
        signed = f"wss://{self.host}:{self.port}{path}"  # what a carrier signs: the wss:// URL + Host
        if path == "/twilio":
            return {"X-Twilio-Signature": twilio_signature(secret, signed)}
        if path == "/plivo":
            nonce = uuid.uuid4().hex
            return {"X-Plivo-Signature-V3": plivo_signature(secret, signed, nonce), "X-Plivo-Signature-V3-Nonce": nonce}
        return {"Authorization": f"Bearer {vonage_jwt(secret)}"}


def source_for(route: str, rng: random.Random):
    if route == "/ws":
        return PageSource(rng)
    if route == "/vonage":
        return VonageSource(rng)
    if route == AUDIOSOCKET:
        return AudioSocketSource(rng)
    return MediaStreamSource(rng, DIALECTS[route.strip("/")])


async def _open_ws(target: Target, route: str, stats: RouteStats, timeout: float):
    """A connection, retried a few times while the server refuses it as full (503: the sessions
    we just dropped are still being torn down); None if it never opened."""
    for attempt in range(20):
        try:
            return await asyncio.wait_for(connect(target.url(route), additional_headers=target.headers(route),
                                                  max_size=None, open_timeout=timeout, ping_interval=None,
                                                  close_timeout=5), timeout + 1)
        except InvalidStatus as e:
            stats.refused[e.response.status_code] += 1
            if e.response.status_code != 503:
                stats.connect_failures.append(f"HTTP {e.response.status_code}")
                return None
            await asyncio.sleep(0.2 * (attempt + 1))
        except Exception as e:
            stats.connect_failures.append(f"{type(e).__name__}: {e}")
            return None
    stats.connect_failures.append("refused as full (503) 20 times")
    return None


async def _drain_ws(ws, stats: RouteStats, counts: Counter) -> None:
    """Read what the server sends (so that it is never blocked on us), counting it."""
    with contextlib.suppress(ConnectionClosed):
        async for msg in ws:
            if isinstance(msg, bytes):
                stats.answers["audio"] += 1
                continue
            try:
                ev = json.loads(msg)
                kind = ev.get("type") or ev.get("event") or ev.get("action") or "?"
            except (ValueError, AttributeError):
                kind = "unparsable"
                ev = {}
            stats.answers[str(kind)] += 1
            counts[str(kind)] += 1
            if kind == "error":
                stats.errors[str(ev.get("code"))] += 1


async def ws_connection(target: Target, route: str, src: Source, budget: int, stats: RouteStats,
                        hang_s: float) -> int:
    """One fuzzing connection of up to `budget` messages; how many were sent."""
    rng = src.rng
    ws = await _open_ws(target, route, stats, hang_s)
    if ws is None:
        return 0
    stats.connections += 1
    counts: Counter = Counter()
    reader = asyncio.create_task(_drain_ws(ws, stats, counts))
    sent, ending = 0, rng.choices(["close", "abort", "end"], [55, 30, 15])[0]
    try:
        messages = [("valid", m) for m in src.prelude()] if rng.random() < 0.8 else []
        while sent < budget:
            kind, msg = messages.pop(0) if messages else src.next()
            try:
                await asyncio.wait_for(ws.send(msg), hang_s)
            except ConnectionClosed:
                stats.server_closes[str(ws.close_code)] += 1
                stats.endings["closed_by_server"] += 1
                return sent
            except TimeoutError:
                stats.hung.append(f"{route}: a send waited over {hang_s:.0f} s after {sent} messages")
                ws.transport.abort()
                return sent
            sent += 1
            stats.sent += 1
            stats.kinds[kind] += 1
            if sent % 64 == 0:
                await asyncio.sleep(0)  # let the reader and the other routes run
        if ending == "abort":
            stats.endings["dropped_tcp"] += 1
            ws.transport.abort()
            return sent
        if ending == "end" and (end := src.end()) is not None:
            stats.endings["stop_event"] += 1
            with contextlib.suppress(ConnectionClosed):
                for m in end:
                    await ws.send(m)
            try:  # the server ends the call: its close comes back
                await asyncio.wait_for(ws.wait_closed(), hang_s)
                stats.server_closes[str(ws.close_code)] += 1
            except TimeoutError:
                stats.hung.append(f"{route}: the call was not ended within {hang_s:.0f} s of 'stop'")
                ws.transport.abort()
            return sent
        stats.endings["close"] += 1
        if await _alive(ws, route, counts, hang_s):
            stats.liveness_ok += 1
        elif ws.close_code is not None:
            stats.server_closes[str(ws.close_code)] += 1
        else:
            stats.hung.append(f"{route}: no answer to a ping within {hang_s:.0f} s after {sent} messages")
            ws.transport.abort()
            return sent
        try:
            await asyncio.wait_for(ws.close(), hang_s)
        except TimeoutError:
            stats.hung.append(f"{route}: the close handshake took over {hang_s:.0f} s")
            ws.transport.abort()
        return sent
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader
        if ws.transport is not None and not ws.transport.is_closing() and ws.close_code is None:
            ws.transport.abort()


async def _alive(ws, route: str, counts: Counter, hang_s: float) -> bool:
    """The connection still answers: a WebSocket pong (the server reads our frames, so the
    session reads its messages), and on /ws a `pong` event (the session's transport answers)."""
    try:
        waiter = await asyncio.wait_for(ws.ping(), hang_s)
        await asyncio.wait_for(waiter, hang_s)
        if route != "/ws":
            return True
        before = counts["pong"]
        await asyncio.wait_for(ws.send(json.dumps({"type": "ping", "t": 1.0})), hang_s)
        deadline = time.monotonic() + hang_s
        while counts["pong"] == before and time.monotonic() < deadline and ws.close_code is None:
            await asyncio.sleep(0.02)
        return counts["pong"] > before
    except (TimeoutError, ConnectionClosed):
        return False


async def _drain_tcp(reader: asyncio.StreamReader, stats: RouteStats, hangups: list) -> None:
    mirror = FrameMirror()
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(65536):
            for kind in mirror.feed(data):
                stats.answers["audio" if kind in AS_AUDIO else f"kind_0x{kind:02x}"] += 1
                if kind == AS_HANGUP:
                    hangups.append(kind)


async def audiosocket_connection(target: Target, src: AudioSocketSource, budget: int, stats: RouteStats,
                                 hang_s: float) -> int:
    rng = src.rng
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(target.host, target.audiosocket_port), hang_s)
    except (TimeoutError, OSError) as e:
        stats.connect_failures.append(f"{type(e).__name__}: {e}")
        return 0
    stats.connections += 1
    hangups: list = []
    drain = asyncio.create_task(_drain_tcp(reader, stats, hangups))
    mirror, sent = FrameMirror(), 0
    ending = rng.choices(["hangup", "abort", "close_mid_frame"], [50, 30, 20])[0]
    try:
        messages = [("valid", m) for m in src.prelude()] if rng.random() < 0.85 else []
        while sent < budget:
            kind, data = messages.pop(0) if messages else src.next()
            try:
                if rng.random() < 0.2 and len(data) > 1:  # a frame split across writes
                    cut = rng.randrange(1, len(data))
                    writer.write(data[:cut])
                    await asyncio.wait_for(writer.drain(), hang_s)
                    writer.write(data[cut:])
                else:
                    writer.write(data)
                await asyncio.wait_for(writer.drain(), hang_s)
            except (ConnectionError, OSError):
                stats.endings["closed_by_server"] += 1
                stats.server_closes["hangup" if hangups else "eof"] += 1
                return sent
            except TimeoutError:
                stats.hung.append(f"audiosocket: a write waited over {hang_s:.0f} s after {sent} messages")
                writer.transport.abort()
                return sent
            sent += 1
            stats.sent += 1
            stats.kinds[kind] += 1
            mirror.feed(data)  # a hangup by chance in the junk ends the call: the reader sees the EOF
            if drain.done():  # the server closed the connection
                stats.endings["closed_by_server"] += 1
                stats.server_closes["hangup" if hangups else "eof"] += 1
                return sent
            if sent % 32 == 0:
                await asyncio.sleep(0)
        if ending == "abort":
            stats.endings["dropped_tcp"] += 1
            writer.transport.abort()
            return sent
        if ending == "close_mid_frame":
            stats.endings["closed_mid_frame"] += 1
            with contextlib.suppress(ConnectionError, OSError):
                writer.write(struct.pack(">BH", 0x10, 320) + b"\x00" * rng.randint(0, 100))
                writer.close()
            return sent
        stats.endings["hangup"] += 1
        try:  # finish whatever frame the server is in the middle of, then hang up
            writer.write(mirror.filler() + as_frame(AS_HANGUP))
            await asyncio.wait_for(writer.drain(), hang_s)
        except (ConnectionError, OSError):
            pass
        except TimeoutError:
            stats.hung.append("audiosocket: the hangup could not be written")
        try:
            await asyncio.wait_for(drain, hang_s)
            stats.server_closes["hangup" if hangups else "eof"] += 1
            stats.liveness_ok += 1
        except TimeoutError:
            stats.hung.append(f"audiosocket: no EOF within {hang_s:.0f} s of our hangup, after {sent} messages")
        return sent
    finally:
        drain.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await drain
        if not writer.is_closing():
            writer.transport.abort()


async def fuzz_route(target: Target, route: str, messages: int, seed: int, stats: RouteStats, hang_s: float,
                     deadline: float, max_conn: int = 400) -> bool:
    """Send `messages` to one route over many connections; False if the deadline came first."""
    rng = random.Random(f"{seed}:{route}")
    src = source_for(route, rng)
    failures = 0
    while stats.sent < messages:
        if time.monotonic() > deadline:
            return False
        budget = min(messages - stats.sent, rng.choice([5, 20, 50, 100, 200, 300, 400, max_conn]),
                     max(5, messages // 4))  # a small run is spread over connections too
        if route == AUDIOSOCKET:
            n = await audiosocket_connection(target, src, budget, stats, hang_s)
        else:
            n = await ws_connection(target, route, src, budget, stats, hang_s)
        if n == 0:
            failures += 1
            if failures >= 5:
                return True  # the route does not take connections: reported as connect failures
            await asyncio.sleep(0.5)
    return True


# ---- HTTP: the WebRTC offer (POST) and config (GET) --------------------------------------------------
OFFER, CONFIG = "/webrtc/offer", "/webrtc/config"
HTTP_ROUTES = [OFFER, CONFIG]
DATACHANNEL = "datachannel"
HTTP_WORKERS = 32  # requests in flight per HTTP route
SAMPLE_SDP = ("v=0\r\no=- 1 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\na=group:BUNDLE 0\r\n"
              "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\nc=IN IP4 0.0.0.0\r\na=mid:0\r\na=sendrecv\r\n"
              "a=rtpmap:111 opus/48000/2\r\na=ice-ufrag:abcd\r\na=ice-pwd:0123456789abcdef012345\r\n"
              "a=fingerprint:sha-256 " + ":".join(["AB"] * 32) + "\r\na=setup:actpass\r\n")


class HttpSource:
    """Whole HTTP requests for one of the WebRTC routes: well-formed ones with bad bodies and
    mutated offers, and malformed heads (lengths, methods, encodings, duplicated headers)."""

    def __init__(self, rng: random.Random, target: Target, path: str):
        self.rng, self.target, self.path = rng, target, path

    def _head(self, method: str, path: str, headers: list[tuple[str, str]]) -> bytes:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.target.host}:{self.target.port}"]
        lines += [f"{k}: {v}" for k, v in headers]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogatepass")

    def next(self) -> tuple[str, bytes]:
        rng, token = self.rng, self.target.secrets.token
        path = self.path + (f"?token={token}" if token and rng.random() < 0.85 else "")
        if self.path == CONFIG:
            r = rng.random()
            if r < 0.5:
                return "valid", self._head("GET", path, [])
            if r < 0.7:
                junk = "".join(rng.choice("abc=&%?/\x00\u2603") for _ in range(rng.randint(0, 60)))
                return "mutated", self._head("GET", f"{self.path}?{junk}", [])
            if r < 0.8:
                return "mutated", self._head(rng.choice(["POST", "PUT", "DELETE", "OPTIONS", "GETT"]), path,
                                             [("Content-Length", "0")])
            if r < 0.9:
                return "mutated", self._head("GET", path, [("Origin", rng.choice(
                    ["http://evil.example", "null", f"http://{self.target.host}:{self.target.port}"]))])
            return "random_bytes", rng.randbytes(rng.randint(1, 400))
        offer = {"sdp": SAMPLE_SDP, "type": "offer"}
        r = rng.random()
        if r < 0.3:
            kind, body = "valid", json.dumps(offer).encode()
        elif r < 0.6:
            _, text = mutate_json(rng, offer, ("offer", "answer", "pranswer"))
            kind, body = "mutated", text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
        elif r < 0.7:
            sdp = mutate_bytes(rng, SAMPLE_SDP.encode()).decode("latin-1")
            kind, body = "mutated", json.dumps({"sdp": sdp, "type": "offer"}).encode()
        else:
            kind, body = "random_bytes", rng.randbytes(rng.choice([0, 1, 100, 4096, 65536, 70000]))
        headers = [("Content-Type", rng.choice(["application/json"] * 6 + ["text/plain", "application/json; x=y", ""]))]
        q = rng.random()
        if q < 0.75:
            headers.append(("Content-Length", str(len(body))))
        elif q < 0.8:
            headers.append(("Content-Length", rng.choice(["9" * rng.randint(16, 5000), "-1", "12abc", "0x10", ""])))
        elif q < 0.85:
            headers += [("Content-Length", str(len(body))), ("Content-Length", str(len(body) + 1))]
        elif q < 0.9:
            headers.append(("Transfer-Encoding", "chunked"))
            body = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
        elif q < 0.95:
            headers.append(("Content-Length", str(len(body) + rng.randint(1, 50))))  # a body that never comes
        else:
            headers.append(("Origin", "http://evil.example"))
            headers.append(("Content-Length", str(len(body))))
        return kind, self._head("POST", path, headers) + body


async def http_exchange(target: Target, raw: bytes, hang_s: float) -> str:
    """Send one request on a connection of its own: the answer's status, or how it ended."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(target.host, target.port), hang_s)
    try:
        writer.write(raw)
        with contextlib.suppress(ConnectionError, OSError):
            await asyncio.wait_for(writer.drain(), hang_s)
        line = await asyncio.wait_for(reader.readline(), hang_s)
        if not line:
            return "eof"
        parts = line.split()
        status = parts[1].decode("ascii", "replace") if len(parts) > 1 else "garbled"
        with contextlib.suppress(ConnectionError, OSError, TimeoutError):  # the rest, bounded
            await asyncio.wait_for(reader.read(1 << 20), hang_s)
        return status
    except ConnectionError:
        return "reset"
    finally:
        writer.transport.abort()


async def fuzz_http(target: Target, path: str, messages: int, seed: int, stats: RouteStats, hang_s: float,
                    deadline: float) -> bool:
    """`messages` requests to `path`, HTTP_WORKERS at a time; a request left unanswered for
    `hang_s` is a hang ("a body that never comes" is answered when websockets' open_timeout ends
    it, 10 s)."""
    src = HttpSource(random.Random(f"{seed}:{path}"), target, path)

    async def one() -> None:
        kind, raw = src.next()
        stats.sent += 1
        stats.kinds[kind] += 1
        stats.connections += 1
        try:
            stats.answers[f"HTTP {await http_exchange(target, raw, hang_s)}"] += 1
        except TimeoutError:
            stats.hung.append(f"{path}: no answer within {hang_s:.0f} s to a {kind} request")
        except OSError as e:
            stats.connect_failures.append(f"{type(e).__name__}: {e}")

    async def worker() -> bool:  # a slow request holds up its own worker only
        while stats.sent < messages:
            if time.monotonic() > deadline:
                return False
            await one()
        return True

    return all(await asyncio.gather(*(worker() for _ in range(HTTP_WORKERS))))


# ---- the WebRTC data channel ----------------------------------------------------------------------
async def fuzz_datachannel(target: Target, messages: int, seed: int, stats: RouteStats, hang_s: float,
                           deadline: float) -> bool:
    """The page's messages, mutated and random, over the data channel of real aiortc peers (on
    loopback), a few hundred a connection; each connection must still answer a ping at its end."""
    from transport.webrtc.client import connect as webrtc_connect

    src = PageSource(random.Random(f"{seed}:{DATACHANNEL}"))
    failures = full = 0
    while stats.sent < messages:
        if time.monotonic() > deadline:
            return False
        budget = min(messages - stats.sent, src.rng.choice([50, 200, 500, 1000]), max(5, messages // 4))
        try:
            peer = await asyncio.wait_for(webrtc_connect(target.base, None, ice_hosts=("127.0.0.1",),
                                                         token=target.secrets.token), hang_s)
        except RuntimeError as e:
            if "offer refused: 503" in str(e) and full < 100:  # full for now (idle pages, the cap test)
                stats.refused[503] += 1
                full += 1
                await asyncio.sleep(0.25)
                continue
            stats.connect_failures.append(f"{type(e).__name__}: {str(e)[:200]}")
            failures += 1
            if failures >= 5:
                return True
            continue
        except (TimeoutError, OSError) as e:
            stats.connect_failures.append(f"{type(e).__name__}: {str(e)[:200]}")
            failures += 1
            if failures >= 5:
                return True
            await asyncio.sleep(1.0)
            continue
        stats.connections += 1
        try:
            opened = time.monotonic() + hang_s
            while peer.channel.readyState != "open" and time.monotonic() < opened:
                await asyncio.sleep(0.02)
            if peer.channel.readyState != "open":
                stats.hung.append("datachannel: the channel did not open")
                continue
            ended = False
            for _ in range(budget):
                kind, msg = src.next()
                if len(msg) > 60000:
                    msg = msg[:60000]  # SCTP's message size: what a page can send
                drained = time.monotonic() + hang_s
                while peer.channel.bufferedAmount > 256 * 1024 and time.monotonic() < drained:
                    await asyncio.sleep(0.01)  # our own queue stays bounded
                if peer.channel.readyState != "open" or peer.pc.connectionState != "connected":
                    ended = True  # the server ended the conversation (its idle timeout, say)
                    break
                if peer.channel.bufferedAmount > 256 * 1024:
                    stats.hung.append(f"datachannel: the server read nothing for {hang_s:.0f} s")
                    ended = True
                    break
                peer.channel.send(msg)
                stats.sent += 1
                stats.kinds[kind] += 1
                if stats.sent % 64 == 0:
                    await asyncio.sleep(0)
            if ended:
                stats.endings["closed_by_server"] += 1
                stats.server_closes[peer.pc.connectionState] += 1
                continue
            before = sum(1 for e in peer.events if e.get("type") == "pong")
            peer.channel.send(json.dumps({"type": "ping", "t": 1.0}))
            answered = time.monotonic() + hang_s
            while time.monotonic() < answered and sum(1 for e in peer.events if e.get("type") == "pong") == before:
                if peer.pc.connectionState in ("failed", "closed"):
                    break
                await asyncio.sleep(0.02)
            for e in peer.events:
                stats.answers[str(e.get("type"))] += 1
                if e.get("type") == "error":
                    stats.errors[str(e.get("code"))] += 1
            if sum(1 for e in peer.events if e.get("type") == "pong") > before:
                stats.liveness_ok += 1
                stats.endings["close"] += 1
            elif peer.pc.connectionState in ("failed", "closed"):
                stats.server_closes[peer.pc.connectionState] += 1
            else:
                stats.hung.append(f"datachannel: no pong within {hang_s:.0f} s after {budget} messages")
        finally:
            await peer.close()
    return True


# ---- peers that hold on: idle, slow, more than the cap -----------------------------------------------
@dataclass
class Holders:
    idle_sent: int = 0
    idle_ended_by_server: int = 0
    idle_codes: Counter = field(default_factory=Counter)
    slow_sent: int = 0
    slow_closed_by_server: int = 0
    over_cap_tried: int = 0
    over_cap_opened: int = 0
    over_cap_refused: Counter = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        return {k: (dict(v) if isinstance(v, Counter) else v) for k, v in self.__dict__.items()}


async def idle_peer(target: Target, holders: Holders, wait_s: float) -> None:
    """A page that says hello and then nothing: the server must end it (its idle timeout)."""
    for attempt in range(40):  # while the fuzzing fills the server, wait for a slot
        try:
            ws = await connect(target.url("/ws"), open_timeout=10, ping_interval=None)
            break
        except InvalidStatus as e:
            if e.response.status_code != 503:
                holders.problems.append(f"an idle page was refused with {e.response.status_code}")
                return
            await asyncio.sleep(0.25)
    else:
        holders.problems.append("an idle page found the server full 40 times")
        return
    holders.idle_sent += 1
    try:
        await ws.send(json.dumps({"type": "hello", "sample_rate": INPUT_RATE}))
        async with asyncio.timeout(wait_s):
            async for msg in ws:
                if isinstance(msg, str) and (ev := json.loads(msg)).get("type") == "error":
                    holders.idle_codes[str(ev.get("code"))] += 1
        holders.idle_ended_by_server += 1
    except TimeoutError:
        holders.problems.append(f"an idle page was still open after {wait_s:.0f} s")
    except ConnectionClosed:
        holders.idle_ended_by_server += 1
    finally:
        ws.transport.abort()


async def slow_peer(target: Target, holders: Holders, wait_s: float) -> None:
    """An upgrade sent a byte a second (slowloris): the server must drop it (its open timeout)."""
    head = (f"GET /ws HTTP/1.1\r\nHost: {target.host}:{target.port}\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
            f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}\r\n\r\n").encode()
    reader, writer = await asyncio.open_connection(target.host, target.port)
    holders.slow_sent += 1
    try:
        async with asyncio.timeout(wait_s):
            for i in range(len(head)):
                writer.write(head[i:i + 1])
                await writer.drain()
                try:  # what the server sends back (or its close) while we dribble
                    data = await asyncio.wait_for(reader.read(4096), 1.0)
                except TimeoutError:
                    continue
                if not data or data.startswith(b"HTTP/1.1 4") or data.startswith(b"HTTP/1.1 5"):
                    holders.slow_closed_by_server += 1
                    return
            holders.problems.append("a slow upgrade was completed, byte by byte")
    except TimeoutError:
        holders.problems.append(f"a slow upgrade was still open after {wait_s:.0f} s")
    except (ConnectionError, OSError):
        holders.slow_closed_by_server += 1
    finally:
        writer.transport.abort()


async def over_the_cap(target: Target, holders: Holders, extra: int = 4) -> None:
    """Cap + `extra` pages at once: the cap opens, the rest get 503; then all close."""
    async def page():
        try:
            ws = await connect(target.url("/ws"), open_timeout=10, ping_interval=None)
        except InvalidStatus as e:
            holders.over_cap_refused[e.response.status_code] += 1
            return None
        holders.over_cap_opened += 1
        return ws

    n = target.max_sessions + extra
    holders.over_cap_tried += n
    opened = [ws for ws in await asyncio.gather(*(page() for _ in range(n))) if ws is not None]
    if len(opened) > target.max_sessions:
        holders.problems.append(f"{len(opened)} pages opened at once, over the cap of {target.max_sessions}")
    await asyncio.gather(*(ws.close() for ws in opened), return_exceptions=True)


async def hold_on(target: Target, holders: Holders, idle: int, slow: int, idle_wait_s: float,
                  slow_wait_s: float) -> None:
    await asyncio.gather(*(idle_peer(target, holders, idle_wait_s) for _ in range(idle)),
                         *(slow_peer(target, holders, slow_wait_s) for _ in range(slow)))
    await over_the_cap(target, holders)


def readyz(target: Target, timeout: float = 10.0) -> int:
    try:
        with urllib.request.urlopen(f"{target.base}/readyz", timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (OSError, urllib.error.URLError):
        return 0


def sessions_active(target: Target, metrics_port: int | None = None, timeout: float = 10.0) -> float | None:
    """duplex_sessions_active from /metrics (None if it cannot be read)."""
    try:
        port = metrics_port or target.port
        with urllib.request.urlopen(f"http://{target.host}:{port}/metrics", timeout=timeout) as r:
            text = r.read().decode()
    except (OSError, urllib.error.URLError):
        return None
    m = re.search(r"^duplex_sessions_active (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


# ---- the normal conversation ---------------------------------------------------------------------
def speech_audio(kind: str, rate: int = INPUT_RATE) -> np.ndarray:
    """0.3 s silence, speech, 1.2 s silence. `noise`: a white-noise burst (what the test doubles
    hear as speech); `flite`: a spoken question; else a WAV file."""
    quiet = lambda s: np.zeros(int(s * rate), np.float32)
    if kind == "noise":
        speech = (np.random.default_rng(1).standard_normal(rate) * 0.2).astype(np.float32)
    elif kind == "flite":
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "q.wav")
            subprocess.run(["flite", "-voice", "slt", "-t", "What time is it?", "-o", path], check=True)
            speech = read_mono(path, rate)
    else:
        speech = read_mono(kind, rate)
    return np.concatenate([quiet(0.3), speech, quiet(1.2)]).astype(np.float32)


async def normal_conversation(target: Target, audio: np.ndarray, when: str, timeout: float,
                              rate: int = INPUT_RATE) -> Conversation:
    """What the page does: hello, the audio at real time in 20 ms frames, then wait for a final
    transcript, reply audio and bot_done (no error event)."""
    t0 = time.monotonic()
    events: list[dict] = []
    audio_frames = 0
    try:
        async with asyncio.timeout(timeout + audio.size / rate + 10):
            for attempt in range(20):
                try:
                    ws = await connect(target.url("/ws"), max_size=None, open_timeout=timeout)
                    break
                except InvalidStatus as e:
                    if e.response.status_code != 503 or attempt == 19:
                        raise
                    await asyncio.sleep(0.25)
            async with ws:
                await ws.send(json.dumps({"type": "hello", "sample_rate": rate}))
                done = asyncio.Event()

                async def read():
                    nonlocal audio_frames
                    async for msg in ws:
                        if isinstance(msg, bytes):
                            audio_frames += 1
                            continue
                        ev = json.loads(msg)
                        events.append(ev)
                        if ev.get("type") in ("bot_done", "error"):
                            done.set()

                reader = asyncio.create_task(read())
                loop = asyncio.get_running_loop()
                start, frame = loop.time(), rate // 50
                for k, i in enumerate(range(0, audio.size, frame)):
                    await ws.send((np.clip(audio[i:i + frame], -1, 1) * 32767).astype("<i2").tobytes())
                    await asyncio.sleep(max(0.0, start + (k + 1) * frame / rate - loop.time()))
                try:
                    await asyncio.wait_for(done.wait(), timeout)
                finally:
                    reader.cancel()
    except TimeoutError:
        pass
    except (OSError, ConnectionClosed, InvalidStatus) as e:
        return Conversation(when, False, time.monotonic() - t0, f"{type(e).__name__}: {e}")
    finals = [e.get("text", "") for e in events if e.get("type") == "final"]
    errors = [e for e in events if e.get("type") == "error"]
    why = ("" if finals and audio_frames and any(e.get("type") == "bot_done" for e in events) and not errors else
           f"finals={finals} audio={audio_frames} errors={errors[:2]} "
           f"events={[e.get('type') for e in events][-12:]}")
    return Conversation(when, not why, time.monotonic() - t0, why, " | ".join(finals), audio_frames)


async def route_answers(target: Target, route: str, hang_s: float) -> str:
    """After the fuzzing, a fresh connection to `route` opens and is answered: "ok", or why not."""
    stats = RouteStats(route)
    try:
        if route == AUDIOSOCKET:
            if target.audiosocket_port is None:
                return "ok"
            reader, writer = await asyncio.wait_for(asyncio.open_connection(target.host, target.audiosocket_port), hang_s)
            writer.write(as_frame(AS_UUID, uuid.uuid4().bytes) + as_frame(0x10, b"\x00" * 320) + as_frame(AS_HANGUP))
            await writer.drain()
            hangups: list = []
            await asyncio.wait_for(_drain_tcp(reader, stats, hangups), hang_s)
            writer.close()
            return "ok" if hangups else "closed without the server's hangup frame"
        ws = await _open_ws(target, route, stats, hang_s)
        if ws is None:
            return f"did not open: {stats.connect_failures}"
        counts: Counter = Counter()
        reader = asyncio.create_task(_drain_ws(ws, stats, counts))
        src = source_for(route, random.Random(0))
        for m in src.prelude():
            await ws.send(m)
        ok = await _alive(ws, route, counts, hang_s)
        await ws.close()
        reader.cancel()
        return "ok" if ok else "no answer to a ping"
    except (TimeoutError, OSError, ConnectionClosed) as e:
        return f"{type(e).__name__}: {e}"


def healthz(target: Target, timeout: float = 10.0) -> bool:
    try:
        with urllib.request.urlopen(f"http://{target.host}:{target.port}/healthz", timeout=timeout) as r:
            return r.status == 200
    except (OSError, urllib.error.URLError):
        return False


async def run_fuzz(target: Target, messages: int = 10000, seed: int = 0, routes: list[str] | None = None,
                   speech: str = "noise", hang_s: float = 30.0, conversation_timeout: float = 30.0,
                   max_seconds: float = 1800.0, progress: bool = False, holders: tuple[int, int] | None = None,
                   idle_wait_s: float = 90.0, slow_wait_s: float = 30.0) -> Report:
    """Fuzz every route at once (the WebSocket routes, AudioSocket, the WebRTC offer and config,
    the data channel), with normal conversations one after another alongside, then one more
    after; then check /healthz, /readyz, that no session is left and that every route still
    answers. `holders`: (idle pages, slow upgrades) to hold on alongside, then the cap + 4 pages
    at once; `idle_wait_s`: how long an idle page may last (the server's idle timeout, and more)."""
    routes = routes or [*(ALL_ROUTES if target.audiosocket_port else WS_ROUTES), *HTTP_ROUTES, DATACHANNEL]
    report = Report({r: RouteStats(r) for r in routes})
    audio = speech_audio(speech)
    t0 = time.monotonic()
    deadline = t0 + max_seconds

    def worker(r: str):
        if r in HTTP_ROUTES:
            return fuzz_http(target, r, messages, seed, report.routes[r], hang_s, deadline)
        if r == DATACHANNEL:
            return fuzz_datachannel(target, messages, seed, report.routes[r], hang_s, deadline)
        return fuzz_route(target, r, messages, seed, report.routes[r], hang_s, deadline)

    workers = [asyncio.create_task(worker(r)) for r in routes]
    if holders is not None:
        report.holders = Holders()
        workers.append(asyncio.create_task(hold_on(target, report.holders, *holders, idle_wait_s, slow_wait_s)))
    all_done = asyncio.gather(*workers)

    async def alongside():
        while not all_done.done() and time.monotonic() < deadline:
            report.conversations.append(await normal_conversation(target, audio, "during", conversation_timeout))

    async def show():
        while not all_done.done():
            await asyncio.sleep(10)
            print(f"[{time.monotonic() - t0:6.0f} s] " + " ".join(f"{r}={s.sent}" for r, s in report.routes.items()),
                  flush=True)

    side = [asyncio.create_task(alongside())] + ([asyncio.create_task(show())] if progress else [])
    try:
        finished = await all_done
        report.deadline_hit = not all(f is not False for f in finished)
        await side[0]
    finally:
        for t in [*workers, *side]:
            t.cancel()
        await asyncio.gather(*workers, *side, return_exceptions=True)
    report.conversations.append(await normal_conversation(target, audio, "after", conversation_timeout))
    report.healthz_after = await asyncio.to_thread(healthz, target)
    for r in routes:
        if r not in HTTP_ROUTES and r != DATACHANNEL:
            report.routes_after[r] = await route_answers(target, r, hang_s)
    settle = time.monotonic() + hang_s  # the last conversations' teardown
    while (status := await asyncio.to_thread(readyz, target)) != 200 and time.monotonic() < settle:
        await asyncio.sleep(0.2)
    report.readyz_after = status
    report.sessions_after = await asyncio.to_thread(sessions_active, target)
    report.seconds = time.monotonic() - t0
    return report


# ---- a server with the test doubles, wired as cmd_serve wires it -------------------------------------
@contextlib.asynccontextmanager
async def doubles_server(port: int, audiosocket_port: int | None, max_sessions: int = 16,
                         secrets: Secrets | None = None, idle_s: float = 60.0):
    """`duplex serve` (agent.serving.server.Server, as cmd_serve runs it) with the models replaced by
    the test doubles of tests/doubles.py: every route and the AudioSocket port. The measured-load
    admission is off (--load-threshold 0): fuzzing loads the machine, and what is fuzzed here is
    the conversations, not the refusals; the --max-sessions cap stays. `secrets`: the guards on,
    as cmd_serve sets them (the token, each carrier's signature); `idle_s`: the idle timeout."""
    sys.path.insert(0, str(ROOT / "tests"))
    from doubles import EnergyVAD, ScriptedLLM, ScriptedRecognizer, ToneVoice

    from agent.conversation.config import Models, SessionConfig
    from agent.conversation.endpointing import SilencePolicy
    from agent.serving.holding import HoldingPolicy
    from agent.serving.load import LoadPolicy
    from agent.serving.server import ServeConfig, Server
    from transport.telephony.signatures import carrier_guards

    models = Models(asr=ScriptedRecognizer(["what time is it"] * 10000), llm=ScriptedLLM("It is noon."),
                    tts=ToneVoice(), vad_factory=EnergyVAD)
    cfg = SessionConfig(speculate=False)
    cfg.turns.endpointing = SilencePolicy()
    guards = {} if secrets is None else carrier_guards(
        twilio_auth_token=secrets.twilio, plivo_auth_token=secrets.plivo, vonage_signature_secret=secrets.vonage,
        auth_token=secrets.token)
    server = Server(models, cfg, ServeConfig(host="127.0.0.1", port=port, audiosocket_port=audiosocket_port,
                                             max_sessions=max_sessions, load=LoadPolicy(cpu_threshold=0),
                                             auth_token=secrets.token if secrets else None, guards=guards,
                                             holding=HoldingPolicy(idle_s=idle_s)))
    task = asyncio.create_task(server.run())
    ready = asyncio.create_task(server.ready.wait())
    await asyncio.wait([ready, task], return_when=asyncio.FIRST_COMPLETED, timeout=30)
    if task.done():
        task.result()  # it could not start: its error
    if not ready.done():
        raise TimeoutError("the doubles server did not start")
    try:
        yield server
    finally:
        task.cancel()
        await asyncio.gather(task, ready, return_exceptions=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def crash_lines(log_text: str) -> list[str]:
    lines = log_text.splitlines()
    out = []
    for i, line in enumerate(lines):
        if any(p in line for p in CRASH_PATTERNS):
            tail = next((lines[j] for j in range(i + 1, min(len(lines), i + 80))
                         if re.match(r"^\w+(\.\w+)*(Error|Exception|Exit)\b", lines[j])), "")
            out.append(f"{line.strip()[:200]}{' -> ' + tail[:200] if tail else ''}")
    return out


def _serve_doubles_main(port: int, audiosocket_port: int | None, max_sessions: int, guarded: bool,
                        idle_s: float) -> int:
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    async def main():
        async with doubles_server(port, audiosocket_port, max_sessions, GUARDED if guarded else None, idle_s):
            print(f"fuzz_sockets: doubles server on {port} (audiosocket {audiosocket_port})", flush=True)
            await asyncio.Future()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
    return 0


def _wait_serving(target: Target, proc: subprocess.Popen | None, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before serving")
        if healthz(target, 1.0):
            return
        time.sleep(0.3)
    raise TimeoutError("the server did not answer /healthz")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int)
    p.add_argument("--audiosocket-port", type=int)
    p.add_argument("--messages", type=int, default=10000, help="per route (default 10000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--token", help="the server's --auth-token (every route that takes it)")
    p.add_argument("--twilio-auth-token", help="sign /twilio upgrades as Twilio does, with this token")
    p.add_argument("--plivo-auth-token", help="sign /plivo upgrades as Plivo does")
    p.add_argument("--vonage-signature-secret", help="send /vonage a signed JWT as Vonage does")
    p.add_argument("--no-guards", action="store_true",
                   help="--self-serve: a server without its guards (no token, no carriers' signatures)")
    p.add_argument("--max-sessions", type=int, default=16, help="the server's cap (--self-serve: given it)")
    p.add_argument("--idle-timeout", type=float, default=10.0,
                   help="the server's idle timeout (--self-serve: given it; default 10 s)")
    p.add_argument("--idle-peers", type=int, default=4, help="pages that say hello, then nothing")
    p.add_argument("--slow-peers", type=int, default=4, help="upgrades sent a byte a second")
    p.add_argument("--routes", help="comma-separated subset, e.g. /ws,/twilio,audiosocket")
    p.add_argument("--speech", default="auto",
                   help="the normal conversation's question: noise (test doubles), flite, or a WAV path; "
                        "auto: noise with --self-serve, else flite when installed")
    p.add_argument("--hang-timeout", type=float, default=30.0, help="a send or answer slower than this is a hang")
    p.add_argument("--conversation-timeout", type=float, default=60.0)
    p.add_argument("--max-seconds", type=float, default=1800.0)
    p.add_argument("--self-serve", action="store_true",
                   help="start a server with the test doubles in a child process and fuzz it")
    p.add_argument("--server-log", help="a log file of the server to scan for tracebacks afterwards")
    p.add_argument("--json", help="write the report as JSON here")
    p.add_argument("--serve-doubles", action="store_true", help=argparse.SUPPRESS)  # the child of --self-serve
    args = p.parse_args(argv)

    if args.serve_doubles:
        return _serve_doubles_main(args.port, args.audiosocket_port, args.max_sessions, not args.no_guards,
                                   args.idle_timeout)
    proc, log_path = None, args.server_log
    if args.self_serve:
        args.port = args.port or free_port()
        args.audiosocket_port = args.audiosocket_port or free_port()
        log_path = log_path or os.path.join(tempfile.mkdtemp(prefix="fuzz-serve-"), "server.log")
        log_file = open(log_path, "w")
        proc = subprocess.Popen([sys.executable, __file__, "--serve-doubles", "--port", str(args.port),
                                 "--audiosocket-port", str(args.audiosocket_port),
                                 "--max-sessions", str(args.max_sessions), "--idle-timeout", str(args.idle_timeout),
                                 *(["--no-guards"] if args.no_guards else [])],
                                stdout=log_file, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        print(f"fuzz_sockets: self-served doubles server pid {proc.pid}, log {log_path}", flush=True)
    if args.port is None:
        p.error("--port (or --self-serve) is required")
    secrets = GUARDED if args.self_serve and not args.no_guards else Secrets(
        args.token, args.twilio_auth_token, args.plivo_auth_token, args.vonage_signature_secret)
    target = Target(args.host, args.port, args.audiosocket_port, secrets=secrets, max_sessions=args.max_sessions)
    speech = args.speech
    if speech == "auto":
        speech = "noise" if args.self_serve else ("flite" if shutil.which("flite") else "noise")
    try:
        _wait_serving(target, proc, 120)
        routes = args.routes.split(",") if args.routes else None
        report = asyncio.run(run_fuzz(target, args.messages, args.seed, routes, speech, args.hang_timeout,
                                      args.conversation_timeout, args.max_seconds, progress=True,
                                      holders=(args.idle_peers, args.slow_peers),
                                      idle_wait_s=args.idle_timeout + 30))
        if proc is not None and proc.poll() is not None:
            report.server_exit = proc.returncode
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    if log_path and os.path.exists(log_path):
        report.server_log_crashes = crash_lines(Path(log_path).read_text(errors="replace"))
    print(report.table())
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=1, default=str))
    failures = report.failures
    for f in failures:
        print(f"FAIL: {f}")
    print("fuzz_sockets: " + ("FAILED" if failures else "passed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
