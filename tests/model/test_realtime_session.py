"""RealtimeSession in-process on the real model: utterances, server VAD, the early final decode."""

import pytest
import asyncio
from dataclasses import replace

import numpy as np

from asr_service.fallback import QualityThresholds
from asr_service.realtime.events import Completed, SessionError, TextDelta
from asr_service.realtime.session import RealtimeSession, SessionConfig
from asr_service.realtime.turn_detection import TurnDetectionSettings
from asr_service.request_options import build_options
from support.clips import load_clip
from support.textnorm import normalize

pytestmark = pytest.mark.model


def file_decode(runtime):
    return build_options({}, runtime.adapter, "transcribe", "json", default_beam_size=runtime.default_beam_size)


async def run_session(runtime, audio: np.ndarray, config: SessionConfig, commit: bool = False, transcriber=None,
                      frame: int = 1600, pause_s: float = 0.0, decode=None) -> list:
    """The session's events for ``audio`` sent in frames (100 ms by default), ``pause_s``
    between them (0: as fast as the session takes them); ``decode``: the file decode options
    (file_decode's by default)."""
    events = []
    session = RealtimeSession(transcriber or runtime.transcriber, events.append, decode or file_decode(runtime),
                              config=config)
    worker = asyncio.create_task(session.run())
    try:
        for i in range(0, len(audio), frame):
            await session.append(audio[i : i + frame])
            await asyncio.sleep(pause_s)
        if commit:
            session.commit(final=True)
        async with asyncio.timeout(60):
            while not session.idle:
                await asyncio.sleep(0.02)
    finally:
        worker.cancel()
    return events


def texts_by_item(events) -> dict[str, str]:
    done = {e.item_id: e.text for e in events if isinstance(e, Completed)}
    for item, text in done.items():  # deltas of an item always add up to its final text
        assert "".join(e.text for e in events if isinstance(e, TextDelta) and e.item_id == item) == text
    return done


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * 16000), dtype=np.float32)


VAD = SessionConfig(turn_detection=TurnDetectionSettings(silence_duration_ms=500))


async def test_speech_that_resumes_after_a_short_pause_stays_one_utterance(runtime):
    # The 300 ms pause starts an early final decode (after 100 ms of silence); the speech that
    # follows must cancel it, or the final text would stop at the pause.
    hello, fox = load_clip("en", "hello_world"), load_clip("en", "quick_brown_fox")
    loud = np.flatnonzero(np.abs(hello) > 0.02)
    audio = np.concatenate([silence(0.5), hello[: loud[-1] + 800], silence(0.3), fox, silence(1.0)])
    events = await run_session(runtime, audio, VAD)
    done = texts_by_item(events)
    assert len(done) == 1, events
    text = normalize(next(iter(done.values())))
    assert text.startswith("hello world") and text.endswith("the quick brown fox jumps over the lazy dog"), text


async def test_a_long_pause_ends_the_turn_and_each_turn_gets_its_text(runtime):
    audio = np.concatenate([silence(0.5), load_clip("fr", "bonjour_monde"), silence(1.0), load_clip("en", "counting"),
                            silence(1.0)])
    events = await run_session(runtime, audio, VAD)
    done = [e for e in events if isinstance(e, Completed)]
    assert [e.language for e in done] == ["fr", "en"], done
    assert normalize(done[0].text) == "bonjour le monde" and "10" in normalize(done[1].text).split(), done


async def test_without_vad_the_commit_cuts_and_an_empty_commit_is_an_error(runtime):
    events = await run_session(runtime, load_clip("en", "hello_world"), SessionConfig(), commit=True)
    assert list(texts_by_item(events).values()) == ["Hello world."]
    empty = await run_session(runtime, np.zeros(0, dtype=np.float32), SessionConfig(), commit=True)
    assert [e.code for e in empty if isinstance(e, SessionError)] == ["input_audio_buffer_commit_empty"]
    assert not [e for e in empty if isinstance(e, Completed)]


@pytest.mark.parametrize("language, name", [("en", "quick_brown_fox"), ("es", "pangrama"), ("fr", "bonjour_monde")])
async def test_a_committed_utterance_gets_the_decode_a_file_of_it_gets(runtime, language, name):
    """The final text of an utterance is a file's decode of the same audio (its beams,
    timestamps, fallback and thresholds), whatever the previews sent before it."""
    clip = load_clip(language, name)
    events = await run_session(runtime, clip, SessionConfig(), commit=True)
    assert list(texts_by_item(events).values()) == [(await runtime.transcriber.transcribe(clip, file_decode(runtime))).text]


