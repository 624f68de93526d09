"""The far end of a media stream, as each provider documents its messages: what Twilio, Telnyx,
Plivo and Exotel send, and how they read what we send. Written from their docs, not from our
parser, so that the tests check ours against theirs.

- Twilio: twilio.com/docs/voice/media-streams/websocket-messages
- Telnyx: developers.telnyx.com, Media Streaming
- Plivo: plivo.com/docs/voice/xml/the-stream-element (start, media, checkpoint/playedStream,
  clearAudio/clearedAudio); no `connected`, no `stop` (the socket closes)
- Exotel: developer.exotel.com/docs/agentstream/websocket-protocol (numbers as strings, raw
  16-bit PCM, marks echoed once played)
- Vonage: developer.vonage.com/en/voice/voice-api/concepts/websockets (websocket:connected with
  the NCCO's headers flattened, binary 20 ms frames both ways, notify/websocket:notify,
  clear/websocket:cleared; the socket closing ends the call)
"""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass


@dataclass
class Peer:
    name: str
    sid: str
    call_id: str
    encoding: str  # as `start` names it
    rate: int
    seq: int = 0

    @property
    def id_key(self) -> str:
        """The name the provider gives the stream's id."""
        return {"twilio": "streamSid", "telnyx": "stream_id", "plivo": "streamId", "exotel": "stream_sid",
                "vonage": ""}[self.name]

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    # ---- what the provider sends ----------------------------------------------------------
    def connected(self) -> str | None:
        if self.name in ("plivo", "vonage"):
            return None  # Plivo starts with `start`; Vonage's first message is its start
        return json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"})

    def start(self, params: dict[str, str] | None = None) -> str:
        params = params or {}
        n = self._next()
        if self.name == "vonage":
            return json.dumps({"event": "websocket:connected", "content-type": f"audio/l16;rate={self.rate}", **params})
        if self.name == "twilio":
            return json.dumps({"event": "start", "sequenceNumber": str(n), "streamSid": self.sid,
                               "start": {"streamSid": self.sid, "accountSid": "AC1", "callSid": self.call_id,
                                         "tracks": ["inbound"], "customParameters": params,
                                         "mediaFormat": {"encoding": self.encoding, "sampleRate": self.rate,
                                                         "channels": 1}}})
        if self.name == "telnyx":
            return json.dumps({"event": "start", "sequence_number": str(n), "stream_id": self.sid,
                               "start": {"user_id": "3E6F995F-85F7-4705-9741-53B116D28237",
                                         "call_control_id": self.call_id, "call_session_id": "ff55a038",
                                         "from": "+13122010094", "to": "+13122123456", "custom_parameters": params,
                                         "media_format": {"encoding": self.encoding, "sample_rate": self.rate,
                                                          "channels": 1}}})
        if self.name == "plivo":
            return json.dumps({"event": "start", "sequenceNumber": n,
                               "start": {"callId": self.call_id, "streamId": self.sid, "accountId": "MA1",
                                         "tracks": ["inbound"],
                                         "mediaFormat": {"encoding": self.encoding, "sampleRate": self.rate}},
                               "extra_headers": ";".join(f"{k}={v}" for k, v in params.items())})
        return json.dumps({"event": "start", "sequence_number": str(n), "stream_sid": self.sid,
                           "start": {"stream_sid": self.sid, "call_sid": self.call_id, "account_sid": "AC1",
                                     "from": "+919800000000", "to": "+918000000000", "custom_parameters": params,
                                     "media_format": {"encoding": self.encoding, "sample_rate": str(self.rate),
                                                      "bit_rate": "16"}}})

    def media(self, payload: bytes, chunk: int = 1, track: str = "inbound") -> str | bytes:
        if self.name == "vonage":
            return payload  # a binary frame
        n, b64 = self._next(), base64.b64encode(payload).decode()
        if self.name == "twilio":
            return json.dumps({"event": "media", "sequenceNumber": str(n), "streamSid": self.sid,
                               "media": {"track": track, "chunk": str(chunk), "timestamp": str(chunk * 20),
                                         "payload": b64}})
        if self.name == "telnyx":
            return json.dumps({"event": "media", "sequence_number": str(n), "stream_id": self.sid,
                               "media": {"track": track, "chunk": str(chunk), "timestamp": str(chunk * 20),
                                         "payload": b64}})
        if self.name == "plivo":
            return json.dumps({"event": "media", "sequenceNumber": n, "streamId": self.sid,
                               "media": {"track": track, "timestamp": str(1705312200000 + chunk * 20),
                                         "chunk": chunk, "payload": b64}})
        return json.dumps({"event": "media", "sequence_number": str(n), "stream_sid": self.sid,
                           "media": {"chunk": str(chunk), "timestamp": str(chunk * 100), "payload": b64}})

    def echo(self, mark: str) -> str:
        """The provider's word that playback reached a mark (checkpoint) we sent."""
        if self.name == "plivo":
            return json.dumps({"event": "playedStream", "streamId": self.sid, "name": mark})
        if self.name == "vonage":
            return json.dumps({"event": "websocket:notify", "payload": {"mark": mark}})
        return json.dumps({"event": "mark", self.id_key: self.sid, "mark": {"name": mark}})

    def dtmf(self, digit: str) -> str:
        if self.name == "vonage":
            return json.dumps({"event": "websocket:dtmf", "digit": digit, "duration": 260})
        return json.dumps({"event": "dtmf", self.id_key: self.sid, "dtmf": {"track": "inbound", "digit": digit}})

    def stop(self) -> str | None:
        if self.name in ("plivo", "vonage"):
            return None  # the socket closes
        if self.name == "exotel":
            return json.dumps({"event": "stop", "stream_sid": self.sid,
                               "stop": {"call_sid": self.call_id, "account_sid": "AC1", "reason": "callended"}})
        return json.dumps({"event": "stop", self.id_key: self.sid, "stop": {"callSid": self.call_id}})

    # ---- how the provider reads what we send ----------------------------------------------
    def read(self, message: str | bytes) -> tuple[str, object]:
        """("audio", payload bytes) | ("mark", name) | ("clear", None), checking the stream id
        where the provider expects one."""
        if self.name == "vonage":
            if isinstance(message, bytes):
                assert len(message) == self.rate // 50 * 2, len(message)  # exactly 20 ms a message
                return "audio", message
            msg = json.loads(message)
            if msg["action"] == "notify":
                return "mark", msg["payload"]["mark"]
            assert msg == {"action": "clear"}, msg
            return "clear", None
        msg = json.loads(message)
        event = msg["event"]
        if self.name != "telnyx":
            assert msg.get(self.id_key) == self.sid, msg
        if event == ("playAudio" if self.name == "plivo" else "media"):
            if self.name == "plivo":
                assert (msg["media"]["contentType"], msg["media"]["sampleRate"]) == (self.encoding, self.rate), msg
            return "audio", base64.b64decode(msg["media"]["payload"])
        if event == ("checkpoint" if self.name == "plivo" else "mark"):
            return "mark", msg["name"] if self.name == "plivo" else msg["mark"]["name"]
        if event == ("clearAudio" if self.name == "plivo" else "clear"):
            return "clear", None
        raise AssertionError(f"{self.name} does not know {event!r}")

    def cleared(self) -> str | None:
        """The provider's answer to a clear (Plivo's clearedAudio), if any."""
        if self.name == "plivo":
            return json.dumps({"sequenceNumber": self._next(), "event": "clearedAudio", "streamId": self.sid})
        if self.name == "vonage":
            return json.dumps({"event": "websocket:cleared"})
        return None

    @property
    def echoes_cleared_marks(self) -> bool:
        """Twilio and Telnyx hand back the marks still queued at a clear; Plivo's clones say
        theirs are not acknowledged; Exotel and Vonage do not say (we assume they drop them)."""
        return self.name in ("twilio", "telnyx")


def peer(name: str, encoding: str | None = None, rate: int | None = None) -> Peer:
    ids = {"twilio": ("MZ18ad3ab5a668481ce02b83e7395059f0", "CA1", "audio/x-mulaw"),
           "telnyx": ("32DE0DEA-53CB-4B21-89A4-9E1819C043BC", "v2:T02llQ", "PCMU"),
           "plivo": ("20170ada-f610-433b-8758-c02a2aab3662", "ba3e8f5a-2a8a-4a2e-a7b7-7b3c1e1e0b5d", "audio/x-mulaw"),
           "exotel": ("b7c4a1d2e3f40f1e2d3c4b5a69788796", "e0e8f1b2c3d4a5b6c7d8e9f0a1b2c3d4", "audio/x-raw"),
           "vonage": ("", "", "audio/l16")}
    sid, call_id, default_encoding = ids[name]
    return Peer(name, sid, call_id, encoding or default_encoding, rate or (16000 if name == "vonage" else 8000))
