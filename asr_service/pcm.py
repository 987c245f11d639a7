"""The audio format every stage after decoding works in: mono float32 PCM at 16 kHz (Whisper's)."""

SAMPLE_RATE = 16000
