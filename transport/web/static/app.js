// duplex page: mic worklet -> WebSocket -> server; server audio -> flushable player worklet.
// window.duplexLog records every event, for people reading the console and for tests.
"use strict";
const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const LOG_MAX = 5000;  // window.duplexLog keeps the most recent events only (sessions last hours)
const log = (window.duplexLog = []);
let ws, micCtx, playCtx, player, clockOffset = 0, bestRtt = Infinity;
const turns = {};          // turn -> {speechEnd (server ms), heard (ms)}
let currentTurn = -1, botLine = null;
// capture time (page clock) of each 20 ms mic frame sent, by frame index: maps the server's
// stream time of the end of speech back to when the user actually stopped talking
const FRAME_RING = 3000, frameTimes = new Float64Array(FRAME_RING);
let framesSent = 0;
let micLatencyMs = 0, outLatencyMs = 0;  // device latencies the browser reports, when it does

function record(ev) {
  ev.page_ms = performance.now();
  log.push(ev);
  if (log.length > LOG_MAX) log.splice(0, log.length - LOG_MAX);
}
function line(cls, text) { const p = document.createElement("p"); p.className = cls; p.textContent = text; $("log").appendChild(p); return p; }

async function start() {
  $("start").disabled = true;
  // a server started with --auth-token is opened as /?token=TOKEN: pass the token on to /ws
  const token = new URLSearchParams(location.search).get("token");
  const url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws" +
    (token ? "?token=" + encodeURIComponent(token) : "");
  ws = new WebSocket(url);
  ws.binaryType = "arraybuffer";
  try {
    await new Promise((ok, bad) => { ws.onopen = ok; ws.onerror = bad; });
  } catch (e) {
    // a browser hides why an upgrade was refused; /readyz says it (full, busy, draining)
    const why = await fetch("/readyz").then((r) => (r.ok ? "" : r.text())).catch(() => "");
    $("state").textContent = why ? "the agent cannot talk now: " + why.replace(/^not ready: /, "")
                                 : "could not connect";
    record({ type: "refused", reason: why });
    $("start").disabled = false;
    return;
  }
  ws.onmessage = onMessage;
  ws.onclose = () => { $("state").textContent = "disconnected"; record({ type: "closed" }); };
  const ready = new Promise((ok) => (window._ready = ok));
  ws.send(JSON.stringify({ type: "hello", sample_rate: 16000 }));
  const info = await ready;

  // Playback first, so the first reply can never arrive before the player exists.
  playCtx = new AudioContext({ sampleRate: info.sample_rate, latencyHint: "interactive" });
  await playCtx.audioWorklet.addModule("/static/player-worklet.js");
  player = new AudioWorkletNode(playCtx, "player", { outputChannelCount: [1] });
  player.connect(playCtx.destination);
  player.port.onmessage = onPlayer;

  // Mic: wait until the worklet renders before asking for the microphone.
  micCtx = new AudioContext({ sampleRate: 16000, latencyHint: "interactive" });
  await micCtx.audioWorklet.addModule("/static/mic-worklet.js");
  const mic = new AudioWorkletNode(micCtx, "mic");
  const mute = micCtx.createGain(); mute.gain.value = 0;
  mic.connect(mute).connect(micCtx.destination);
  await new Promise((ok) => { mic.port.onmessage = (e) => { if (e.data.type === "rendering") ok(); }; });
  record({ type: "worklet_rendering" });
  const processing = params.get("aec") !== "0";
  const stream = await navigator.mediaDevices.getUserMedia({ audio: {
    channelCount: 1, echoCancellation: processing, noiseSuppression: processing, autoGainControl: processing } });
  record({ type: "mic_started" });
  micLatencyMs = 1000 * (stream.getAudioTracks()[0].getSettings().latency || 0);
  outLatencyMs = 1000 * ((playCtx.outputLatency || 0) + (playCtx.baseLatency || 0));
  mic.port.onmessage = (e) => {
    if (e.data.type === "frame" && ws.readyState === 1) {
      frameTimes[framesSent % FRAME_RING] = performance.now();
      framesSent++;
      ws.send(e.data.pcm);
    }
  };
  micCtx.createMediaStreamSource(stream).connect(mic);
  await playCtx.resume(); await micCtx.resume();
  setInterval(ping, 2000); ping();
  $("state").textContent = "listening";
}

function ping() { if (ws.readyState === 1) ws.send(JSON.stringify({ type: "ping", t: performance.now() })); }

function onPlayer(e) {
  const m = e.data;
  record({ type: "player_" + m.type, id: m.id });
  if (m.type === "started") {
    const now = performance.now();
    ws.send(JSON.stringify({ type: "played", id: m.id, event: "start", t: now, server_ms: now + clockOffset }));
    const t = turns[currentTurn];
    if (t && t.heard === undefined && t.captureEnd !== undefined) {
      t.heard = now + outLatencyMs - t.captureEnd;  // mouth to ear, all on the page clock
      record({ type: "heard_latency", turn: currentTurn, ms: t.heard });
      ws.send(JSON.stringify({ type: "metrics", turn: currentTurn, mouth_to_ear_ms: t.heard }));
      renderLatency(currentTurn);
    }
  }
}

function onMessage(e) {
  if (typeof e.data !== "string") {
    const view = new DataView(e.data);
    const id = view.getUint32(0);
    const pcm = e.data.slice(4);
    record({ type: "audio", id, samples: pcm.byteLength / 2 });
    if (player) player.port.postMessage({ type: "push", id, pcm }, [pcm]);
    return;
  }
  const m = JSON.parse(e.data);
  record(m);
  switch (m.type) {
    case "ready": window._ready(m); break;
    case "pong": {
      const now = performance.now(), rtt = now - m.t;
      if (rtt <= bestRtt) { bestRtt = rtt; clockOffset = m.server_ms - (m.t + now) / 2; }
      break;
    }
    case "state": $("state").textContent = m.state.replace("_", " "); break;
    case "partial": $("partial").textContent = m.text; break;
    case "endpoint": {
      currentTurn = m.turn;
      delete turns[m.turn - 50];  // keep the last 50 turns' figures
      const old = document.getElementById("lat" + (m.turn - 50));
      if (old) old.remove();
      // frame k was posted when its last sample was captured; the end of speech lies inside it
      const k = Math.floor(m.speech_end_stream_s / 0.02);
      const intoFrameMs = (m.speech_end_stream_s - k * 0.02) * 1000;
      const captureEnd = k < framesSent && framesSent - k <= FRAME_RING
        ? frameTimes[k % FRAME_RING] - (20 - intoFrameMs) - micLatencyMs : undefined;
      turns[m.turn] = { speechEnd: m.speech_end_ms, captureEnd };
      break;
    }
    case "final": $("partial").textContent = ""; if (m.text) line("user", "You: " + m.text); botLine = null; break;
    case "bot_text":
      if (!botLine) botLine = line("bot", "Agent: ");
      botLine.textContent += m.text; break;
    case "clear": if (player) player.port.postMessage({ type: "clear" }); break;
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
