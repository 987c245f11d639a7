// The page's two parts: live microphone transcription over /v1/realtime, and file upload to
// /v1/audio/transcriptions. Plain JavaScript, no build step.
"use strict";

const LANGUAGES = { en: "English", de: "German", es: "Spanish", fr: "French", it: "Italian", ja: "Japanese",
  nl: "Dutch", pt: "Portuguese", ru: "Russian", zh: "Chinese" };
const RATE = 24000; // OpenAI's audio/pcm rate; the server resamples to 16 kHz

for (const id of ["live-language", "file-language"]) {
  const select = document.getElementById(id);
  for (const [code, name] of Object.entries(LANGUAGES)) select.add(new Option(`${name} (${code})`, code));
}

function apiKey() {
  return document.getElementById("api-key").value.trim();
}

// ---- live transcription ----

const recordButton = document.getElementById("record");
const liveStatus = document.getElementById("live-status");
const transcript = document.getElementById("transcript");
let live = null; // {ws, context, stream} while recording

function itemElement(itemId) {
  let li = document.getElementById(`item-${itemId}`);
  if (!li) {
    li = document.createElement("li");
    li.id = `item-${itemId}`;
    li.className = "partial";
    li.append(document.createElement("span"));
    transcript.append(li);
  }
  return li;
}

function toBase64(buffer) {
  const bytes = new Uint8Array(buffer);
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(text);
}

function onServerEvent(event) {
  switch (event.type) {
    case "input_audio_buffer.speech_started":
      liveStatus.textContent = "Recording: speech heard…";
      itemElement(event.item_id);
      break;
    case "input_audio_buffer.speech_stopped":
      liveStatus.textContent = "Recording: transcribing the last phrase…";
      break;
    case "conversation.item.input_audio_transcription.delta":
      itemElement(event.item_id).firstChild.textContent += event.delta;
      break;
    case "conversation.item.input_audio_transcription.completed": {
      const li = itemElement(event.item_id);
      li.firstChild.textContent = event.transcript;
      li.className = "final";
      if (!event.transcript) li.remove(); // a turn with no words in it
      else if (event.languages && event.languages.length) {
        const badge = document.createElement("span");
        badge.className = "lang";
        badge.textContent = event.languages[0].code;
        li.append(badge);
      }
      liveStatus.textContent = "Recording: listening…";
      break;
    }
    case "conversation.item.input_audio_transcription.failed":
    case "error": {
      const error = event.error || {};
      liveStatus.textContent = `Error: ${error.message || "unknown"} (${error.code || "no code"})`;
      liveStatus.className = "error";
      break;
    }
  }
}

async function startRecording() {
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false },
  });
  const context = new AudioContext({ sampleRate: RATE });
  await context.audioWorklet.addModule("/page/pcm-worklet.js");
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  // A browser cannot set headers on a WebSocket: the key goes as a subprotocol, as OpenAI's client does it.
  const protocols = apiKey() ? ["realtime", `openai-insecure-api-key.${apiKey()}`] : undefined;
  const ws = new WebSocket(`${scheme}://${location.host}/v1/realtime?intent=transcription`, protocols);
  live = { ws, context, stream };
  ws.onmessage = (message) => onServerEvent(JSON.parse(message.data));
  ws.onclose = () => {  // keep an error the server sent before closing (e.g. too many sessions)
    if (live && live.ws === ws) stopRecording(liveStatus.className === "error" ? liveStatus.textContent : "Connection closed.");
  };
  await new Promise((resolve, reject) => { ws.onopen = resolve; ws.onerror = () => reject(new Error("WebSocket failed")); });
  const language = document.getElementById("live-language").value || null;
  ws.send(JSON.stringify({ type: "session.update", session: { type: "transcription", audio: { input: {
    format: { type: "audio/pcm", rate: RATE },
    transcription: { language },  // the model: the server's default (a session chooses it with ?model=)
    turn_detection: { type: "server_vad", silence_duration_ms: 500 },
  } } } }));
  const capture = new AudioWorkletNode(context, "pcm-capture");
  capture.port.onmessage = (message) => {
    if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "input_audio_buffer.append", audio: toBase64(message.data) }));
  };
  const mute = context.createGain(); // the graph must reach the output for the worklet to run
  mute.gain.value = 0;
  context.createMediaStreamSource(stream).connect(capture).connect(mute).connect(context.destination);
  recordButton.textContent = "Stop recording";
  recordButton.setAttribute("aria-pressed", "true");
  liveStatus.className = "";
  liveStatus.textContent = "Recording: listening…";
}

function stopRecording(why) {
  if (!live) return;
  const { ws, context, stream } = live;
  live = null;
  stream.getTracks().forEach((track) => track.stop());
  context.close();
  if (ws.readyState === WebSocket.OPEN) ws.close();
  recordButton.textContent = "Start recording";
  recordButton.setAttribute("aria-pressed", "false");
  liveStatus.textContent = why || "Not recording.";
}

recordButton.addEventListener("click", () => {
  if (live) stopRecording();
  else startRecording().catch((error) => {
    stopRecording();
    liveStatus.textContent = `Could not start recording: ${error.message}`;
    liveStatus.className = "error";
  });
});

// ---- file upload ----

const form = document.getElementById("upload");
const fileStatus = document.getElementById("file-status");

function seconds(value) { return Number(value).toFixed(2); }

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  const body = new FormData(form);
  if (!body.get("language")) body.delete("language");
  body.set("response_format", "verbose_json");
  fileStatus.className = "";
  fileStatus.textContent = "Transcribing…";
  document.getElementById("file-result").hidden = true;
  try {
    const headers = apiKey() ? { Authorization: `Bearer ${apiKey()}` } : {};
    const response = await fetch("/v1/audio/transcriptions", { method: "POST", body, headers });
    const result = await response.json();
    if (!response.ok) throw new Error(result.error ? `${result.error.message} (${result.error.code})` : response.statusText);
    document.getElementById("file-language-out").textContent = result.language || "not detected";
    document.getElementById("file-duration").textContent = seconds(result.duration);
    document.getElementById("file-text").textContent = result.text;
    const rows = document.getElementById("segments");
    rows.replaceChildren(...result.segments.map((segment) => {
      const row = document.createElement("tr");
      for (const value of [seconds(segment.start), seconds(segment.end), segment.text]) {
        const cell = document.createElement("td");
        cell.textContent = value;
        row.append(cell);
      }
      return row;
    }));
    document.getElementById("file-result").hidden = false;
    fileStatus.textContent = "Done.";
  } catch (error) {
    fileStatus.textContent = `Error: ${error.message}`;
    fileStatus.className = "error";
  }
});
