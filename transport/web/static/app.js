// duplex page. Two transports, the same JSON events:
//  - WebRTC (default): the mic as an Opus track, the reply as an Opus track played by an <audio>
//    element (the output every browser's echo canceller covers; Web Audio output not always),
//    events on a data channel;
//  - WebSocket (?transport=ws, and when WebRTC fails): mic worklet -> PCM frames -> server;
//    server PCM -> flushable player worklet. The socket is a worker's (socket-worker.js), so
//    neither the mic's frames nor a `clear` wait on this thread.
// window.duplexLog records every event, for people reading the console and for tests.
"use strict";
const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const LOG_MAX = 5000;  // window.duplexLog keeps the most recent events only (sessions last hours)
const log = (window.duplexLog = []);
let socket, wsOpen = false, micCtx, playCtx, player, clockOffset = 0, bestRtt = Infinity;
let pc, dc, replyAudio, replyStream;  // WebRTC
let transportName = "";
const pendingPlays = new Map();  // WebRTC: chunk id -> timer of its estimated playout start
let playoutDelayMs = 60;         // WebRTC: jitter buffer delay, from getStats (a start value)
const turns = {};          // turn -> {speechEnd (server ms), heard (ms)}
let currentTurn = -1, botLine = null;
let micLatencyMs = 0, outLatencyMs = 0;  // device latencies the browser reports, when it does

// `at`: when it happened, on the page clock (the socket worker's stamp), if not now
function record(ev, at) {
  ev.page_ms = at === undefined ? performance.now() : at;
  log.push(ev);
  if (log.length > LOG_MAX) log.splice(0, log.length - LOG_MAX);
}
function line(cls, text) { const p = document.createElement("p"); p.className = cls; p.textContent = text; $("log").appendChild(p); return p; }

// a server started with --auth-token is opened as /?token=TOKEN: pass the token on
const token = params.get("token");
const tokenQuery = token ? "?token=" + encodeURIComponent(token) : "";

function canSend() { return transportName === "webrtc" ? dc && dc.readyState === "open" : wsOpen; }
function sendJSON(obj) {
  if (!canSend()) return;
  if (transportName === "webrtc") dc.send(JSON.stringify(obj));
  else socket.postMessage({ type: "send", text: JSON.stringify(obj) });
}
function showTransport(name, why) {
  transportName = name;
  $("transport").textContent = name === "webrtc" ? "WebRTC (Opus)" : "WebSocket (PCM)";
  record({ type: "transport", name, why });
}
function closed(reason) {
  $("state").textContent = "disconnected" + (reason ? ": " + reason : "");
  record({ type: "closed", reason });
}
function refusedText(why) {
  $("state").textContent = why ? "the agent cannot talk now: " + why.replace(/^not ready: /, "") : "could not connect";
  record({ type: "refused", reason: why });
  $("start").disabled = false;
}

async function start() {
  $("start").disabled = true;
  if (params.get("transport") !== "ws" && window.RTCPeerConnection) {
    try {
      await startWebRTC();
      return;
    } catch (e) {
      closeWebRTC();
      if (e.refused) { refusedText(e.message); return; }  // full or not allowed: so would /ws be
      record({ type: "webrtc_failed", reason: String(e.message || e) });
      return startWebSocket("WebRTC failed: " + (e.message || e));
    }
  }
  return startWebSocket(params.get("transport") === "ws" ? "?transport=ws" : "no WebRTC in this browser");
}

