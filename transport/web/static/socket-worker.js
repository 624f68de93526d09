// The page's WebSocket, owned by a worker: mic frames go from the mic worklet to the socket,
// and reply audio and `clear` from the socket to the player worklet, without waiting behind the
// main thread (layout, the transcript, the latency table; on a loaded machine that wait was
// what made a barge-in late). The main thread gets every event, stamped with when it happened
// here, on the page's clock.
//
// From the page: {type: "open", url, page_origin}, {type: "mic", port}, {type: "player", port},
// {type: "send", text}, {type: "ping"}.
// To the page: {type: "open"}, {type: "error"}, {type: "closed"}, {type: "event", m, t} (the
// server's JSON; an endpoint gets `speech_end_page_ms`, when the user's last sample of speech
// was captured, on the page's clock), {type: "audio", id, samples, t}, {type: "player", m, t}
// (the player's events).
"use strict";
let ws, player, offset = 0;
// when each 20 ms mic frame was sent, by frame index: the page maps the server's stream time of
// an end of speech back to when the user stopped talking
const FRAME_RING = 3000, frameTimes = new Float64Array(FRAME_RING);
let framesSent = 0;
const now = () => performance.now() + offset;  // the page's clock
const isOpen = () => ws && ws.readyState === 1;

function open(url) {
  ws = new WebSocket(url);
  ws.binaryType = "arraybuffer";
  ws.onopen = () => postMessage({ type: "open" });
  ws.onerror = () => postMessage({ type: "error" });
  ws.onclose = () => postMessage({ type: "closed" });
  ws.onmessage = (e) => {
    const t = now();
    if (typeof e.data !== "string") {
      const id = new DataView(e.data).getUint32(0);
      const pcm = e.data.slice(4);
      const samples = pcm.byteLength / 2;
      if (player) player.postMessage({ type: "push", id, pcm }, [pcm]);
      postMessage({ type: "audio", id, samples, t });
      return;
    }
    let m;
    try { m = JSON.parse(e.data); } catch (_) { return; }  // the server sends JSON only
    if (m.type === "clear" && player) player.postMessage({ type: "clear" });
    if (m.type === "endpoint") {
      // frame k was sent when its last sample was captured; the end of speech lies inside it
      const k = Math.floor(m.speech_end_stream_s / 0.02);
      const intoFrameMs = (m.speech_end_stream_s - k * 0.02) * 1000;
      if (k < framesSent && framesSent - k <= FRAME_RING)
        m.speech_end_page_ms = frameTimes[k % FRAME_RING] - (20 - intoFrameMs);
    }
    postMessage({ type: "event", m, t });
  };
}

function send(text) { if (isOpen()) ws.send(text); }

onmessage = (e) => {
  const m = e.data;
  switch (m.type) {
    case "open": offset = performance.timeOrigin - m.page_origin; open(m.url); break;
    case "send": send(m.text); break;
    case "ping": send(JSON.stringify({ type: "ping", t: now() })); break;
    case "mic":
      m.port.onmessage = (f) => {
        if (f.data.type !== "frame" || !isOpen()) return;
        frameTimes[framesSent % FRAME_RING] = now();
        framesSent++;
        ws.send(f.data.pcm);
      };
      break;
    case "player":
      player = m.port;
      player.onmessage = (p) => postMessage({ type: "player", m: p.data, t: now() });
      break;
  }
};
