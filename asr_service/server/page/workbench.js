// The file workbench: a file (uploaded, or the live recording) is sent as one verbose_json
// stream with word times, so its text shows while it decodes and the done event brings the
// whole result: segments, words with their probabilities, speakers when asked for. Then the
// waveform and a timeline of the segments (a lane per speaker), the transcript word by word
// following the playback, and the take-away files.
import { authHeaders, clock, errorText, fillLanguageSelect } from "./common.js";
import { DOWNLOADS } from "./subtitles.js";
import { decodeSamples, drawWaveform } from "./waveform.js";

const $ = (id) => document.getElementById(id);
const form = $("upload");
const fileStatus = $("file-status");
const player = $("player");
const canvas = $("waveform");
const blocks = $("blocks");
const playhead = $("playhead");
const transcriptView = $("file-transcript");
const SPEAKER_COLOURS = 8; // .speaker-0 ... .speaker-7 in style.css
fillLanguageSelect($("file-language"));

let view = null; // the result on show: {result, words: [{word, start, end, element}], samples}
let shownWord = -1;
let audioUrl = null;

function setStatus(text, error = false) {
  fileStatus.textContent = text;
  fileStatus.className = error ? "error" : "";
}

function requestBody(file, words) {
  const body = new FormData();
  body.append("file", file, file.name);
  const language = $("file-language").value;
  if (language) body.append("language", language);
  for (const code of $("allowed-languages").value.split(/[\s,]+/).filter(Boolean)) body.append("allowed_languages[]", code);
  if ($("diarize").checked) body.append("diarize", "true");
  body.append("response_format", "verbose_json");
  body.append("timestamp_granularities[]", "segment");
  if (words) body.append("timestamp_granularities[]", "word");
  body.append("stream", "true");
  return body;
}

// The SSE events of a streamed response, parsed; ends at [DONE].
async function* serverEvents(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffered = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffered += value;
    const events = buffered.split(/\r?\n\r?\n/);
    buffered = events.pop();
    for (const event of events) {
      const data = event.split(/\r?\n/).filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, "")).join("\n");
      if (data === "[DONE]") return;
      if (data) yield JSON.parse(data);
    }
  }
}

let running = null; // the AbortController of the request in flight: a new one replaces it

export async function transcribeFile(file) {
  if (running) running.abort(); // the server cancels that decode when its client goes
  const controller = running = new AbortController();
  $("file-result").hidden = true;
  $("progress").hidden = false;
  const progressText = document.createTextNode(""); // appended to, never rewritten: long files stay cheap
  $("progress-text").replaceChildren(progressText);
  let progressWords = 0, afterSpace = true;
  view = null;
  if (audioUrl) URL.revokeObjectURL(audioUrl);
  audioUrl = URL.createObjectURL(file);
  player.src = audioUrl;
  // The browser decodes its own copy for the waveform while the server transcribes.
  const samples = decodeSamples(file).catch(() => null);
  const started = performance.now();
  setStatus("Uploading…");
  try {
    const post = (words) => fetch("/v1/audio/transcriptions", { method: "POST", body: requestBody(file, words),
      headers: authHeaders(), signal: controller.signal });
    let response = await post(true);
    if (!response.ok) {
      const refusal = await response.json().catch(() => null);
      // A model or engine that cannot time words (SGLang servers): segments only, then.
      if (response.status === 400 && refusal && refusal.error && refusal.error.param === "timestamp_granularities") {
        response = await post(false);
        if (!response.ok) throw new Error(errorText(await response.json().catch(() => null), response.statusText));
      } else throw new Error(errorText(refusal, response.statusText));
    }
    setStatus("Transcribing…");
    let done = null;
    for await (const event of serverEvents(response)) {
      if (event.error) throw new Error(errorText(event, "the stream failed"));
      if (event.type === "transcript.text.delta") {
        progressText.appendData(event.delta);
        // A word starts at a non-space after a space (deltas may split words).
        progressWords += (event.delta.match(/\s\S/g) || []).length + (afterSpace && /^\S/.test(event.delta) ? 1 : 0);
        afterSpace = /\s$/.test(event.delta);
        const seconds = ((performance.now() - started) / 1000).toFixed(0);
        setStatus(`Transcribing… ${progressWords} words so far (${seconds} s)`);
      } else if (event.type === "transcript.text.done") done = event;
    }
    if (!done) throw new Error("the stream ended without a result");
    show(done, file.name, await samples);
    $("progress").hidden = true;
    setStatus("Done.");
  } catch (error) {
    if (!controller.signal.aborted) setStatus(`Error: ${error.message}`, true);
  } finally {
    if (running === controller) running = null;
  }
}

