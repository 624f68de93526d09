"""A WebRTC peer on aiortc that talks to `POST /webrtc/offer` as the page does, without a
browser: it offers a mic track (a clip said at real time, then silence) and a data channel,
and records the reply track's decoded audio and the channel's events, each with its arrival
time (time.perf_counter()). The tests and `python -m transport.webrtc.bench` use it.

`ice_hosts` limits the host candidates it gathers (transport/webrtc/ice.py): pass
("127.0.0.1",) to keep every packet on loopback. `ice_servers` are STUN/TURN servers, as
`fetch_config` reads them from the server's /webrtc/config; `relay_only` gathers only TURN relay
candidates (a browser's iceTransportPolicy "relay")."""
from __future__ import annotations

import asyncio
import fractions
import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field

import av
import numpy as np
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtcconfiguration import RTCBundlePolicy

from transport.audio import INPUT_RATE, float_to_int16, resample
from transport.webrtc.ice import configuration, host_addresses
from transport.webrtc.ice_servers import CONFIG_PATH, IceServer
from transport.webrtc.jitter import use_low_latency_audio

RATE = 48000
FRAME = 960  # 20 ms


class ClipTrack(MediaStreamTrack):
    """A microphone that says `clip` (float32 at `rate`) once, at real time, then silence.
    `speech_end`: when the frame holding sample `speech_end_s` of the clip (default: its end)
    was handed to the encoder."""

    kind = "audio"

    def __init__(self, clip: np.ndarray | None = None, rate: int = INPUT_RATE, speech_end_s: float | None = None):
        super().__init__()
        pcm = resample(clip, rate, RATE) if clip is not None and clip.size else np.zeros(0, np.float32)
        self.pcm = float_to_int16(pcm)
        self.end_sample = int(RATE * speech_end_s) if speech_end_s is not None else self.pcm.size
        self.pts = 0
        self.t0: float | None = None
        self.speech_end: float | None = None

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self.t0 is None:
            self.t0 = time.perf_counter()
        wait = self.t0 + self.pts / RATE - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        chunk = self.pcm[self.pts:self.pts + FRAME]
        if chunk.size < FRAME:
            chunk = np.pad(chunk, (0, FRAME - chunk.size))
        if self.speech_end is None and self.pts + FRAME >= self.end_sample:
            self.speech_end = time.perf_counter()
        frame = av.AudioFrame(format="s16", layout="mono", samples=FRAME)
        frame.planes[0].update(chunk.tobytes())
        frame.pts, frame.sample_rate, frame.time_base = self.pts, RATE, fractions.Fraction(1, RATE)
        self.pts += FRAME
        return frame


@dataclass
class Peer:
    pc: RTCPeerConnection
    mic: ClipTrack
    events: list[dict] = field(default_factory=list)
    event_times: list[float] = field(default_factory=list)  # when each event came
    audio: list[tuple[float, np.ndarray]] = field(default_factory=list)  # (decoded at, mono float @48k)
    audio_pts: list[int] = field(default_factory=list)  # each decoded frame's RTP time from the first (48 kHz)
    tasks: list[asyncio.Task] = field(default_factory=list)
    channel: object = None

    def reply_pcm(self) -> np.ndarray:
        return np.concatenate([a for _, a in self.audio]) if self.audio else np.zeros(0, np.float32)

    def first_loud_after(self, t: float, level: float = 0.01) -> float | None:
        """When the first decoded 20 ms frame louder than `level` (RMS) came after `t`."""
        for at, a in self.audio:
            if at > t and a.size and float(np.sqrt(np.mean(a ** 2))) > level:
                return at
        return None

    def decoded_at(self, rtp: int) -> float | None:
        """When the frame the server handed to RTP at `rtp` (its "audio" event) was decoded here:
        aiortc counts a track's RTP time from its first packet, and so does our track."""
        return next((at for (at, _), pts in zip(self.audio, self.audio_pts) if pts >= rtp), None)

    def send(self, obj: dict) -> None:
        self.channel.send(json.dumps(obj))

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.pc.close()


def _http(req: urllib.request.Request) -> tuple[int, str]:
    """A blocking HTTP request: (status, body text), refusals included."""
    try:
        with urllib.request.urlopen(req, timeout=15) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def post(url: str, body: bytes, content_type: str = "application/json", headers: dict | None = None):
    """A blocking HTTP POST: (status, body text)."""
    return _http(urllib.request.Request(url, data=body, method="POST",
                                        headers={"Content-Type": content_type, **(headers or {})}))


def fetch_config(base_url: str, token: str | None = None,
                 headers: dict | None = None) -> tuple[int, dict | str]:
    """A blocking GET of `base_url`/webrtc/config: (200, its JSON) or (status, the refusal's text)."""
    url = base_url + CONFIG_PATH + (f"?token={token}" if token else "")
    status, text = _http(urllib.request.Request(url, headers=headers or {}))
    return status, json.loads(text) if status == 200 else text


async def _read(track, peer: Peer) -> None:
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        x = frame.to_ndarray().reshape(-1, len(frame.layout.channels)).astype(np.float32).mean(axis=1) / 32768
        peer.audio_pts.append(frame.pts)
        peer.audio.append((time.perf_counter(), x))


def _on_message(peer: Peer, message: str) -> None:
    peer.event_times.append(time.perf_counter())
    peer.events.append(json.loads(message))


async def connect(base_url: str, clip: np.ndarray | None = None, rate: int = INPUT_RATE, *,
                  ice_hosts: Sequence[str] | None, speech_end_s: float | None = None,
                  hello: dict | None = None, data_channel: bool = True, token: str | None = None,
                  low_latency_audio: bool = True, ice_servers: Sequence[IceServer] = (),
                  relay_only: bool = False) -> Peer:
    """Offer to `base_url`/webrtc/offer (http://HOST:PORT) and start talking; RuntimeError with
    the server's answer when it refuses. `low_latency_audio`: the reply track's packets are
    decoded as they come (transport/webrtc/jitter.py), so the arrival times are the transport's
    alone; False keeps aiortc's jitter buffer (80 ms later)."""
    config = configuration(ice_servers, relay_only=relay_only)
    config.bundlePolicy = RTCBundlePolicy.MAX_BUNDLE
    pc = RTCPeerConnection(config)
    peer = Peer(pc, ClipTrack(clip, rate, speech_end_s))
    pc.addTrack(peer.mic)
    if low_latency_audio:
        use_low_latency_audio(pc)
    pc.on("track", lambda track: peer.tasks.append(asyncio.create_task(_read(track, peer))))
    if data_channel:
        peer.channel = ch = pc.createDataChannel("events")
        ch.on("message", lambda m: _on_message(peer, m))
        ch.on("open", lambda: ch.send(json.dumps(hello or {"type": "hello"})))
    with host_addresses(ice_hosts):
        await pc.setLocalDescription(await pc.createOffer())
    body = json.dumps({"sdp": pc.localDescription.sdp, "type": "offer"}).encode()
    url = base_url + "/webrtc/offer" + (f"?token={token}" if token else "")
    status, text = await asyncio.to_thread(post, url, body)
    if status != 200:
        await pc.close()
        raise RuntimeError(f"offer refused: {status} {text}")
    answer = json.loads(text)
    await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], answer["type"]))
    return peer
