// The take-away files, written in the page from the one result it holds (a verbose_json
// stream's done event), so a download never decodes the audio again. The layouts are the
// server's own (asr_service/formats.py): "A: " opens a speaker's SRT cue, <v A> a VTT cue.

function stamp(seconds, decimal) {
  let ms = Math.max(0, Math.round(seconds * 1000));
  const h = Math.floor(ms / 3600000); ms -= h * 3600000;
  const m = Math.floor(ms / 60000); ms -= m * 60000;
  const s = Math.floor(ms / 1000); ms -= s * 1000;
  const two = (n) => String(n).padStart(2, "0");
  return `${two(h)}:${two(m)}:${two(s)}${decimal}${String(ms).padStart(3, "0")}`;
}

export function toSrt(result) {
  return result.segments.map((s, i) => `${i + 1}\n${stamp(s.start, ",")} --> ${stamp(s.end, ",")}\n`
    + `${s.speaker ? `${s.speaker}: ` : ""}${s.text.trim()}\n`).join("\n");
}

export function toVtt(result) {
  return "WEBVTT\n\n" + result.segments.map((s) => `${stamp(s.start, ".")} --> ${stamp(s.end, ".")}\n`
    + `${s.speaker ? `<v ${s.speaker}>` : ""}${s.text.trim()}\n`).join("\n");
}

export function toText(result) {
  return `${result.text}\n`;
}

// OpenAI's verbose_json: what a non-streamed request with the same fields returns.
export function toVerboseJson(result) {
  const { task, language, language_probability, duration, text, segments, words } = result;
  const body = { task, language, language_probability, duration, text, segments };
  if (words) body.words = words;
  body.usage = { type: "duration", seconds: Math.max(1, Math.ceil(duration)) };
  return `${JSON.stringify(body, null, 2)}\n`;
}

// OpenAI's diarized_json (the SDK's TranscriptionDiarized).
export function toDiarizedJson(result) {
  return `${JSON.stringify({
    task: "transcribe", duration: result.duration, text: result.text,
    segments: result.segments.map((s) => ({ type: "transcript.text.segment", id: `seg_${s.id}`, start: s.start,
      end: s.end, text: s.text.trim(), speaker: s.speaker })),
    usage: { type: "duration", seconds: Math.max(1, Math.ceil(result.duration)) },
  }, null, 2)}\n`;
}

// [label, file extension, MIME type, writer, needs speakers]
export const DOWNLOADS = [
  ["SRT", "srt", "application/x-subrip", toSrt, false],
  ["VTT", "vtt", "text/vtt", toVtt, false],
  ["Text", "txt", "text/plain", toText, false],
  ["JSON", "json", "application/json", toVerboseJson, false],
  ["Diarized JSON", "diarized.json", "application/json", toDiarizedJson, true],
];
