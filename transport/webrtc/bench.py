"""Mouth-to-ear over WebRTC against WebSocket, on one running `duplex serve`.

    duplex serve --llm smollm2-135m --ice-host 127.0.0.1 --load-threshold 0 &
    python -m transport.webrtc.bench http://127.0.0.1:8080 --turns 5

Each turn is a fresh conversation that says the same question (flite, or --wav) at real time
and waits for the reply. Mouth-to-ear, measured at the client: the frame holding the question's
last speech sample sent -> the first reply audio the client can play (WebSocket: the first
reply audio message received, which the page plays at once; WebRTC: the first frame out of
aiortc's jitter buffer and Opus decoder that is not silence). Its server part varies with the models from turn to
turn, so the transport's own share is reported too: mouth-to-ear minus the server's
voice-to-voice for the same turn. p50 over the turns. Traffic: only to the URL given, and the
WebRTC peer gathers --ice-host addresses only (default 127.0.0.1).
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
import urllib.request
from pathlib import Path

import numpy as np
import soundfile as sf

from transport.audio import resample
from transport.web.client import converse, reply_done
from transport.webrtc.client import connect

RATE = 16000
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
            x, r = sf.read(path, dtype="float32")
    else:
        x, r = sf.read(wav, dtype="float32")
    if x.ndim > 1:
        x = x.mean(axis=1)
    x = resample(x, r, RATE)
    loud = np.flatnonzero(np.abs(x) > 0.01)
    end_s = 0.5 + (loud[-1] + 1 if loud.size else x.size) / RATE
    return np.concatenate([np.zeros(RATE // 2, np.float32), x, np.zeros(3 * RATE, np.float32)]), end_s


def server_v2v(events: list[dict]) -> float | None:
    return next((float(e["voice_to_voice_ms"]) for e in events
                 if e.get("type") == "latency" and e.get("voice_to_voice_ms") is not None), None)


async def websocket_turn(base: str, audio: np.ndarray, end_s: float) -> tuple[float | None, float | None]:
    ws_url = base.replace("http://", "ws://").replace("https://", "wss://") + "/ws"
    c = await converse(ws_url, audio, RATE, speech_end_s=end_s, pad_s=30.0,
                       until=lambda c: reply_done(c) and server_v2v(c.events) is not None, reply_timeout=60)
    return c.voice_to_voice_ms, c.server_voice_to_voice_ms


async def webrtc_turn(base: str, audio: np.ndarray, end_s: float, hosts: list[str],
                      timeout: float = 60.0) -> tuple[float | None, float | None]:
    peer = await connect(base, audio, RATE, ice_hosts=hosts, speech_end_s=end_s)
    try:
        deadline = time.perf_counter() + audio.size / RATE + timeout
        while time.perf_counter() < deadline:
            end = peer.mic.speech_end
            # the first frame that is not silence, as the WebSocket side counts the first message
            heard = peer.first_loud_after(end, level=AUDIBLE) if end is not None else None
            if heard is not None and server_v2v(peer.events) is not None:
                return (heard - end) * 1000.0, server_v2v(peer.events)
            await asyncio.sleep(0.02)
        return None, server_v2v(peer.events)
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


async def run(args) -> dict:
    audio, end_s = question_audio(args.wav)
    out: dict = {}
    for name in ("websocket", "webrtc"):
        turns = []
        for _ in range(args.turns):
            await until_admitting(args.url)
            if name == "websocket":
                m2e, v2v = await websocket_turn(args.url, audio, end_s)
            else:
                m2e, v2v = await webrtc_turn(args.url, audio, end_s, args.ice_host or ["127.0.0.1"])
            turns.append({"mouth_to_ear_ms": m2e, "server_v2v_ms": v2v,
                          "transport_ms": m2e - v2v if m2e is not None and v2v is not None else None})
            print(f"{name:9s} mouth-to-ear {m2e if m2e is None else round(m2e)} ms, "
                  f"server voice-to-voice {v2v if v2v is None else round(v2v)} ms", flush=True)
        out[name] = {"turns": turns, "p50_mouth_to_ear_ms": p50([t["mouth_to_ear_ms"] for t in turns]),
                     "p50_transport_ms": p50([t["transport_ms"] for t in turns])}
    ws, rtc = out["websocket"], out["webrtc"]
    if None not in (ws["p50_transport_ms"], rtc["p50_transport_ms"]):
        out["webrtc_extra_ms"] = rtc["p50_transport_ms"] - ws["p50_transport_ms"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m transport.webrtc.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("url", help="the server, http://HOST:PORT")
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--wav", help=f"the question (default: flite says {QUESTION!r})")
    p.add_argument("--ice-host", action="append", help="host candidates of the WebRTC peer (default 127.0.0.1)")
    p.add_argument("--json", help="write every figure here")
    args = p.parse_args(argv)
    res = asyncio.run(run(args))
    for name in ("websocket", "webrtc"):
        r = res[name]
        f = lambda v: "n/a" if v is None else f"{v:.0f} ms"
        print(f"{name:9s} p50 mouth-to-ear {f(r['p50_mouth_to_ear_ms'])}, of which transport {f(r['p50_transport_ms'])}"
              f" ({args.turns} turns)")
    if "webrtc_extra_ms" in res:
        print(f"WebRTC adds {res['webrtc_extra_ms']:+.0f} ms over WebSocket (Opus, pacing, jitter buffer)")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