async function startWebSocket(why) {
  const url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws" + tokenQuery;
  socket = new Worker("/static/socket-worker.js");
  try {
    await new Promise((ok, bad) => {
      socket.onmessage = (e) => (e.data.type === "open" ? ok() : bad());
      socket.onerror = bad;
      socket.postMessage({ type: "open", url, page_origin: performance.timeOrigin });
    });
  } catch (e) {
    socket.terminate();
    // a browser hides why an upgrade was refused; /readyz says it (full, busy, draining)
    const why = await fetch("/readyz").then((r) => (r.ok ? "" : r.text())).catch(() => "");
    refusedText(why);
    return;
  }
  wsOpen = true;
  showTransport("ws", why);
  socket.onmessage = onSocket;
  const ready = new Promise((ok) => (window._ready = ok));
  sendJSON({ type: "hello", sample_rate: 16000 });
  const info = await ready;

  // Playback first, so the first reply can never arrive before the player exists.
  playCtx = new AudioContext({ sampleRate: info.sample_rate, latencyHint: "interactive" });
  await playCtx.audioWorklet.addModule("/static/player-worklet.js");
  player = new AudioWorkletNode(playCtx, "player", { outputChannelCount: [1] });
  player.connect(playCtx.destination);
  givePort(player, "player");

  // Mic: wait until the worklet renders before asking for the microphone.
  micCtx = new AudioContext({ sampleRate: 16000, latencyHint: "interactive" });
  await micCtx.audioWorklet.addModule("/static/mic-worklet.js");
  const mic = new AudioWorkletNode(micCtx, "mic");
  const mute = micCtx.createGain(); mute.gain.value = 0;
  mic.connect(mute).connect(micCtx.destination);
  const rendering = new Promise((ok) => { mic.port.onmessage = (e) => { if (e.data.type === "rendering") ok(); }; });
  givePort(mic, "mic");
  await rendering;
  record({ type: "worklet_rendering" });
  const processing = params.get("aec") !== "0";
  const stream = await navigator.mediaDevices.getUserMedia({ audio: {
    channelCount: 1, echoCancellation: processing, noiseSuppression: processing, autoGainControl: processing } });
  record({ type: "mic_started" });
  micLatencyMs = 1000 * (stream.getAudioTracks()[0].getSettings().latency || 0);
  outLatencyMs = 1000 * ((playCtx.outputLatency || 0) + (playCtx.baseLatency || 0));
  micCtx.createMediaStreamSource(stream).connect(mic);
  await playCtx.resume(); await micCtx.resume();
  setInterval(ping, 2000); ping();
  $("state").textContent = "listening";
}

// The STUN/TURN servers the server was started with (--ice-server), TURN credentials included
// (minted for this call when it has --turn-secret); an empty list on a LAN or the same host.
async function iceConfig() {
  const r = await fetch("/webrtc/config" + tokenQuery, { cache: "no-store" });
  if (!r.ok) {
    const err = new Error((await r.text()).trim() || "no WebRTC config: HTTP " + r.status);
    err.refused = [401, 403].includes(r.status);  // so would the offer and /ws be
    throw err;
  }
  const servers = (await r.json()).iceServers || [];
  record({ type: "ice_servers", urls: servers.flatMap((s) => s.urls) });  // not the credentials
  return servers;
}

// WebRTC: the mic track goes out, the reply track plays in an <audio> element, events go on a
// data channel. Throws (the caller falls back to the WebSocket) unless it is up within 10 s.
async function startWebRTC() {
  const iceServers = await iceConfig();  // before the mic: a refused page asks for no microphone
  const processing = params.get("aec") !== "0";
  const stream = await navigator.mediaDevices.getUserMedia({ audio: {
    channelCount: 1, echoCancellation: processing, noiseSuppression: processing, autoGainControl: processing } });
  record({ type: "mic_started" });
  micLatencyMs = 1000 * (stream.getAudioTracks()[0].getSettings().latency || 0);
  // ?ice=relay: TURN relay candidates only (to check a TURN server)
  pc = new RTCPeerConnection({ iceServers, iceTransportPolicy: params.get("ice") === "relay" ? "relay" : "all" });
  dc = pc.createDataChannel("events");
  for (const track of stream.getAudioTracks()) pc.addTrack(track, stream);
  replyAudio = $("reply");
  pc.ontrack = (e) => {
    replyStream = e.streams[0] || new MediaStream([e.track]);
    replyAudio.srcObject = replyStream;
    replyAudio.play().catch((err) => record({ type: "autoplay_blocked", reason: String(err) }));
  };
  pc.onconnectionstatechange = () => {
    record({ type: "webrtc_state", state: pc.connectionState });
    if (pc.connectionState === "failed" || pc.connectionState === "closed") $("state").textContent = "disconnected";
  };
  await pc.setLocalDescription(await pc.createOffer());
  await new Promise((ok) => {  // no trickle ICE: the offer carries our candidates
    if (pc.iceGatheringState === "complete") return ok();
    const t = setTimeout(ok, 3000);
    pc.onicegatheringstatechange = () => { if (pc.iceGatheringState === "complete") { clearTimeout(t); ok(); } };
  });
  const r = await fetch("/webrtc/offer" + tokenQuery, { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ sdp: pc.localDescription.sdp, type: "offer" }) });
  if (!r.ok) {
    const body = await r.text();
    let why = body; try { why = JSON.parse(body).error || body; } catch (_) { /* plain text */ }
    const err = new Error(why);
    err.refused = [401, 403, 503].includes(r.status);
    throw err;
  }
  await pc.setRemoteDescription(await r.json());
  await new Promise((ok, bad) => {
    const t = setTimeout(() => bad(new Error("no WebRTC connection within 10 s")), 10000);
    dc.onopen = () => { clearTimeout(t); ok(); };
    pc.addEventListener("connectionstatechange", () => {
      if (pc.connectionState === "failed") { clearTimeout(t); bad(new Error("ICE failed")); }
    });
  });
  showTransport("webrtc", params.get("transport") === "webrtc" ? "?transport=webrtc" : "default");
  dc.onmessage = (e) => onEvent(JSON.parse(e.data), performance.now());
  dc.onclose = () => closed();
  const ready = new Promise((ok) => (window._ready = ok));
  dc.send(JSON.stringify({ type: "hello", played_marks: "page" }));  // we report what plays
  await ready;
  setInterval(ping, 2000); ping();
  setInterval(measurePlayoutDelay, 1000);
  $("state").textContent = "listening";
}

