"""A real browser talks to `duplex serve`: headless Chromium with a fake microphone fed from a WAV.

The WAV script: a question, a pause for the reply, a second request that asks for a long answer,
and then speech over the bot's reply (barge-in). Everything the page sees is in window.duplexLog.

The same checks run over both of the page's transports. Over the WebSocket, the server runs
here on 127.0.0.1. Over WebRTC, the server (--ice-host 127.0.0.1) and Chromium run together in
a network namespace of their own that has nothing but `lo` (`unshare -rn`,
tests/browser_in_netns.py): Chromium gathers loopback only with
--allow-loopback-in-peer-connection, and every other interface as well, so only there can no
ICE check reach another interface address.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from helpers import duplex_asr_serve, duplex_serve, report_figure, say, silence, speech_onset_s, wait_until

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
    marks["barge_in_speech"] = marks["barge_in"][0] + speech_onset_s(bi)
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


def own_network_namespace() -> bool:
    return shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "-rn", "true"], capture_output=True, check=False).returncode == 0


def launch_with_file_mic(pw, wav) -> object:
    """Headless Chromium whose microphone plays `wav` once, at real time (Playwright's `pw`)."""
    return pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
        "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--autoplay-policy=no-user-gesture-required", "--allow-loopback-in-peer-connection",
        "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={wav}%noloop"])


# Holds the page's main thread for `for_ms` from `at_ms` after the microphone started, as a busy
# web app's own work would, and logs when ({type: "main_blocked", from, to}).
BLOCK_MAIN = """([atMs, forMs]) => {
  const mic = window.duplexLog.find((e) => e.type === "mic_started").page_ms;
  setTimeout(() => {
    const from = performance.now();
    while (performance.now() - from < forMs);
    window.duplexLog.push({ type: "main_blocked", from, to: performance.now() });
  }, Math.max(0, mic + atMs - performance.now()));
}"""


