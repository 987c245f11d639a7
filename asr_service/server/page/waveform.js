// The waveform: the file decoded by the browser itself (an OfflineAudioContext needs no audio
// device and no user gesture), at a low rate that keeps a 30-minute file small (8 kHz mono:
// 58 MB of samples), then drawn as one min/max bar per pixel column.

const RATE = 8000;

export async function decodeSamples(blob) {
  const context = new OfflineAudioContext(1, 1, RATE);
  const buffer = await context.decodeAudioData(await blob.arrayBuffer());
  return buffer.getChannelData(0); // mono: the decoder mixes the channels down
}

// Draws ``samples`` (at RATE) across the canvas, ``duration`` seconds wide (the transcript's
// duration, so the waveform and the segment blocks share one time axis).
export function drawWaveform(canvas, samples, duration) {
  const ratio = window.devicePixelRatio || 1;
  const width = Math.max(1, Math.round(canvas.clientWidth * ratio));
  const height = Math.max(1, Math.round(canvas.clientHeight * ratio));
  canvas.width = width;
  canvas.height = height;
  const g = canvas.getContext("2d");
  g.clearRect(0, 0, width, height);
  g.fillStyle = getComputedStyle(canvas).color;
  const perColumn = (duration * RATE) / width;
  const middle = height / 2;
  for (let x = 0; x < width; x++) {
    const from = Math.floor(x * perColumn), to = Math.min(samples.length, Math.floor((x + 1) * perColumn));
    if (from >= samples.length) break;
    let low = 0, high = 0;
    for (let i = from; i < to; i++) {
      const v = samples[i];
      if (v < low) low = v; else if (v > high) high = v;
    }
    const top = middle - high * middle, bottom = middle - low * middle;
    g.fillRect(x, top, 1, Math.max(1, bottom - top));
  }
}
