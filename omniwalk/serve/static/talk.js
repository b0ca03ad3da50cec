// The talk page: a Realtime session over /v1/realtime from the browser, no build step.
//
// Microphone -> AudioWorklet (PCM16, 24 kHz, 100 ms chunks) -> input_audio_buffer.append.
// Hands-free: the server's VAD finds the turns (and barge-in: speech while the answer plays stops
// it, here and on the server); otherwise "Hold to talk" appends while held, then commits and asks.
// Answer audio deltas -> a player AudioWorklet, played as they arrive. Both transcripts are shown
// (the user's from the server's input audio transcription). window.talkStats is for tests.

const $ = (id) => document.getElementById(id);
const stats = (window.talkStats = {
  connected: false, sessionUpdated: false, speechStarted: 0, speechStopped: 0, responses: 0, responsesDone: 0,
  audioDeltas: 0, playedSamples: 0, nonZeroSamples: 0, userTranscripts: [], assistantTranscripts: [], errors: [],
});
let ws = null, ctx = null, player = null, micStream = null;
let sending = false, responding = null; // responding: {id, itemId, streamed, playedAtStart}
let played = 0, queued = 0;
const bubbles = new Map(); // item id -> element

function status(text) { $("status").textContent = text; }

function bubble(itemId, role) {
  let el = bubbles.get(itemId);
  if (!el) {
    el = document.createElement("div");
    el.className = `turn ${role} pending`;
    el.innerHTML = `<span class="who">${role === "user" ? "you" : "assistant"}</span><span class="text"></span>`;
    $("log").appendChild(el);
    bubbles.set(itemId, el);
    el.scrollIntoView({ block: "end" });
  }
  return el;
}

function setText(itemId, role, text, final) {
  const el = bubble(itemId, role);
  el.querySelector(".text").textContent = text;
  if (final) el.classList.remove("pending");
}

function send(event) {
  if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(event));
}