async def test_the_completed_event_says_why_its_final_decode_was_decoded_again(runtime):
    """The final decode's redecodes travel with its completed event (the server counts them):
    no decode has an average log-probability above 0, so with that threshold the fallback runs."""
    strict = replace(file_decode(runtime), thresholds=QualityThresholds(log_prob=0.0))
    events = await run_session(runtime, load_clip("en", "hello_world"), SessionConfig(), commit=True, decode=strict)
    assert [e.redecodes for e in events if isinstance(e, Completed)] == [{"avg_logprob": 1}]


class _PreviewsThatMishear:
    """The real transcriber, except that every preview (a partial decode: it has a token
    budget) hears "Howdy," where the utterance starts, as partial decodes of its first second
    did on a LibriVox clip. The final decode is the real one."""

    def __init__(self, transcriber):
        self.adapter, self.gate, self.engine, self._real = transcriber.adapter, transcriber.gate, transcriber.engine, transcriber

    async def transcribe(self, audio, options, live_since):
        result = await self._real.transcribe(audio, options, live_since=live_since)
        if options.max_new_tokens is None:
            return result
        return replace(result, text="Howdy, " + " ".join(result.text.split()[2:]), language="en")


async def test_the_final_text_is_the_file_decode_even_where_the_preview_was_wrong(runtime):
    """Words a preview sent never hold the final decode: the completed text is the file decode
    of the utterance, all of it (the preview's last delta only completes what it showed)."""
    clip = np.concatenate([load_clip("en", "quick_brown_fox"), load_clip("en", "counting")])
    # Half a second at a time, about real time: previews run between the frames.
    events = await run_session(runtime, clip, SessionConfig(), commit=True,
                               transcriber=_PreviewsThatMishear(runtime.transcriber), frame=8000, pause_s=0.6)
    deltas = "".join(e.text for e in events if isinstance(e, TextDelta))
    [done] = [e for e in events if isinstance(e, Completed)]
    assert deltas.startswith("Howdy,")  # the preview went out as it was heard
    assert done.text == (await runtime.transcriber.transcribe(clip, file_decode(runtime))).text
    assert normalize(done.text).startswith("the quick brown fox") and "10" in normalize(done.text).split()


class _CountingPreviewSteps:
    """The real transcriber, recording for each preview (a partial decode: it has a token
    budget) the draft it was given, the engine steps it took and what it generated (the draft
    it leaves for the next)."""

    def __init__(self, transcriber):
        self.adapter, self.gate, self.engine, self._real = transcriber.adapter, transcriber.gate, transcriber.engine, transcriber
        self.previews = []

    async def transcribe(self, audio, options, live_since):
        steps = self.engine.steps
        result = await self._real.transcribe(audio, options, live_since=live_since)
        if options.max_new_tokens is not None:
            self.previews.append((options.draft, self.engine.steps - steps, result.draft))
        return result


def _shared(a: tuple, b: tuple) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


async def test_a_preview_checks_the_last_previews_tokens_in_one_pass(runtime):
    """Each preview after the first is given what the last one generated (text and timestamps)
    as a draft, and does not step through what it says again: it steps only from the first
    token it says otherwise (at the latest the last one's closing timestamp), plus its prefix."""
    clip = np.concatenate([load_clip("en", "counting"), load_clip("en", "quick_brown_fox")])
    counting = _CountingPreviewSteps(runtime.transcriber)
    # Half a second at a time with pauses, and no turn detection: one decode runs at a time.
    await run_session(runtime, clip, SessionConfig(), commit=True, transcriber=counting, frame=8000, pause_s=0.6)
    assert all(draft is None or draft.timed for draft, _, _ in counting.previews)  # previews decode as files do
    checked = [(steps, len(made.tokens), _shared(draft.tokens, made.tokens)) for draft, steps, made in counting.previews
               if draft is not None and made is not None and _shared(draft.tokens, made.tokens) >= 5]
    assert len(checked) >= 2, counting.previews
    for steps, made, shared in checked:
        assert steps <= made - shared + 4, (steps, made, shared)
