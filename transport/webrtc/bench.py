"""Mouth-to-ear over WebRTC against WebSocket, on one running `duplex serve`.

    duplex serve --llm smollm2-135m --ice-host 127.0.0.1 --load-threshold 0 &
    python -m transport.webrtc.bench http://127.0.0.1:8080 --turns 5

Each turn is a fresh conversation that says the same question (flite, or --wav) at real time
and waits for the reply. Mouth-to-ear, measured at the client: the frame holding the question's
last speech sample sent -> the reply's first audio at the client (WebSocket: its first audio
message, which the page plays at once; WebRTC: the frame the server announced as the reply's
first one handed to RTP, by its RTP time, out of the client's jitter buffer and Opus decoder).
Its server part varies with the models from turn to turn, so the transport's own share is
reported too: mouth-to-ear minus the server's voice-to-voice for the same turn (the stages of
which are printed, p50). On a loopback URL the share splits into uplink, the server's pacing,
RTP and downlink (see `turn_figures`). p50 over the turns.

The WebRTC client decodes packets as they come (`--client-jitter low`), so its figure is the
transport's alone; a browser adds its NetEq delay (the page logs it: `jitter_buffer` events),
which grows with how unevenly the packets arrive: printed as the reply's arrival jitter (p95).
The client shares the machine's cores with the server (aiortc costs it ~12% of a core per
conversation, the WebSocket client ~3%), which slows the server's stages a little under WebRTC.

Traffic: only to the URL given, and the WebRTC peer gathers --ice-host addresses only (default
127.0.0.1).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np

from transport.audio import INPUT_RATE, read_mono
from transport.web.client import converse, reply_done
from transport.webrtc.client import connect

QUESTION = "What is the capital of France?"
AUDIBLE = 1e-4  # RMS of a decoded 20 ms frame above Opus's rendering of digital silence


def question_audio(wav: str | None) -> tuple[np.ndarray, float]:
    """The question at 16 kHz with silence around it, and where its speech ends (s)."""
    if wav is None:
        if shutil.which("flite") is None:
            raise SystemExit("flite is not installed: pass --wav")
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "q.wav"
            subprocess.run(["flite", "-voice", "slt", "-t", QUESTION, "-o", str(path)], check=True)
            x = read_mono(path, INPUT_RATE)
    else:
        x = read_mono(wav, INPUT_RATE)
    loud = np.flatnonzero(np.abs(x) > 0.01)
    end_s = 0.5 + (loud[-1] + 1 if loud.size else x.size) / INPUT_RATE
    return np.concatenate([np.zeros(INPUT_RATE // 2, np.float32), x, np.zeros(3 * INPUT_RATE, np.float32)]), end_s


def server_v2v(events: list[dict]) -> float | None:
    return next((float(e["voice_to_voice_ms"]) for e in events
                 if e.get("type") == "latency" and e.get("voice_to_voice_ms") is not None), None)


STAGES = ("endpoint_ms", "asr_final_ms", "llm_ttft_ms", "tts_first_chunk_ms", "send_ms")


def turn_figures(events: list[dict], client_end: float | None, heard: float | None,
                 handoff_ms: float | None, same_clock: bool) -> dict:
    """One turn's figures (ms). mouth-to-ear = client's end of speech -> reply heard; the server's
    voice-to-voice = its end of speech -> first reply audio handed to the transport; transport =
    the difference. On one machine (a loopback URL: client and server read the same monotonic
    clock, time.perf_counter) the transport share splits exactly into uplink (the client's end of
    speech -> the server's reading of it: encoding, the wire, the server's jitter buffer, decoding,
    resampling, the VAD) and downlink (the first audio handed to the transport -> heard), and over
    WebRTC the downlink into pacing (-> the track hands that audio to the encoder, RTP) and rtp
    (-> the client has decoded it: Opus both ways, the wire, the client's jitter buffer)."""
    v2v = server_v2v(events)
    m2e = (heard - client_end) * 1000.0 if heard is not None and client_end is not None else None
    latency = next((e for e in events if e.get("type") == "latency" and e.get("voice_to_voice_ms") is not None), {})
    out = {"mouth_to_ear_ms": m2e, "server_v2v_ms": v2v,
           "transport_ms": m2e - v2v if m2e is not None and v2v is not None else None,
           **{k: latency.get(k) for k in STAGES}}
    endpoint = next((e for e in events if e.get("type") == "endpoint"), None)
    if same_clock and endpoint is not None and v2v is not None and m2e is not None:
        first_out = endpoint["speech_end_ms"] + v2v
        out["uplink_ms"] = endpoint["speech_end_ms"] - client_end * 1000.0
        out["downlink_ms"] = heard * 1000.0 - first_out
        if handoff_ms is not None:
            out["pacing_ms"] = handoff_ms - first_out
            out["rtp_ms"] = heard * 1000.0 - handoff_ms
    return out


async def websocket_turn(base: str, audio: np.ndarray, end_s: float, same_clock: bool) -> dict:
    ws_url = base.replace("http://", "ws://").replace("https://", "wss://") + "/ws"
    c = await converse(ws_url, audio, INPUT_RATE, speech_end_s=end_s, pad_s=30.0,
                       until=lambda c: reply_done(c) and server_v2v(c.events) is not None, reply_timeout=60)
    # converse's times are loop.time(), time.monotonic(): the same clock as perf_counter on Linux
    return turn_figures(c.events, c.speech_end_sent, c.first_audio, None, same_clock)


def arrival_jitter_p95_ms(peer, window: int = 100) -> float | None:
    """How unevenly the reply track's frames reached the client (decoded): each frame's arrival
    less its RTP time, above the earliest such over the 2 s before it (a stall that the track
    gives up on shifts the stream for good; that is not jitter). What a browser's NetEq sizes its
    delay by."""
    offsets = np.array([at - pts / 48000 for (at, _), pts in zip(peer.audio, peer.audio_pts)][50:])
    if offsets.size <= window:
        return None
    floor = np.array([offsets[max(0, i - window):i + 1].min() for i in range(offsets.size)])
    return float(np.percentile(offsets - floor, 95) * 1000)


async def webrtc_turn(base: str, audio: np.ndarray, end_s: float, hosts: list[str], same_clock: bool,
                      timeout: float = 60.0, client_jitter: str = "low") -> dict:
    peer = await connect(base, audio, INPUT_RATE, ice_hosts=hosts, speech_end_s=end_s,
                         low_latency_audio=client_jitter == "low")
    try:
        deadline = time.perf_counter() + audio.size / INPUT_RATE + timeout
        heard = None
        while time.perf_counter() < deadline:
            end = peer.mic.speech_end
            # the first frame that is not silence; then the reply's first frame by its RTP time
            heard = peer.first_loud_after(end, level=AUDIBLE) if end is not None else None
            if heard is not None and server_v2v(peer.events) is not None:
                break
            await asyncio.sleep(0.02)
        else:
            heard = None
        # the reply's first piece handed to RTP (the server announces each one on the channel)
        ep = next((i for i, e in enumerate(peer.events) if e.get("type") == "endpoint"), None)
        first = None if ep is None else next((e for e in peer.events[ep:] if e.get("type") == "audio"
                                              and e.get("event") == "start"), None)
        handoff = None if first is None else first["server_ms"]
        if first is not None and (at := peer.decoded_at(first["rtp"])) is not None:
            loud = heard
            heard = at
            if loud is not None and loud - at > 0.03:
                print(f"  (its first audible frame came {(loud - at) * 1000:.0f} ms after its first frame)")
        out = turn_figures(peer.events, peer.mic.speech_end, heard, handoff, same_clock)
        out["arrival_jitter_p95_ms"] = arrival_jitter_p95_ms(peer)
        return out
    finally:
        await peer.close()


def p50(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def admitting(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


async def until_admitting(url: str, timeout: float = 60.0) -> None:
    """The last turn's conversation has ended on the server, and it takes the next one."""
    deadline = time.perf_counter() + timeout
    while not await asyncio.to_thread(admitting, url):
        if time.perf_counter() > deadline:
            raise SystemExit(f"{url}/readyz has refused conversations for {timeout:.0f} s")
        await asyncio.sleep(0.2)


PARTS = ("uplink_ms", "server_v2v_ms", "pacing_ms", "rtp_ms", "downlink_ms", "arrival_jitter_p95_ms")


async def run(args) -> dict:
    audio, end_s = question_audio(args.wav)
    same_clock = urllib.parse.urlsplit(args.url).hostname in ("127.0.0.1", "::1", "localhost")
    out: dict = {"same_clock": same_clock}
    for name in ("websocket", "webrtc"):
        turns = []
        for _ in range(args.turns):
            await until_admitting(args.url)
            if name == "websocket":
                t = await websocket_turn(args.url, audio, end_s, same_clock)
            else:
                t = await webrtc_turn(args.url, audio, end_s, args.ice_host or ["127.0.0.1"], same_clock,
                                      client_jitter=args.client_jitter)
            turns.append(t)
            print(f"{name:9s} " + ", ".join(f"{k[:-3]} {fmt(t.get(k))}" for k in ("mouth_to_ear_ms", "transport_ms", *PARTS)
                                            if k in t), flush=True)
        out[name] = {"turns": turns, **{f"p50_{k}": p50([t.get(k) for t in turns])
                                        for k in ("mouth_to_ear_ms", "transport_ms", *PARTS, *STAGES)}}
    ws, rtc = out["websocket"], out["webrtc"]
    if None not in (ws["p50_transport_ms"], rtc["p50_transport_ms"]):
        out["webrtc_extra_ms"] = rtc["p50_transport_ms"] - ws["p50_transport_ms"]
    return out


def fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0f} ms"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m transport.webrtc.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("url", help="the server, http://HOST:PORT")
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--wav", help=f"the question (default: flite says {QUESTION!r})")
    p.add_argument("--ice-host", action="append", help="host candidates of the WebRTC peer (default 127.0.0.1)")
    p.add_argument("--client-jitter", choices=("low", "aiortc"), default="low",
                   help="the WebRTC client's jitter buffer: low (packets decoded as they come, so the "
                        "figure is the transport's; a browser adds its NetEq delay, which the page "
                        "measures) or aiortc (its own: 4 packets, +80 ms)")
    p.add_argument("--json", help="write every figure here")
    args = p.parse_args(argv)
    res = asyncio.run(run(args))
    for name in ("websocket", "webrtc"):
        r = res[name]
        print(f"{name:9s} p50 mouth-to-ear {fmt(r['p50_mouth_to_ear_ms'])}, of which transport "
              f"{fmt(r['p50_transport_ms'])} ({args.turns} turns)")
        if res["same_clock"]:
            print(f"{'':9s}   p50 uplink {fmt(r['p50_uplink_ms'])} | server {fmt(r['p50_server_v2v_ms'])} ("
                  + ", ".join(f"{k[:-3]} {fmt(r['p50_' + k])}" for k in STAGES) + ") | "
                  + (f"pacing {fmt(r['p50_pacing_ms'])}, rtp {fmt(r['p50_rtp_ms'])}, " if name == "webrtc" else "")
                  + f"downlink {fmt(r['p50_downlink_ms'])}"
                  + (f"; the reply's arrival jitter p95 {fmt(r['p50_arrival_jitter_p95_ms'])}" if name == "webrtc" else ""))
    if "webrtc_extra_ms" in res:
        print(f"WebRTC adds {res['webrtc_extra_ms']:+.0f} ms over WebSocket (Opus, pacing, jitter buffers)")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