def run_page(url: str, wav: Path, total_s: float, transport: str,
             block_main: tuple[float, float] | None = None) -> list[dict]:
    """Chromium opens the page at `url` over `transport`, speaks `wav` and returns its log.
    `block_main`: (at_s, for_s), the page's main thread held busy for for_s from at_s into the
    microphone's audio."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch_with_file_mic(pw, wav)
        page = browser.new_page()
        page.goto(url + f"/?autostart=1&aec=0&transport={transport}")
        page.wait_for_function("window.duplexLog.some(e => e.type === 'mic_started')", timeout=30_000)
        if block_main is not None:
            page.evaluate(BLOCK_MAIN, [block_main[0] * 1000, block_main[1] * 1000])
        page.wait_for_timeout(int(total_s * 1000))  # the microphone file plays out at real time
        # then what the checks below need (a loaded machine may still be finishing it), or 60 s
        with contextlib.suppress(PlaywrightTimeout):
            page.wait_for_function("window.duplexLog.some(e => e.type === 'player_cleared')"
                                   " && window.duplexLog.some(e => e.type === 'heard_latency' && e.turn === 0)"
                                   " && window.duplexLog.some(e => e.type === 'latency' && e.turn === 0)",
                                   timeout=60_000)
        page.wait_for_timeout(2000)  # the rest of the reply to the barge-in
        log = page.evaluate("window.duplexLog")
        browser.close()
    return log


def check_barge_in(log: list[dict], speech_s: float, figure_transport: str) -> dict:
    """The server cancelled the reply spoken over at `speech_s` into the mic's audio, the page
    flushed its player, and nothing of that reply played after; returns the page's flush event."""
    types = [e["type"] for e in log]
    assert "interrupted" in types, "speaking over the bot did not interrupt it"
    i_clear = types.index("clear")
    assert "player_cleared" in types[i_clear:], "the page did not flush its player"
    cleared = next(e for e in log[i_clear:] if e["type"] == "player_cleared")
    i_cleared = log.index(cleared)
    # the figure (not asserted): from the start of the speech over the bot (the fake microphone
    # plays the file from getUserMedia on, so on the page clock from mic_started) to the flush
    mic_ms = next(e for e in log if e["type"] == "mic_started")["page_ms"]
    report_figure("barge_in_page", transport=figure_transport,
                  player_cleared_ms=round(cleared["page_ms"] - mic_ms - speech_s * 1000))
    ids_before = {e["id"] for e in log[:i_clear] if e["type"] == "audio"}
    replayed = [e for e in log[i_cleared:] if e["type"] == "player_started" and e["id"] in ids_before]
    assert not replayed, f"audio of the interrupted reply kept playing: {replayed[:3]}"
    return cleared


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed (scripts/setup.sh installs it)")
@pytest.mark.parametrize("transport", ["ws", "webrtc"])
def test_browser_conversation(transport, conversation_wav, trace_dir, recognizer, request):
    wav, marks = conversation_wav
    if transport == "ws":
        log = run_page(request.getfixturevalue("server"), wav, marks["tail"][1], "ws")
    else:
        if not own_network_namespace():
            pytest.skip("no network namespace of our own (unshare -rn) to keep WebRTC on loopback")
        if recognizer:  # its asr-serve listens outside the namespace
            pytest.skip("the WebRTC page runs on the embedded recognizer; the remote one is the ws run's")
        trace_dir = trace_dir / "webrtc"
        trace_dir.mkdir()
        out = trace_dir.parent / "webrtc-log.json"
        cmd = ["unshare", "-rn", sys.executable, str(Path(__file__).with_name("browser_in_netns.py")),
               str(wav), str(marks["tail"][1]), str(trace_dir), str(out)]
        done = subprocess.run(cmd, env=dict(os.environ, PYTHONUNBUFFERED="1"), capture_output=True, check=False,
                              text=True, timeout=600)
        print(done.stdout[-6000:], done.stderr[-3000:])
        assert done.returncode == 0, "the page's WebRTC run in its network namespace failed"
        log = json.loads(out.read_text())
    Path(os.environ.get("DUPLEX_BROWSER_LOG", f"/tmp/duplex-browser-log-{transport}.json")).write_text(json.dumps(log))

    types = [e["type"] for e in log]
    assert next(e for e in log if e["type"] == "transport")["name"] == transport
    if transport == "ws":
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

    check_barge_in(log, marks["barge_in_speech"], transport)
    # client-side truth: the page measured mouth-to-ear (its own clock, from the capture time of
    # the user's last speech sample to the first reply sample played), and it cannot be shorter
    # than the server's voice-to-voice figure for the same turn
    heard = {e["turn"]: e["ms"] for e in log if e["type"] == "heard_latency"}
    server = {e["turn"]: e["voice_to_voice_ms"] for e in latencies}
    assert 0 in heard and 0 in server, (heard, server)
    # the figure (not asserted): what the way to the ear adds, per turn; over WebRTC mostly the
    # page's jitter buffer, which a barge-in's flush must leave as short as it was
    report_figure("page_over_server", transport=transport,
                  ms_by_turn={t: round(heard[t] - server[t]) for t in sorted(heard) if t in server})
    assert heard[0] >= server[0], f"mouth-to-ear {heard[0]:.0f} ms < server voice-to-voice {server[0]:.0f} ms"
    assert any(e["type"] == "pong" for e in log), "no clock-offset probe answered"

    # the server's trace of that session holds the page's playout marks (on the server clock,
    # from the ping/pong offset) and the page's mouth-to-ear figures
    from agent.tracing.export import load_events

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


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed (scripts/setup.sh installs it)")
def test_a_busy_main_thread_does_not_hold_up_the_barge_in(conversation_wav, recognizer, request):
    """Over the WebSocket the mic's frames and the server's `clear` bypass the page's main thread
    (the socket is a worker's): with the main thread held busy through the barge-in, the bot is
    still stopped while it is held, and nothing of the interrupted reply plays after."""
    if recognizer:
        pytest.skip("one run is enough: the remote recognizer is the conversation test's")
    wav, marks = conversation_wav
    speech = marks["barge_in_speech"]
    log = run_page(request.getfixturevalue("server"), wav, marks["tail"][1], "ws", block_main=(speech - 0.2, 4.0))
    blocked = next(e for e in log if e["type"] == "main_blocked")
    cleared = check_barge_in(log, speech, "ws, main thread busy")
    assert blocked["from"] <= cleared["page_ms"] < blocked["to"], (
        f"the player was cleared {cleared['page_ms'] - blocked['to']:.0f} ms after the main thread was free again")
