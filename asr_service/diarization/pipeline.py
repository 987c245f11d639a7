"""A transcript with its speakers: the transcription (with word times) and the diarization of
the same audio run together, then every word is given its speaker (attribution). Known
speakers' reference clips are decoded and enrolled first."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import numpy as np

from ..audio import AudioError, AudioLimits, AudioTooLongError, decode_audio
from ..chunking import AudioChunk
from ..pcm import SAMPLE_RATE
from ..request_options import DiarizationOptions, OptionError
from ..streaming import StreamDone, StreamItem, StreamSegment
from ..transcription import Transcriber
from ..transcription_types import TranscriptionOptions, TranscriptionResult
from .attribution import attribute
from .diarizer import Diarizer
from .voice_encoder import VoiceEncoder

# OpenAI's bounds on a known speaker's reference clip.
REFERENCE_SECONDS = (2.0, 10.0)
REFERENCE_MARGIN_S = 0.5  # decoded past the upper bound, to tell "too long" from the bound itself


def diarizer_for(transcriber: Transcriber) -> Diarizer:
    if transcriber.gate is None:
        raise OptionError("response_format", "Diarization finds speech with the speech gate, and this server runs "
                                             "without it", code="unsupported_value")
    return Diarizer(transcriber.gate, VoiceEncoder.pretrained())


def reference_audio(data: bytes, limits: AudioLimits, deadline: float | None = None) -> np.ndarray:
    """A known speaker's clip from its encoded audio, checked to be 2-10 s long. The bytes come
    from the entry point (a data URL over HTTP, a file on the command line: see
    request_options.build_diarization); this never reads a path. The decode stops just past 10 s,
    so a reference costs at most that much work whatever its bytes claim."""
    low, high = REFERENCE_SECONDS
    try:
        audio = decode_audio(data, replace(limits, max_seconds=high + REFERENCE_MARGIN_S), deadline=deadline)
    except AudioTooLongError:
        raise OptionError("known_speaker_references", f"A reference must be {low:g}-{high:g} s long; one is "
                                                      f"longer than {high:g} s") from None
    except AudioError as e:
        raise OptionError("known_speaker_references", f"A reference is not audio this server can decode: {e}") from None
    seconds = audio.shape[0] / SAMPLE_RATE
    if not low <= seconds <= high:
        raise OptionError("known_speaker_references", f"A reference must be {low:g}-{high:g} s long, got {seconds:.1f} s")
    return audio


def _reference_clips(diarization: DiarizationOptions, limits: AudioLimits, request_seconds: float,
                     on_progress: Callable[[float], None] | None, deadline: float | None) -> dict[str, np.ndarray]:
    clips, total = {}, request_seconds
    for name, data in diarization.known_speakers:
        clip = reference_audio(data, limits, deadline)
        total += clip.shape[0] / SAMPLE_RATE
        if total > limits.max_seconds:
            raise AudioTooLongError(f"the audio and its speaker references together are longer than the limit of "
                                    f"{limits.max_seconds:g} seconds")
        if on_progress is not None:
            on_progress(total)
        clips[name] = clip
    return clips


async def reference_clips(diarization: DiarizationOptions, limits: AudioLimits, request_seconds: float = 0.0,
                          on_progress: Callable[[float], None] | None = None,
                          deadline: float | None = None) -> dict[str, np.ndarray]:
    """The known speakers' clips, decoded and checked (OptionError naming the field otherwise):
    before any work, so that a bad one is refused up front. Reference audio is work like the
    request's own: ``on_progress`` hears the request's seconds plus the references' so far (it
    may raise to refuse the request: admission), and the sum is held to ``limits.max_seconds``
    (AudioTooLongError past it)."""
    return await asyncio.to_thread(_reference_clips, diarization, limits, request_seconds, on_progress, deadline)


def _speaker_turns(diarizer: Diarizer, audio: np.ndarray, diarization: DiarizationOptions,
                   clips: dict[str, np.ndarray]) -> asyncio.Future:
    """The diarization of ``audio``, started on a thread: it runs while the engine decodes."""
    def who_spoke_when():
        known = {name: diarizer.enrol(clip) for name, clip in clips.items()}
        return diarizer.diarize(audio, diarization.min_speakers, diarization.max_speakers, known)

    return asyncio.ensure_future(asyncio.to_thread(who_spoke_when))


def _labelled(result: TranscriptionResult, turns, transcriber: Transcriber,
              diarization: DiarizationOptions) -> TranscriptionResult:
    labelled = attribute(result, turns, transcriber.adapter.split_words)
    return labelled if diarization.keep_words else replace(labelled, words=None)


async def transcribe_with_speakers(transcriber: Transcriber, diarizer: Diarizer, audio: np.ndarray,
                                   options: TranscriptionOptions, diarization: DiarizationOptions,
                                   clips: dict[str, np.ndarray],
                                   on_chunk_done: Callable[[AudioChunk], None] | None = None) -> TranscriptionResult:
    """``options`` come from build_options(..., diarized=True): timestamps and word times on;
    ``clips`` from reference_clips."""
    turns_done = _speaker_turns(diarizer, audio, diarization, clips)
    try:
        result = await transcriber.transcribe(audio, options, on_chunk_done=on_chunk_done)
    finally:
        turns = await turns_done  # a thread cannot be stopped: it ends on its own, in seconds
    return _labelled(result, turns, transcriber, diarization)


async def stream_with_speakers(items: AsyncIterator[StreamItem], transcriber: Transcriber, diarizer: Diarizer,
                               audio: np.ndarray, diarization: DiarizationOptions,
                               clips: dict[str, np.ndarray]) -> AsyncIterator[StreamItem]:
    """A stream's deltas as they are decoded, then, once the whole transcript and the
    diarization are done (speakers are clustered over the whole file), each speaker-labelled
    segment, then the done item."""
    turns_done = _speaker_turns(diarizer, audio, diarization, clips)
    try:
        async for item in items:
            if isinstance(item, StreamDone):
                labelled = _labelled(item.result, await turns_done, transcriber, diarization)
                for segment in labelled.segments:
                    yield StreamSegment(segment)
                item = StreamDone(item.text, labelled)
            yield item
    finally:
        await turns_done
        await items.aclose()
