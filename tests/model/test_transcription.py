"""The real packaged model on real speech: fused detection, WER, batching, long audio."""

import asyncio

import jiwer
import numpy as np
import pytest

from asr_service.transcription_types import TranscriptionOptions

from support.clips import all_clips, load_clip, reference
from support.textnorm import normalize

pytestmark = pytest.mark.model

# Whisper base gets the language of these clips wrong (measured; see the issue notes):
# Polish is heard as Czech/Portuguese, and two two-word greetings are too short to tell.
KNOWN_MISDETECTIONS = {("pl", "liczenie"), ("pl", "pangrama"), ("pl", "witaj_swiecie"),
                       ("hi", "namaste_duniya"), ("it", "ciao_mondo")}


@pytest.fixture(scope="module")
async def batched_results(runtime):
    """All 27 clips at once, fused detection: they share the engine's batch."""
    clips = all_clips()
    results = await asyncio.gather(
        *(runtime.transcriber.transcribe(load_clip(*c), TranscriptionOptions()) for c in clips))
    return dict(zip(clips, results))


@pytest.mark.parametrize("clip", all_clips(), ids=lambda c: "/".join(c))
async def test_fused_detection_per_clip(batched_results, clip):
    result = batched_results[clip]
    assert result.detection_failure is None
    assert result.language is not None and 0 < result.language_probability <= 1
    if clip in KNOWN_MISDETECTIONS:
        pytest.xfail(f"whisper base detects {result.language!r} for {clip[0]} clip {clip[1]}")
    assert result.language == clip[0]


async def test_english_wer(batched_results):
    refs, hyps = [], []
    for (lang, name), result in batched_results.items():
        if lang == "en":
            refs.append(normalize(reference(lang, name)))
            hyps.append(normalize(result.text))
    assert len(refs) == 3
    assert jiwer.wer(refs, hyps) <= 0.10, list(zip(refs, hyps))


async def test_non_english_text_in_one_decode(batched_results):
    assert "bonjour" in batched_results[("fr", "bonjour_monde")].text.lower()
    assert batched_results[("zh", "nihao_shijie")].text.startswith("你好")
    assert "世界" in batched_results[("ja", "konnichiwa_sekai")].text
    assert "rápida raposa" in batched_results[("pt", "pangrama")].text.lower()


async def test_batched_equals_one_at_a_time(runtime, batched_results):
    for clip in [("en", "quick_brown_fox"), ("fr", "pangrama"), ("zh", "jishu"), ("es", "conteo")]:
        alone = await runtime.transcriber.transcribe(load_clip(*clip), TranscriptionOptions())
        assert alone.text == batched_results[clip].text, clip
        assert alone.language == batched_results[clip].language


async def test_fixed_language_runs_no_detection(runtime):
    result = await runtime.transcriber.transcribe(load_clip("es", "pangrama"), TranscriptionOptions(language="es"))
    assert result.language == "es"
    assert "murci" in result.text.lower()


async def test_candidate_languages_narrow_detection(runtime):
    # The Italian greeting is heard as French with all 99 languages allowed; with the choice
    # narrowed to it/en the grammar only lets those two through.
    result = await runtime.transcriber.transcribe(
        load_clip("it", "ciao_mondo"), TranscriptionOptions(candidate_languages=("it", "en")))
    assert result.language in ("it", "en")


async def test_translate_to_english(runtime):
    result = await runtime.transcriber.transcribe(load_clip("fr", "comptage"), TranscriptionOptions(task="translate"))
    assert result.language == "fr"
    assert any(w in normalize(result.text).split() for w in ("2", "3", "two", "three"))


async def test_timestamps_give_segments_inside_the_clip(runtime):
    audio = load_clip("en", "quick_brown_fox")
    result = await runtime.transcriber.transcribe(audio, TranscriptionOptions(timestamps=True))
    assert result.text == "The quick brown fox jumps over the lazy dog."
    assert result.segments and result.segments[0].start == 0.0
    assert result.segments[-1].end <= audio.shape[0] / 16000 + 0.05
    assert 0 <= result.segments[0].no_speech_prob < 0.5


async def test_two_stage_baseline_agrees_with_fused(runtime, batched_results):
    """Same language and text. The two-stage decode prefills the language and task tokens that the
    fused one decodes step by step, which rounds the last digits differently: on a clip the model
    hears as a near-tie (French "vieux whisky": "vieau esqui" or "esqu'y" in bfloat16) the text may
    then differ, so the text is compared on clips it hears clearly."""
    for clip in (("es", "pangrama"), ("en", "quick_brown_fox")):
        result = await runtime.transcriber.transcribe(load_clip(*clip), TranscriptionOptions(detection="two-stage"))
        assert result.language == clip[0] and result.text == batched_results[clip].text
    french = await runtime.transcriber.transcribe(load_clip("fr", "pangrama"), TranscriptionOptions(detection="two-stage"))
    assert french.language == "fr" and french.text.startswith("Portez ce vi")


