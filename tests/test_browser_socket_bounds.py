"""The page's socket worker (transport/web/static/socket-worker.js) holds bounded queues both ways,
in headless Chromium against a WebSocket peer on 127.0.0.1:

- to the server: a peer that stops reading gets the socket closed, with the reason, once the
  worker's send buffer passes its cap; the buffer never grows past it;
- to the page: a main thread held busy while the server sends thousands of events gets at most
  a window of them queued, then the newest ones and a count of those dropped, in order.

The page here is a test page that loads the real worker and speaks its messages as app.js
does; no duplex server runs (the worker does not care who speaks JSON to it).
"""
from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import shutil
import socket
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
STATIC = Path(__file__).resolve().parents[1] / "transport" / "web" / "static"

PAGE = """<!doctype html><script>
window.got = []; window.ready = false;
const w = new Worker("/socket-worker.js");
let unacked = 0;
w.onmessage = (e) => {
  window.got.push(e.data);
  if (e.data.type === "open") window.ready = true;
  unacked++;
  if (window.ack && unacked >= 16) window.dispatchAck();
};
window.dispatchAck = () => { w.postMessage({ type: "seen", n: unacked }); unacked = 0; };
window.ack = true;
window.start = (url) => w.postMessage({ type: "open", url, page_origin: performance.timeOrigin });
window.micPort = () => { const ch = new MessageChannel(); w.postMessage({ type: "mic", port: ch.port2 }, [ch.port2]); return ch.port1; };
// a player port: the worker hands it reply audio directly, past the page's queue
window.pushed = 0;
window.playerPort = () => {
  const ch = new MessageChannel();
  ch.port1.onmessage = (e) => { if (e.data.type === "push") window.pushed++; };
  w.postMessage({ type: "player", port: ch.port2 }, [ch.port2]);
};
</script>"""


@contextlib.contextmanager
def static_site(tmp_path: Path):
    (tmp_path / "index.html").write_text(PAGE)
    shutil.copy(STATIC / "socket-worker.js", tmp_path / "socket-worker.js")
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path), **k)  # noqa: E731
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


@contextlib.contextmanager
def ws_peer(handler, rcvbuf: int | None = None):
    """A websockets server on 127.0.0.1 in a thread of its own; `rcvbuf`: the kernel's receive
    buffer for its connections, small, so a peer that stops reading soon stops the sender."""
    from websockets.asyncio.server import serve

    loop = asyncio.new_event_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # inherited by accepted sockets
    sock.bind(("127.0.0.1", 0))
    started, stop = threading.Event(), asyncio.Event()

    async def main():
        async with serve(handler, sock=sock, max_queue=1, max_size=None):
            started.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield f"ws://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)


def open_page(pw, site: str, url: str):
    browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                 args=["--no-sandbox", "--disable-gpu", "--no-first-run"])
    page = browser.new_page()
    page.goto(site + "/")
    page.evaluate("(url) => window.start(url)", url)
    page.wait_for_function("window.ready", timeout=10_000)
    return browser, page


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium")
def test_a_peer_that_stops_reading_gets_the_socket_closed_with_the_reason(tmp_path):
    from playwright.sync_api import sync_playwright

    async def never_reads(ws):
        await asyncio.sleep(120)  # max_queue=1: the library stops reading too, then the kernel

    with static_site(tmp_path) as site, ws_peer(never_reads, rcvbuf=4096) as url, sync_playwright() as pw:
        browser, page = open_page(pw, site, url)
        # mic frames as the mic worklet sends them (640 bytes, 20 ms of 16 kHz PCM), faster than
        # real time; the peer reads none and answers none of the worker's pings
        sent = page.evaluate("""async () => {
          const port = window.micPort();
          for (let i = 0; i < 16000; i++) {
            port.postMessage({ type: "frame", pcm: new Int16Array(320).buffer });
            if (i % 50 === 49) await new Promise((r) => setTimeout(r, 5));
            if (window.got.some((m) => m.type === "closed")) return i + 1;
          }
          return -1;
        }""")
        page.wait_for_function("window.got.some(m => m.type === 'closed')", timeout=30_000)
        closed = next(m for m in page.evaluate("window.got") if m["type"] == "closed")
        browser.close()
    assert closed["reason"] == "the connection is not keeping up with the microphone"
    # closed once the cap (256 KiB, ~8 s of audio) unread was passed, not before and not after:
    # the worker's own count (the page's loop may run ahead of the worker on a busy machine)
    cap = 256 * 1024
    assert cap < closed["sent"] <= cap + 640, closed
    assert sent == -1 or sent > cap // 640, sent


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium")
def test_a_busy_page_gets_a_window_of_messages_then_the_newest_and_a_count_of_the_lost(tmp_path):
    from playwright.sync_api import sync_playwright

    n = 6000
    go, sent = threading.Event(), threading.Event()

    async def floods(ws):
        await asyncio.get_running_loop().run_in_executor(None, go.wait, 30)
        for i in range(n):
            await ws.send(json.dumps({"type": "partial", "seq": i}))
        # then one piece of reply audio: the worker passes it to the player at once, past the
        # page's queue, so once the player has it every event before it has reached the worker
        await ws.send(b"\0\0\0\1" + bytes(640))
        sent.set()
        await asyncio.sleep(30)

    with static_site(tmp_path) as site, ws_peer(floods) as url, sync_playwright() as pw:
        browser, page = open_page(pw, site, url)
        # a page that has not got to the worker's messages: it acknowledges none
        page.evaluate("window.ack = false; window.got = []; window.playerPort();")
        go.set()
        assert sent.wait(30)
        page.wait_for_function("window.pushed === 1", timeout=30_000)  # all of them are in the worker
        held = page.evaluate("window.got.length")
        page.evaluate("""() => { window.ack = true; window.dispatchAck(); }""")
        page.wait_for_function(f"window.got.some(m => m.type === 'event' && m.m.seq === {n - 1})", timeout=30_000)
        got = page.evaluate("window.got")
        browser.close()
    assert held == 256, held  # the worker's window, then it waits for the page
    seqs = [m["m"]["seq"] for m in got if m["type"] == "event"]
    lost = [m["n"] for m in got if m["type"] == "lost"]
    assert seqs == sorted(seqs) and seqs[-1] == n - 1  # in order; the newest arrive
    assert len(seqs) + sum(lost) == n, (len(seqs), lost)  # what was dropped is counted
    assert lost and len(seqs) <= 256 + 2048 + 16, (len(seqs), lost)  # the window, the backlog, one ack
