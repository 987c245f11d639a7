// Runs on the audio thread: microphone samples (float, at the AudioContext's rate) become
// 16-bit PCM frames of about 100 ms, posted to the page, which sends them to /v1/realtime.
class PcmCapture extends AudioWorkletProcessor {
  constructor() {
    super();
    this.size = Math.round(sampleRate / 10);
    this.frame = new Int16Array(this.size);
    this.filled = 0;
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (channel) {
      for (let i = 0; i < channel.length; i++) {
        const s = Math.max(-1, Math.min(1, channel[i]));
        this.frame[this.filled++] = s < 0 ? s * 0x8000 : s * 0x7fff;
        if (this.filled === this.size) {
          this.port.postMessage(this.frame.buffer, [this.frame.buffer]); // transferred: detached here
          this.frame = new Int16Array(this.size);
          this.filled = 0;
        }
      }
    }
    return true; // keep running while the page records
  }
}

registerProcessor("pcm-capture", PcmCapture);