// Each segment's words. The server times the words of each segment's own text, in order, so a
// segment holds the next words until they spell its text (spaces aside: that holds in every
// script, where splitting at spaces would not).
function wordsBySegment(segments, words) {
  const letters = (text) => text.replace(/\s+/g, "").length;
  let next = 0;
  const groups = segments.map((segment) => {
    const group = [];
    for (let spelled = 0, wanted = letters(segment.text); next < words.length && spelled < wanted; next++) {
      spelled += letters(words[next].word);
      group.push(words[next]);
    }
    return group;
  });
  if (groups.length) groups[groups.length - 1].push(...words.slice(next)); // none are left when they agree
  return groups;
}

function speakerClass(speakers, speaker) {
  return `speaker-${Math.max(0, speakers.indexOf(speaker)) % SPEAKER_COLOURS}`;
}

function button(text, className, label, onClick) {
  const b = document.createElement("button");
  b.type = "button";
  b.className = className;
  b.textContent = text;
  if (label) b.setAttribute("aria-label", label);
  b.addEventListener("click", onClick);
  return b;
}

function showTimeline(result, speakers) {
  const lanes = Math.max(1, speakers.length);
  blocks.style.setProperty("--lanes", lanes);
  blocks.replaceChildren(...result.segments.map((s) => {
    const who = s.speaker ? `${s.speaker}, ` : "";
    const b = button("", `block ${speakerClass(speakers, s.speaker)}`, `${who}${clock(s.start)} to ${clock(s.end)}: ${s.text.trim()}`,
      () => seek(s.start));
    b.title = `${who}${clock(s.start)}–${clock(s.end)}: ${s.text.trim()}`;
    b.style.left = `${(100 * s.start) / result.duration}%`;
    b.style.width = `${Math.max(0.4, (100 * (s.end - s.start)) / result.duration)}%`;
    b.style.setProperty("--lane", Math.max(0, speakers.indexOf(s.speaker)));
    return b;
  }));
  $("legend").replaceChildren(...speakers.map((speaker) => {
    const li = document.createElement("li");
    const talk = result.segments.filter((s) => s.speaker === speaker).reduce((t, s) => t + s.end - s.start, 0);
    li.className = speakerClass(speakers, speaker);
    li.textContent = `${speaker}: ${clock(talk)} of speech`;
    return li;
  }));
}

function showTranscript(result, speakers) {
  const words = [];
  const groups = wordsBySegment(result.segments, result.words || []);
  transcriptView.replaceChildren(...result.segments.map((segment, i) => {
    const p = document.createElement("p");
    p.className = `segment ${speakerClass(speakers, segment.speaker)}`;
    const sure = Math.exp(segment.avg_logprob);
    p.append(button(clock(segment.start), "seek", `Play from ${clock(segment.start)}`, () => seek(segment.start)));
    p.lastChild.title = `${clock(segment.start)}–${clock(segment.end)}; mean token probability ${(100 * sure).toFixed(0)} %`;
    if (segment.speaker) {
      const who = document.createElement("span");
      who.className = "who";
      who.textContent = segment.speaker;
      p.append(who);
    }
    if (!groups[i].length) p.append(segment.text.trim()); // a model without word times
    for (const word of groups[i]) {
      const span = document.createElement("span");
      span.className = word.probability < 0.5 ? "word unsure" : "word";
      span.textContent = word.word;
      span.title = `${clock(word.start)} · probability ${(100 * word.probability).toFixed(0)} %`;
      // Shaded by doubt: the less sure the model was, the stronger the highlight.
      span.style.setProperty("--doubt", (1 - word.probability).toFixed(3));
      span.dataset.index = words.length; // a click on it seeks (one listener, on the transcript)
      words.push({ ...word, element: span });
      p.append(span, " ");
    }
    return p;
  }));
  return words;
}