function closeWebRTC() {
  if (pc) {
    for (const sender of pc.getSenders()) if (sender.track) sender.track.stop();  // the mic, too
    pc.close();
  }
  pc = dc = undefined;
}

// How long a frame waits in the receiver before it plays: the jitter buffer's recent average
// (getStats), plus half the round trip. Played marks are the server's RTP handoff time plus this.
let lastJitter = null, loggedJitterMs = null;
async function measurePlayoutDelay() {
  if (!pc) return;
  const stats = await pc.getStats();
  stats.forEach((s) => {
    if (s.type !== "inbound-rtp" || s.kind !== "audio" || !s.jitterBufferEmittedCount) return;
    if (lastJitter && s.jitterBufferEmittedCount > lastJitter.n) {
      const jb = (s.jitterBufferDelay - lastJitter.d) / (s.jitterBufferEmittedCount - lastJitter.n);
      playoutDelayMs = 1000 * jb + (isFinite(bestRtt) ? bestRtt / 2 : 0);
      // logged when it moves by 5 ms or more: what NetEq adds to mouth-to-ear (not the server)
      const ms = Math.round(1000 * jb);
      if (loggedJitterMs === null || Math.abs(ms - loggedJitterMs) >= 5) record({ type: "jitter_buffer", ms: (loggedJitterMs = ms) });
    }
    lastJitter = { d: s.jitterBufferDelay, n: s.jitterBufferEmittedCount };
  });
}

// a reply piece handed to RTP on the server ({type: "audio", id, event, server_ms}): its
// estimated playout on the page clock, reported back as a played mark when that time comes
function scheduleStarted(m) {
  if (m.event !== "start") return;
  const at = m.server_ms - clockOffset + playoutDelayMs;
  pendingPlays.set(m.id, setTimeout(() => { pendingPlays.delete(m.id); started(m.id, at); },
                                    Math.max(0, at - performance.now())));
}

// barge-in over WebRTC: the server has stopped feeding the track; what the element and its
// jitter buffer still hold plays out muted. Muted, not paused or detached: the element goes on
// pulling from its jitter buffer, which stays as short as it was (a detached element's fills
// up, and the next reply is heard ~80 ms late until NetEq catches up, seconds later).
let unmuteTimer;
function flushReplyAudio() {
  for (const t of pendingPlays.values()) clearTimeout(t);
  pendingPlays.clear();
  if (replyAudio) {
    replyAudio.muted = true;
    clearTimeout(unmuteTimer);
    unmuteTimer = setTimeout(() => { replyAudio.muted = false; }, playoutDelayMs + 60);
  }
  record({ type: "player_cleared" });
}

// a worklet and the socket worker talk on a channel of their own
function givePort(node, name) {
  const ch = new MessageChannel();
  node.port.postMessage({ type: "port", port: ch.port1 }, [ch.port1]);
  socket.postMessage({ type: name, port: ch.port2 }, [ch.port2]);
}

// WebSocket: what the socket worker says, each with its own time; it is told what was handled
// (it holds at most a window of messages this thread has not got to)
let unacked = 0;
function onSocket(e) {
  const w = e.data;
  if (w.type === "event") onEvent(w.m, w.t);
  else if (w.type === "audio") record({ type: "audio", id: w.id, samples: w.samples }, w.t);
  else if (w.type === "player") onPlayer(w.m, w.t, true);
  else if (w.type === "lost") record({ type: "worker_messages_lost", n: w.n });
  else if (w.type === "closed") { wsOpen = false; closed(w.reason); }
  if (++unacked >= 16) { socket.postMessage({ type: "seen", n: unacked }); unacked = 0; }
}

