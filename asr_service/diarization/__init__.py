"""Speaker diarization: voice embeddings (voice_encoder), speakers from them (clustering), who
spoke when (diarizer), and speakers given to the transcript's words and segments (attribution)."""
