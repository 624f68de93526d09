// The page's WebSocket, owned by a worker: mic frames go from the mic worklet to the socket,
// reply audio and `clear` from the socket to the player worklet, and the player's played marks
// back to the server, without waiting behind the main thread (layout, the transcript, the
// latency table; on a loaded CPU that wait makes a barge-in late, and the server's count of
// what was heard wrong). The main thread gets every event, stamped with when it
// happened here, on the page's clock.
//
// From the page: {type: "open", url, page_origin}, {type: "mic", port}, {type: "player", port},
// {type: "send", text}, {type: "ping"}, {type: "seen", n} (it handled n more messages).
// To the page: {type: "open"}, {type: "error"}, {type: "closed", reason, sent?}, {type: "event", m, t}
// (the server's JSON; an endpoint gets `speech_end_page_ms`, when the user's last sample of
// speech was captured, on the page's clock), {type: "audio", id, samples, t}, {type: "player",
// m, t} (the player's events; a start has been reported to the server), {type: "lost", n} (a
// page held busy so long that its oldest n messages were dropped).
"use strict";
let ws, player, offset = 0;
const now = () => performance.now() + offset;  // the page's clock
const isOpen = () => ws && ws.readyState === 1;

// when each 20 ms mic frame was sent, by frame index: the page maps the server's stream time of
// an end of speech back to when the user stopped talking
const FRAME_RING = 3000, frameTimes = new Float64Array(FRAME_RING);
let framesSent = 0;

// the server's clock, from the pong with the shortest round trip: played marks carry it
let bestRtt = Infinity, serverOffset = 0;

// Bounded both ways. To the page: at most PAGE_WINDOW messages it has not handled yet, then a
// backlog that keeps the newest PAGE_BACKLOG (the page's own log keeps the newest too). To the
// server: mic audio is the server's stream clock and cannot be dropped, so a socket whose
// server has not read SEND_CAP_BYTES of it (~8 s of 16 kHz PCM) is closed, with the reason,
// rather than grown. What the server has read is counted by pings (the server reads in order,
// so a pong says every byte sent before its ping was read), not by bufferedAmount: Chromium 156
// hands frames on to its network process, which queues them without limit, and bufferedAmount
// can stay at one frame with tens of MB unread by the peer.
const PAGE_WINDOW = 256, PAGE_BACKLOG = 2048, SEND_CAP_BYTES = 256 * 1024;
const PROBE_FRAMES = 25, PROBES_HELD = 64;  // a ping every 0.5 s of audio; pings awaiting pongs
let unseen = 0, lost = 0, closeReason = "";
let bytesSent = 0, bytesRead = 0;
const probes = [];  // [t, bytesSent] of each ping not answered yet, oldest first
const backlog = [];
function toPage(msg) {
  if (unseen < PAGE_WINDOW && backlog.length === 0) { unseen++; postMessage(msg); return; }
  backlog.push(msg);
  if (backlog.length > PAGE_BACKLOG) { backlog.shift(); lost++; }
}
function seen(n) {
  unseen = Math.max(0, unseen - n);
  if (lost && unseen < PAGE_WINDOW) { unseen++; postMessage({ type: "lost", n: lost }); lost = 0; }
  while (unseen < PAGE_WINDOW && backlog.length) { unseen++; postMessage(backlog.shift()); }
}

function open(url) {
  ws = new WebSocket(url);
  ws.binaryType = "arraybuffer";
  ws.onopen = () => postMessage({ type: "open" });
  ws.onerror = () => postMessage({ type: "error" });
  ws.onclose = (e) => { if (!closeReason) toPage({ type: "closed", reason: e.reason }); };
  ws.onmessage = (e) => {
    const t = now();
    if (typeof e.data !== "string") {
      const id = new DataView(e.data).getUint32(0);
      const pcm = e.data.slice(4);
      const samples = pcm.byteLength / 2;
      if (player) player.postMessage({ type: "push", id, pcm }, [pcm]);
      toPage({ type: "audio", id, samples, t });
      return;
    }
    let m;
    try { m = JSON.parse(e.data); } catch (_) { return; }  // the server sends JSON only
    if (m.type === "clear" && player) player.postMessage({ type: "clear" });
    if (m.type === "pong") {
      const rtt = t - m.t;
      if (rtt <= bestRtt) { bestRtt = rtt; serverOffset = m.server_ms - (m.t + t) / 2; }
      while (probes.length && probes[0][0] <= m.t) bytesRead = probes.shift()[1];
    }
    if (m.type === "endpoint") {
      // frame k was sent when its last sample was captured; the end of speech lies inside it
      const k = Math.floor(m.speech_end_stream_s / 0.02);
      const intoFrameMs = (m.speech_end_stream_s - k * 0.02) * 1000;
      if (k < framesSent && framesSent - k <= FRAME_RING)
        m.speech_end_page_ms = frameTimes[k % FRAME_RING] - (20 - intoFrameMs);
    }
    toPage({ type: "event", m, t });
  };
}

function send(text) { if (isOpen()) ws.send(text); }

function ping() {
  if (!isOpen()) return;
  const t = now();
  probes.push([t, bytesSent]);
  if (probes.length > PROBES_HELD) probes.shift();  // a later pong still counts what came before
  ws.send(JSON.stringify({ type: "ping", t }));
}

function sendFrame(pcm) {
  if (!isOpen()) return;
  if (bytesSent - bytesRead > SEND_CAP_BYTES || ws.bufferedAmount > SEND_CAP_BYTES) {
    // told now: the close frame waits behind the rest, and its event may come much later
    closeReason = "the connection is not keeping up with the microphone";
    ws.close(4000, closeReason);
    toPage({ type: "closed", reason: closeReason, sent: bytesSent });
    return;
  }
  frameTimes[framesSent % FRAME_RING] = now();
  framesSent++;
  bytesSent += pcm.byteLength;
  ws.send(pcm);
  if (framesSent % PROBE_FRAMES === 0) ping();
}

onmessage = (e) => {
  const m = e.data;
  switch (m.type) {
    case "open": offset = performance.timeOrigin - m.page_origin; open(m.url); break;
    case "send": send(m.text); break;
    case "seen": seen(m.n); break;
    case "ping": ping(); break;
    case "mic": m.port.onmessage = (f) => { if (f.data.type === "frame") sendFrame(f.data.pcm); }; break;
    case "player":
      player = m.port;
      player.onmessage = (p) => {
        const t = now();
        if (p.data.type === "started")
          send(JSON.stringify({ type: "played", id: p.data.id, event: "start", t, server_ms: t + serverOffset }));
        toPage({ type: "player", m: p.data, t });
      };
      break;
  }
};