function showDownloads(result, name) {
  const stem = name.replace(/\.[^.]+$/, "") || "transcript";
  const links = DOWNLOADS.filter(([, , , , needsSpeakers]) => !needsSpeakers || result.segments.some((s) => s.speaker))
    .map(([label, extension, type, write]) => {
      const a = document.createElement("a");
      a.href = URL.createObjectURL(new Blob([write(result)], { type }));
      a.download = `${stem}.${extension}`;
      a.textContent = label;
      a.className = "download";
      return a;
    });
  for (const old of $("downloads").querySelectorAll("a")) URL.revokeObjectURL(old.href);
  $("downloads").replaceChildren(...links);
}

function show(result, name, samples) {
  result.duration = result.duration || 1e-3; // the time axis's width (audio with no samples has none)
  const speakers = [...new Set(result.segments.map((s) => s.speaker).filter(Boolean))];
  $("file-language-out").textContent = result.language || "not detected";
  $("file-language-probability").textContent = result.language_probability == null ? ""
    : ` (${(100 * result.language_probability).toFixed(1)} % sure)`;
  $("file-duration").textContent = clock(result.duration);
  $("speaker-count").textContent = speakers.length ? `; ${speakers.length} speakers` : "";
  $("file-text").textContent = result.text;
  showTimeline(result, speakers);
  const words = showTranscript(result, speakers);
  showDownloads(result, name);
  view = { result, words, samples };
  shownWord = -1;
  $("file-result").hidden = false;
  $("waveform-note").textContent = samples ? "" : "This browser cannot decode the file, so no waveform is drawn.";
  redraw();
  follow();
}

function redraw() {
  if (view && view.samples) drawWaveform(canvas, view.samples, view.result.duration);
}

// The word being spoken at ``t``: the last one started, until the next starts (or, in a
// pause, until shortly after it ended).
function wordAt(t) {
  const words = view.words;
  let low = 0, high = words.length - 1, found = -1;
  while (low <= high) {
    const mid = (low + high) >> 1;
    if (words[mid].start <= t) { found = mid; low = mid + 1; } else high = mid - 1;
  }
  return found >= 0 && t <= words[found].end + 0.3 ? found : -1;
}

function follow() {
  if (!view) return;
  const t = player.currentTime;
  playhead.style.left = `${Math.min(100, (100 * t) / view.result.duration)}%`;
  const index = wordAt(t);
  if (index !== shownWord) {
    if (shownWord >= 0) view.words[shownWord].element.classList.remove("current");
    if (index >= 0) {
      const element = view.words[index].element;
      element.classList.add("current");
      if (!player.paused) element.scrollIntoView({ block: "nearest" });
    }
    shownWord = index;
    transcriptView.dataset.currentWord = index;
  }
}

function following() {
  follow();
  if (!player.paused) requestAnimationFrame(following);
}

function seek(seconds) {
  player.currentTime = seconds;
  follow();
}

player.addEventListener("play", () => requestAnimationFrame(following));
player.addEventListener("seeked", follow);
new ResizeObserver(redraw).observe(canvas);

transcriptView.addEventListener("click", (event) => {
  const word = event.target.closest(".word[data-index]");
  if (word && view) seek(view.words[Number(word.dataset.index)].start);
});

// The keyboard's way through the transcript: arrows step from word to word (and play from
// there), space plays or pauses.
transcriptView.addEventListener("keydown", (event) => {
  if (!view || !view.words.length) return;
  const step = { ArrowRight: 1, ArrowLeft: -1 }[event.key];
  if (step) {
    const next = Math.min(view.words.length - 1, Math.max(0, (shownWord < 0 ? wordAt(player.currentTime) : shownWord) + step));
    seek(view.words[next].start);
  } else if (event.key === " ") {
    if (player.paused) player.play(); else player.pause();
  } else return;
  event.preventDefault();
});

$("timeline").addEventListener("click", (event) => {
  if (event.target.closest(".block") || !view) return; // a block seeks to its segment
  const box = $("timeline").getBoundingClientRect();
  seek(((event.clientX - box.left) / box.width) * view.result.duration);
});

$("copy-text").addEventListener("click", async () => {
  try {
    await navigator.clipboard.writeText(view ? view.result.text : "");
    $("copy-status").textContent = "Copied.";
  } catch (error) {
    $("copy-status").textContent = `Could not copy: ${error.message}`;
  }
});

form.addEventListener("submit", (event) => {
  event.preventDefault();
  transcribeFile($("file").files[0]);
});