function ping() {
  if (transportName === "webrtc") sendJSON({ type: "ping", t: performance.now() });
  else if (wsOpen) socket.postMessage({ type: "ping" });  // stamped as it leaves
}

// `reported`: the socket worker has told the server already
function started(id, now, reported = false) {
  record({ type: "player_started", id });
  if (!reported) sendJSON({ type: "played", id, event: "start", t: now, server_ms: now + clockOffset });
  const t = turns[currentTurn];
  if (t && t.heard === undefined && t.captureEnd !== undefined) {
    t.heard = now + outLatencyMs - t.captureEnd;  // mouth to ear, all on the page clock
    record({ type: "heard_latency", turn: currentTurn, ms: t.heard });
    sendJSON({ type: "metrics", turn: currentTurn, mouth_to_ear_ms: t.heard });
    renderLatency(currentTurn);
  }
}

function onPlayer(m, at, reported) {
  if (m.type === "started") started(m.id, at, reported);
  else record({ type: "player_" + m.type, id: m.id }, at);
}

// a server event (JSON), `at` when it arrived
function onEvent(m, at) {
  record(m, at);
  switch (m.type) {
    case "ready": window._ready(m); break;
    case "audio": if (transportName === "webrtc") scheduleStarted(m); break;
    case "pong": {
      const rtt = at - m.t;
      if (rtt <= bestRtt) { bestRtt = rtt; clockOffset = m.server_ms - (m.t + at) / 2; }
      break;
    }
    case "state": $("state").textContent = m.state.replace("_", " "); break;
    case "partial": $("partial").textContent = m.text; break;
    case "endpoint": {
      currentTurn = m.turn;
      delete turns[m.turn - 50];  // keep the last 50 turns' figures
      const old = document.getElementById("lat" + (m.turn - 50));
      if (old) old.remove();
      // WebSocket: the socket worker mapped the end of speech to when it was captured
      let captureEnd = m.speech_end_page_ms !== undefined ? m.speech_end_page_ms - micLatencyMs : undefined;
      // WebRTC: no frame of ours maps to the server's stream time (packets are lost, and the
      // server's jitter buffer drops and stretches), so the end of speech is the server's
      // clock reading of it, on our clock, less half a round trip. What it leaves out is the
      // uplink's Opus and jitter buffer time (tens of ms): a figure a little short, not long.
      if (transportName === "webrtc")
        captureEnd = m.speech_end_ms - clockOffset - (isFinite(bestRtt) ? bestRtt / 2 : 0) - micLatencyMs;
      turns[m.turn] = { speechEnd: m.speech_end_ms, captureEnd };
      break;
    }
    case "final": $("partial").textContent = ""; if (m.text) line("user", "You: " + m.text); botLine = null; break;
    case "bot_text":
      if (!botLine) botLine = line("bot", "Agent: ");
      botLine.textContent += m.text; break;
    case "clear": if (transportName === "webrtc") flushReplyAudio(); break;  // the socket worker cleared the player
    case "interrupted": line("bot", "(interrupted; heard: " + (m.heard || "nothing") + ")"); botLine = null; break;
    case "latency": turns[m.turn] = Object.assign(turns[m.turn] || {}, { server: m }); renderLatency(m.turn); break;
    case "error": line("err", "error: " + m.message + (m.fatal ? " (the conversation has ended)" : "")); break;
  }
}

function renderLatency(turn) {
  const t = turns[turn]; if (!t) return;
  const s = t.server || {};
  let row = document.getElementById("lat" + turn);
  if (!row) { row = document.createElement("tr"); row.id = "lat" + turn; $("lat").tBodies[0].appendChild(row); }
  const f = (v) => (v === undefined || v === null ? "" : Math.round(v) + " ms");
  const parts = [["endpoint_ms", "#bbb"], ["asr_final_ms", "#7b7"], ["llm_ttft_ms", "#77d"], ["tts_first_chunk_ms", "#d97"]];
  const bars = parts.map(([k, c]) => `<span class="bar" style="width:${Math.max(0, (s[k] || 0) / 10)}px;background:${c}" title="${k}"></span>`).join("");
  row.innerHTML = `<td>${turn}</td><td>${f(s.endpoint_ms)}</td><td>${f(s.asr_final_ms)}</td><td>${f(s.llm_ttft_ms)}</td>` +
    `<td>${f(s.tts_first_chunk_ms)}</td><td>${f(s.voice_to_voice_ms)}</td><td>${f(t.heard)}</td><td style="text-align:left">${bars}</td>`;
}

$("start").onclick = start;
if (params.get("autostart") === "1") start();