async def test_seeded_sampling_is_reproducible(runtime):
    audio = load_clip("en", "counting")
    opts = TranscriptionOptions(temperature=0.8, seed=1234)
    a = await runtime.transcriber.transcribe(audio, opts)
    b = await runtime.transcriber.transcribe(audio, opts)
    assert a.text == b.text and a.language == "en"


def _silence(seconds):
    return np.zeros(int(seconds * 16000), dtype=np.float32)


async def test_long_audio_chunks_offsets_and_join(runtime):
    """> 60 s from real clips and silences: cut points fall in the silences, times carry over."""
    fox, counting, hello = load_clip("en", "quick_brown_fox"), load_clip("en", "counting"), load_clip("en", "hello_world")
    pieces, starts = [], {}
    t = 0.0

    def put(name, audio):
        nonlocal t
        pieces.append(audio)
        starts.setdefault(name, []).append(t)
        t += audio.shape[0] / 16000

    # Speech is laid out so each 30 s limit falls inside a long silence.
    for name, clip in [("fox", fox), ("counting", counting), ("hello", hello)] * 3:
        put(name, clip)
        put("silence", _silence(6.0))
    audio = np.concatenate(pieces)
    assert audio.shape[0] / 16000 > 60

    chunks = await (await runtime.transcriber.plan(audio, TranscriptionOptions())).all_windows()
    assert len(chunks) >= 3
    silent = [(s, s + 6.0) for s in starts["silence"]]
    for c in chunks[1:]:
        assert any(a <= c.start <= b for a, b in silent), c.start

    steps_before = runtime.engine.steps
    plain = await runtime.transcriber.transcribe(audio, TranscriptionOptions())
    steps = runtime.engine.steps - steps_before
    assert plain.language == "en"
    text = normalize(plain.text)
    assert text.count("quick brown fox") == 3 and text.count("hello world") == 3
    assert text.count("1 2 3 4 5 6 7 8 9 10") == 3
    # The chunks decoded together: fewer engine steps than tokens generated over all chunks.
    tokens = sum(len(s.tokens) for s in plain.segments)
    assert steps < tokens, (steps, tokens)

    # Decoded with timestamps (the seek recovers what a decode stops short of), the windows
    # join the clips across the silences, which they leave out: fewer, fuller windows.
    timed_options = TranscriptionOptions(timestamps=True)
    joined = await (await runtime.transcriber.plan(audio, timed_options)).all_windows()
    assert len(joined) < len(chunks) and any(c.joins for c in joined)
    timed = await runtime.transcriber.transcribe(audio, timed_options)
    assert normalize(timed.text).count("quick brown fox") == 3
    assert all(a.start <= b.start for a, b in zip(timed.segments, timed.segments[1:]))
    assert timed.segments[-1].end <= timed.duration + 0.05
    for seg in timed.segments:
        # seek: where the decode it came from starts (a window, a stretch of one, or a continuation)
        chunk = next(c for c in joined if c.start_sample // 160 <= seg.seek < round(c.end * 100))
        assert chunk.start <= seg.start <= seg.end <= chunk.end + 0.05
        assert not any(a + 0.7 <= seg.start <= b - 0.7 for a, b in silent), seg  # never inside a left-out pause
    # Segment times are true offsets (no idx*30 drift): segments start where their phrase was
    # put. Whisper's own timestamps are coarse after a long leading silence (the first
    # timestamp is capped at 1 s), so count the close ones rather than demand all.
    phrase_of = {"quick brown": "fox", "1, 2, 3": "counting", "hello world": "hello"}

    def true_start_error(seg):
        name = next((v for k, v in phrase_of.items() if k in seg.text.lower()), None)
        return min(abs(seg.start - s) for s in starts[name]) if name else float("inf")

    # (A window starts in the silence kept before its speech: up to 0.6 s before a long pause's end.)
    close = [seg for seg in timed.segments if true_start_error(seg) < 0.7]
    assert len(close) >= len(timed.segments) / 2, [(s.start, s.text) for s in timed.segments]
    assert any(seg.start > 60 for seg in close)  # times are right far into the file, past left-out pauses
