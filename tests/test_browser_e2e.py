"""A real browser talks to `duplex serve`: headless Chromium with a fake microphone fed from a WAV.

The WAV script: a question, a pause for the reply, a second request that asks for a long answer,
and then speech over the bot's reply (barge-in). Everything the page sees is in window.duplexLog.
"""
from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from helpers import duplex_asr_serve, duplex_serve, say, silence, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.models]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def conversation_wav(tmp_path_factory) -> tuple[Path, dict]:
    d = tmp_path_factory.mktemp("mic")
    q1 = say("What is the capital of France?", d / "q1.wav")
    q2 = say("Please tell me a long story about a brave little dragon.", d / "q2.wav")
    bi = say("Stop, stop. Wait a moment please.", d / "bi.wav")
    parts = [silence(1.5), q1, silence(9.0), q2, silence(2.5), bi, silence(9.0)]
    marks, t = {}, 0.0
    for name, p in zip(["lead", "q1", "gap1", "q2", "gap2", "barge_in", "tail"], parts):
        marks[name] = (t, t + p.size / 16000)
        t += p.size / 16000
    path = d / "mic.wav"
    sf.write(path, np.concatenate(parts), 16000, subtype="PCM_16")
    return path, marks


@pytest.fixture(scope="module", params=["embedded-asr", "remote-asr"])
def recognizer(request):
    """The page's session on the embedded Whisper, or on `--asr ws://` to a `duplex asr-serve`."""
    if request.param == "embedded-asr":
        yield []
    else:
        with duplex_asr_serve("--slots", "2") as url:
            yield ["--asr", url]


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory, recognizer) -> Path:
    return tmp_path_factory.mktemp("traces")


@pytest.fixture(scope="module")
def server(trace_dir, recognizer):
    with duplex_serve("--llm", "smollm2-135m", "--trace-dir", str(trace_dir), *recognizer) as port:
        yield f"http://127.0.0.1:{port}"


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed (scripts/setup.sh installs it)")
def test_browser_conversation(server, conversation_wav, trace_dir):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    wav, marks = conversation_wav
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--autoplay-policy=no-user-gesture-required",
            "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={wav}%noloop"])
        page = browser.new_page()
        page.goto(server + "/?autostart=1&aec=0")
        page.wait_for_function("window.duplexLog.some(e => e.type === 'mic_started')", timeout=30_000)
        total_s = marks["tail"][1]
        page.wait_for_timeout(int(total_s * 1000))  # the microphone file plays out at real time
        # then what the checks below need (a loaded machine may still be finishing it), or 60 s
        with contextlib.suppress(PlaywrightTimeout):
            page.wait_for_function("window.duplexLog.some(e => e.type === 'player_cleared')"
                                   " && window.duplexLog.some(e => e.type === 'heard_latency' && e.turn === 0)"
                                   " && window.duplexLog.some(e => e.type === 'latency' && e.turn === 0)",
                                   timeout=60_000)
        page.wait_for_timeout(2000)  # the rest of the reply to the barge-in
        log = page.evaluate("window.duplexLog")
        Path(os.environ.get("DUPLEX_BROWSER_LOG", "/tmp/duplex-browser-log.json")).write_text(__import__("json").dumps(log))
        browser.close()

    types = [e["type"] for e in log]
    order = types.index("worklet_rendering"), types.index("mic_started")
    assert order[0] < order[1], "getUserMedia must start only after the mic worklet renders"
    finals = [e for e in log if e["type"] == "final" and e.get("text")]
    assert len(finals) >= 2, f"expected two user turns, got {[f['text'] for f in finals]}"
    first = finals[0]["text"].lower()
    assert "capital" in first and "france" in first, first
    second = finals[1]["text"].lower()
    assert "dragon" in second or "story" in second, second

    # the bot's reply text is non-empty and its audio was played in the page, for both turns
    for turn in (finals[0]["turn"], finals[1]["turn"]):
        text = "".join(e["text"] for e in log if e["type"] == "bot_text" and e["turn"] == turn)
        assert text.strip(), f"empty reply text in turn {turn}"
    started = [e for e in log if e["type"] == "player_started"]
    assert started, "no reply audio was ever played in the page"
    latencies = [e for e in log if e["type"] == "latency"]
    assert latencies and latencies[0]["voice_to_voice_ms"] > 0

    # barge-in: the server cancelled the reply and the page flushed its player
    assert "interrupted" in types, "speaking over the bot did not interrupt it"
    i_clear = types.index("clear")
    assert "player_cleared" in types[i_clear:], "the page did not flush its playback worklet"
    cleared = next(e for e in log[i_clear:] if e["type"] == "player_cleared")
    i_cleared = log.index(cleared)
    # nothing of the interrupted reply plays after the flush
    ids_before = {e["id"] for e in log[:i_clear] if e["type"] == "audio"}
    replayed = [e for e in log[i_cleared:] if e["type"] == "player_started" and e["id"] in ids_before]
    assert not replayed, f"audio of the interrupted reply kept playing: {replayed[:3]}"
    # client-side truth: the page measured mouth-to-ear (its own clock, from the capture time of
    # the user's last speech sample to the first reply sample played), and it cannot be shorter
    # than the server's voice-to-voice figure for the same turn
    heard = {e["turn"]: e["ms"] for e in log if e["type"] == "heard_latency"}
    server = {e["turn"]: e["voice_to_voice_ms"] for e in latencies}
    assert 0 in heard and 0 in server, (heard, server)
    assert heard[0] >= server[0], f"mouth-to-ear {heard[0]:.0f} ms < server voice-to-voice {server[0]:.0f} ms"
    assert any(e["type"] == "pong" for e in log), "no clock-offset probe answered"

    # the server's trace of that session holds the page's playout marks (on the server clock,
    # from the ping/pong offset) and the page's mouth-to-ear figures
    from agent.trace_export import load_events

    wait_until(lambda: list(trace_dir.glob("*.trace.json")), 20, every=0.2)
    traces = list(trace_dir.glob("*.trace.json"))
    assert traces, "the session's trace was not written when the page went away"
    events = load_events(str(traces[0]))
    playout = [e for e in events if e.stage == "client" and e.name == "playout_start"]
    sends = [e for e in events if e.stage == "transport" and e.name == "send_audio"]
    assert playout and sends
    assert min(e.ts_ns for e in playout) >= min(e.ts_ns for e in sends) - 50_000_000
    m2e = [e for e in events if e.stage == "client" and e.name == "mouth_to_ear"]
    assert m2e and m2e[0].args["ms"] == pytest.approx(heard[m2e[0].turn], abs=0.5)
