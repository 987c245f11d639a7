// Live transcription: the microphone over /v1/realtime (OpenAI's realtime protocol). Each
// utterance the server's VAD finds is one line with its start and end in the recording. Text
// arrives once the server's partial decodes agree on it, so what is shown never changes; the
// line still being heard is marked as open until its final transcript arrives. What was
// recorded is kept, and can be opened in the file workbench.
import { apiKey, clock, fillLanguageSelect } from "./common.js";
import { transcribeFile } from "./workbench.js";

const RATE = 24000; // OpenAI's audio/pcm rate; the server resamples to 16 kHz

const recordButton = document.getElementById("record");
const openButton = document.getElementById("open-recording");
const liveStatus = document.getElementById("live-status");
const transcript = document.getElementById("transcript");
fillLanguageSelect(document.getElementById("live-language"));

let live = null; // {ws, context, stream} while recording
let recorded = []; // the Int16Array frames sent, for the workbench

function itemElement(itemId) {
  let li = document.getElementById(`item-${itemId}`);
  if (!li) {
    li = document.createElement("li");
    li.id = `item-${itemId}`;
    li.className = "partial";
    for (const part of ["when", "text"]) {
      const span = document.createElement("span");
      span.className = part;
      li.append(span);
    }
    li.querySelector(".text").setAttribute("aria-description", "still being heard");
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
    case "input_audio_buffer.speech_started": {
      liveStatus.textContent = "Recording: speech heard…";
      const li = itemElement(event.item_id);
      li.dataset.start = event.audio_start_ms / 1000;
      li.querySelector(".when").textContent = `${clock(li.dataset.start)}–`;
      break;
    }
    case "input_audio_buffer.speech_stopped": {
      liveStatus.textContent = "Recording: transcribing the last phrase…";
      const li = itemElement(event.item_id);
      li.dataset.end = event.audio_end_ms / 1000;
      li.querySelector(".when").textContent = `${clock(li.dataset.start || 0)}–${clock(li.dataset.end)}`;
      break;
    }
    case "conversation.item.input_audio_transcription.delta":
      itemElement(event.item_id).querySelector(".text").textContent += event.delta;
      break;
    case "conversation.item.input_audio_transcription.completed": {
      const li = itemElement(event.item_id);
      const text = li.querySelector(".text");
      text.textContent = event.transcript;
      text.removeAttribute("aria-description");
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
  recorded = [];
  openButton.disabled = true;
  transcript.replaceChildren();
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
    if (ws.readyState !== WebSocket.OPEN) return;
    recorded.push(new Int16Array(message.data));
    ws.send(JSON.stringify({ type: "input_audio_buffer.append", audio: toBase64(message.data) }));
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
  openButton.disabled = recorded.length === 0;
}

// The recording as a 16-bit PCM WAV file (RIFF header, then the samples).
function recordingWav() {
  const samples = recorded.reduce((n, frame) => n + frame.length, 0);
  const view = new DataView(new ArrayBuffer(44));
  const text = (offset, value) => [...value].forEach((c, i) => view.setUint8(offset + i, c.charCodeAt(0)));
  text(0, "RIFF"); view.setUint32(4, 36 + samples * 2, true); text(8, "WAVE");
  text(12, "fmt "); view.setUint32(16, 16, true); view.setUint16(20, 1, true); view.setUint16(22, 1, true);
  view.setUint32(24, RATE, true); view.setUint32(28, RATE * 2, true); view.setUint16(32, 2, true);
  view.setUint16(34, 16, true); text(36, "data"); view.setUint32(40, samples * 2, true);
  return new File([view.buffer, ...recorded], "recording.wav", { type: "audio/wav" });
}

recordButton.addEventListener("click", () => {
  if (live) stopRecording();
  else startRecording().catch((error) => {
    stopRecording();
    liveStatus.textContent = `Could not start recording: ${error.message}`;
    liveStatus.className = "error";
  });
});

openButton.addEventListener("click", () => {
  transcribeFile(recordingWav());
  document.getElementById("file-heading").scrollIntoView();
});