function toBase64(buffer) {
  const bytes = new Uint8Array(buffer);
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

function pcm16ToFloat(b64) {
  const raw = atob(b64);
  const out = new Float32Array(raw.length >> 1);
  for (let i = 0; i < out.length; i++) {
    let v = raw.charCodeAt(2 * i) | (raw.charCodeAt(2 * i + 1) << 8);
    out[i] = (v >= 0x8000 ? v - 0x10000 : v) / 32768;
  }
  return out;
}

function sessionConfig() {
  const handsFree = $("hands-free").checked;
  return {
    type: "realtime",
    output_modalities: ["audio"],
    audio: {
      input: { turn_detection: handsFree ? { type: "server_vad" } : null, transcription: { model: "omniwalk" } },
      output: { voice: $("voice").value },
    },
    ...(window.talkSessionExtras || {}), // (tests bound the answer: max_output_tokens, max_audio_frames)
  };
}

// Stop the answer playing here; tell the server how much of it was heard.
function stopPlayback(cancelOnServer) {
  if (cancelOnServer && responding && !responding.done) send({ type: "response.cancel" });
  if (responding && queued > 0) {
    const heardMs = Math.floor(((played - responding.playedAtStart) * 1000) / 24000);
    player.port.postMessage("clear");
    responding.truncateMs = heardMs;
    if (responding.done) truncate(responding);
  }
}

function truncate(r) {
  if (r.truncateMs === undefined || r.truncated) return;
  r.truncated = true;
  send({ type: "conversation.item.truncate", item_id: r.itemId, content_index: 0, audio_end_ms: Math.max(0, r.truncateMs) });
}

function onEvent(e) {
  switch (e.type) {
    case "session.created":
      send({ type: "session.update", session: sessionConfig() });
      break;
    case "session.updated":
      stats.sessionUpdated = true;
      status($("hands-free").checked ? "listening — just talk" : "hold the button to talk");
      break;
    case "input_audio_buffer.speech_started":
      stats.speechStarted++;
      stopPlayback(false); // the server cancels its answer itself (barge-in)
      bubble(e.item_id, "user");
      status("hearing you…");
      break;
    case "input_audio_buffer.speech_stopped":
      stats.speechStopped++;
      status("thinking…");
      break;
    case "conversation.item.added":
    case "conversation.item.created":
      if (e.item.role === "user") {
        const c = e.item.content[0] || {};
        const text = c.type === "input_text" ? c.text : "";
        setText(e.item.id, "user", text, Boolean(text));
      }
      break;
    case "conversation.item.input_audio_transcription.delta":
      bubble(e.item_id, "user").querySelector(".text").textContent += e.delta;
      break;
    case "conversation.item.input_audio_transcription.completed":
      setText(e.item_id, "user", e.transcript, true);
      stats.userTranscripts.push(e.transcript);
      break;
    case "conversation.item.input_audio_transcription.failed":
      setText(e.item_id, "user", "(no transcript)", true);
      break;
    case "response.created":
      stats.responses++;
      responding = { id: e.response.id, itemId: null, playedAtStart: played + queued, done: false };
      $("stop").disabled = false;
      break;
    case "response.output_item.added":
      if (responding) responding.itemId = e.item.id;
      bubble(e.item.id, "assistant");
      status("answering…");
      break;
    case "response.output_audio_transcript.delta":
    case "response.output_text.delta":
    case "response.audio_transcript.delta":
    case "response.text.delta":
      bubble(e.item_id, "assistant").querySelector(".text").textContent += e.delta;
      break;
    case "response.output_audio.delta":
    case "response.audio.delta": {
      stats.audioDeltas++;
      const samples = pcm16ToFloat(e.delta);
      queued += samples.length;
      player.port.postMessage(samples.buffer, [samples.buffer]);
      break;
    }
    case "response.done": {
      stats.responsesDone++;
      const item = (e.response.output || [])[0];
      if (item) {
        const c = item.content[0] || {};
        const text = c.transcript ?? c.text ?? "";
        setText(item.id, "assistant", text, true);
        stats.assistantTranscripts.push(text);
        if (e.response.status === "cancelled") bubble(item.id, "assistant").classList.add("interrupted");
      }
      if (responding) {
        responding.done = true;
        truncate(responding);
      }
      $("stop").disabled = true;
      status($("hands-free").checked ? "listening — just talk" : "hold the button to talk");
      break;
    }
    case "error":
      stats.errors.push(e.error);
      status(`error: ${e.error.message}`);
      break;
  }
}

async function openSession() {
  const url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/v1/realtime`;
  const key = $("api-key").value.trim();
  ws = new WebSocket(url, ["realtime", ...(key ? [`openai-insecure-api-key.${key}`] : [])]);
  ws.onmessage = (m) => onEvent(JSON.parse(m.data));
  ws.onclose = (c) => {
    stats.connected = false;
    status(`disconnected (${c.code}${c.reason ? ": " + c.reason : ""})`);
    ws = null;
    stopAudio();
    $("connect").disabled = false;
    $("disconnect").disabled = $("talk").disabled = $("stop").disabled = true;
  };
  await new Promise((resolve, reject) => {
    ws.onopen = resolve;
    ws.onerror = () => reject(new Error("the server refused the session (wrong API key?)"));
  });
  stats.connected = true;
}

async function startAudio() {
  ctx = new AudioContext({ sampleRate: 24000 });
  await ctx.audioWorklet.addModule("/static/mic-worklet.js");
  player = new AudioWorkletNode(ctx, "pcm16-player", { outputChannelCount: [1] });
  player.connect(ctx.destination);
  player.port.onmessage = (m) => {
    played = m.data.played;
    queued = m.data.queued;
    stats.playedSamples = m.data.played;
    stats.nonZeroSamples = m.data.nonZero;
  };
  micStream = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true },
  });
  const mic = new AudioWorkletNode(ctx, "pcm16-capture");
  const mute = ctx.createGain();
  mute.gain.value = 0; // (the capture node must be pulled by the graph; it adds nothing to the output)
  ctx.createMediaStreamSource(micStream).connect(mic).connect(mute).connect(ctx.destination);
  mic.port.onmessage = (m) => {
    if (sending || $("hands-free").checked) send({ type: "input_audio_buffer.append", audio: toBase64(m.data) });
  };
  await ctx.resume();
}

// The microphone and the audio context go (the browser stops showing the microphone in use).
function stopAudio() {
  if (micStream) micStream.getTracks().forEach((track) => track.stop());
  if (ctx) ctx.close();
  ctx = player = micStream = null;
  responding = null;
  sending = false;
}

async function connect() {
  $("connect").disabled = true;
  status("connecting…");
  await openSession();
  $("disconnect").disabled = false;
  status("starting the microphone…");
  await startAudio();
  $("talk").disabled = $("hands-free").checked;
}

// End the session from here: the server stops its answer and forgets the conversation.
function disconnect() {
  $("disconnect").disabled = true;
  if (ws) {
    ws.onmessage = null; // (events still in flight find no player)
    ws.close(1000, "the user disconnected");
  }
  stopAudio();
}

function holdToTalk(down) {
  if ($("hands-free").checked || !ws) return;
  sending = down;
  $("talk").classList.toggle("held", down);
  if (down) {
    stopPlayback(true);
    status("recording — release to send");
  } else {
    send({ type: "input_audio_buffer.commit" });
    send({ type: "response.create" });
    status("thinking…");
  }
}

$("connect").onclick = () => connect().catch((err) => { status(`cannot start: ${err.message}`); $("connect").disabled = false; });
$("disconnect").onclick = disconnect;
$("stop").onclick = () => stopPlayback(true);
$("talk").onpointerdown = () => holdToTalk(true);
$("talk").onpointerup = $("talk").onpointerleave = () => sending && holdToTalk(false);
$("hands-free").onchange = () => {
  $("talk").disabled = $("hands-free").checked || !ws;
  send({ type: "session.update", session: sessionConfig() });
};
$("voice").onchange = () => send({ type: "session.update", session: sessionConfig() });
