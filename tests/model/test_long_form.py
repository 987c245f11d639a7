"""Long-form quality on the real model: temperature fallback, silence, language across chunks,
prompting."""

import asyncio
import gc
import weakref
from contextlib import aclosing
from dataclasses import replace

import jiwer
import numpy as np
import pytest

from asr_service.chunking import AudioChunk
from asr_service.engine.params import Priority
from asr_service.fallback import QualityThresholds
from asr_service.transcription import Transcriber
from asr_service.transcription_types import Finished, TranscriptionOptions
from asr_service.piece_decode import PieceDecode, decode_params

from asr_service.request_options import build_options
from support.clips import load_clip, reference
from support import hard_audio
from support.textnorm import normalize

pytestmark = pytest.mark.model

SR = 16000
NO_FALLBACK = TranscriptionOptions(fallback_temperatures=())


def _pad_to(audio: np.ndarray, seconds: float) -> np.ndarray:
    return np.concatenate([audio, np.zeros(int(seconds * SR) - audio.shape[0], np.float32)])


def _window(*names: tuple[str, str], seconds: float = 29.5) -> np.ndarray:
    """One second of silence, clips with short pauses, then silence up to ``seconds``: the
    30 s chunk limits of consecutive windows fall in silence, so each window is one chunk."""
    gap = np.zeros(SR // 2, np.float32)
    return _pad_to(np.concatenate([np.zeros(SR, np.float32)] + [part for n in names for part in (load_clip(*n), gap)]), seconds)


async def _count_decodes(runtime, audio, options):
    before = runtime.engine.submitted_total
    result = await runtime.transcriber.transcribe(audio, options)
    return result, runtime.engine.submitted_total - before


# ---- temperature fallback ----

async def test_fallback_retries_hotter_until_it_passes_and_keeps_the_fused_prefix(runtime):
    fox = load_clip("en", "quick_brown_fox")
    plain, decodes = await _count_decodes(runtime, fox, TranscriptionOptions(timestamps=True))
    assert decodes == 1 and plain.segments[0].temperature == 0.0  # a clean clip passes first time
    assert plain.redecodes == {}  # and says nothing was decoded again

    # No decode can have an average log-probability above 0: every temperature is tried.
    strict = TranscriptionOptions(timestamps=True, seed=3, thresholds=QualityThresholds(log_prob=0.0))
    encoded_before = runtime.engine.encoder_windows
    result, decodes = await _count_decodes(runtime, fox, strict)
    assert decodes == 1 + len(strict.fallback_temperatures)
    assert result.redecodes == {"avg_logprob": 1}  # the rule that sent it to the fallback, once
    assert runtime.engine.encoder_windows - encoded_before == 1  # the retries reuse the encoder output
    # The retries kept the first decode's language (its prefix went into their prompt).
    assert result.language == "en" and all(s.language == "en" for s in result.segments)
    # Nothing passed, so the most likely non-loop decode is kept, and says which it was.
    assert result.segments[0].temperature in (0.0,) + strict.fallback_temperatures
    assert "fox" in result.text.lower()

    _, decodes = await _count_decodes(runtime, fox, TranscriptionOptions(fallback_temperatures=(), thresholds=strict.thresholds))
    assert decodes == 1


async def test_a_window_no_temperature_passes_is_decoded_again_in_halves_once(runtime):
    """Three phrases with pauses, under a threshold no decode passes: rather than keep the best
    sampled guess for the whole window, the halves at the pause nearest its middle are decoded
    again on their own (each with its fallback), and no further: each half keeps its best."""
    gap = np.zeros(SR, np.float32)
    names = ("hello_world", "quick_brown_fox", "counting")
    audio = np.concatenate([part for n in names for part in (load_clip("en", n), gap)])
    strict = TranscriptionOptions(timestamps=True, thresholds=QualityThresholds(log_prob=0.0))
    result, decodes = await _count_decodes(runtime, audio, strict)
    assert result.redecodes["every_temperature_fails"] == 1
    assert decodes == 3 * (1 + len(strict.fallback_temperatures))  # the window, then each half
    assert normalize(result.text).split() == [w for n in names for w in normalize(reference("en", n)).split()]


LOOPING_NOISE = (0.05 * np.random.default_rng(0).standard_normal(10 * SR)).astype(np.float32)
LOOPING_OPTIONS = TranscriptionOptions(seed=1, vad_filter=False)


@pytest.fixture(scope="module")
async def looped(runtime):
    """White noise, on which Whisper base loops ("1,5,5,5,..."), transcribed: (result, decodes)."""
    return await _count_decodes(runtime, LOOPING_NOISE, LOOPING_OPTIONS)


async def test_a_repetition_loop_is_decoded_again(looped):
    """The compression ratio catches the loop, and the hotter retries (or the no-speech rule)
    leave no loop in the output."""
    result, decodes = looped
    assert decodes > 1, result.text
    assert result.segments == [] or max(s.compression_ratio for s in result.segments) <= 2.4
    assert set(result.redecodes) <= {"compression_ratio", "avg_logprob", "unparsed"} and result.redecodes, result.redecodes


async def test_a_stream_never_shows_the_loop_its_fallback_replaces(runtime, looped):
    """The same noise streamed: the greedy decode loops, and the stream releases only the window's
    final text, which is the full response's, loop-free."""
    from asr_service.fallback import compression_ratio
    from asr_service.streaming import StreamDelta, StreamDone, render_stream

    before = runtime.engine.submitted_total
    items = [item async for item in render_stream(runtime.transcriber.run(LOOPING_NOISE, LOOPING_OPTIONS))]
    assert runtime.engine.submitted_total - before > 1  # the loop was decoded, and caught
    shown = "".join(i.text for i in items if isinstance(i, StreamDelta))
    assert isinstance(items[-1], StreamDone) and items[-1].text == shown
    assert shown == looped[0].text
    assert compression_ratio(shown) <= 2.4, shown


async def test_a_phrase_said_again_after_each_pause_is_kept_every_time(runtime):
    """The same sentence eight times with 2.5 s pauses (a drill, a chorus): the pauses are
    shortened, so a window holds several repeats, and its text compresses like a loop. Such a
    window is cut at its joins and the parts decoded again rather than sampled hotter (which
    drops repeats), and a part whose segment runs over a join (Whisper writes two identical
    sentences 1.2 s apart as one as often as not) is cut there too: every one is kept, in
    order, at its time."""
    fox = load_clip("en", "quick_brown_fox")
    pause = np.zeros(int(2.5 * SR), np.float32)
    audio = np.concatenate([np.zeros(SR, np.float32)] + [part for _ in range(8) for part in (fox, pause)])
    options = TranscriptionOptions(timestamps=True)
    windows = await (await runtime.transcriber.plan(audio, options)).all_windows()
    assert len(windows) < 8 and all(w.joins for w in windows)  # several repeats a window
    result = await runtime.transcriber.transcribe(audio, options)
    assert normalize(result.text).split() == normalize(reference("en", "quick_brown_fox")).split() * 8, result.text
    assert all(s.temperature == 0.0 for s in result.segments)
    starts = [s.start for s in result.segments if "quick" in s.text.lower()]
    said = [1 + i * (fox.shape[0] + pause.shape[0]) / SR for i in range(8)]
    assert len(starts) == 8 and all(abs(a - b) < 0.6 for a, b in zip(starts, said)), (starts, said)


@pytest.mark.parametrize("timestamps", [False, True], ids=["text", "timestamps"])
async def test_short_phrases_said_again_after_short_pauses_are_kept_every_time(runtime, timestamps):
    """Three clips with half-second pauses (none left out of a window), said seven times over (a minute)
    with faint noise: the temperature-0 decode is sure of its text, which compresses like a
    loop because the speech repeats. The window is cut at the pause nearest its middle and the
    halves decoded again (again where they still repeat), never replaced by a sampled guess:
    every phrase is kept every time, and the redecodes name the rule."""
    audio, truth = hard_audio.drill()
    result = await runtime.transcriber.transcribe(audio, TranscriptionOptions(timestamps=timestamps, beam_size=5))
    assert normalize(result.text).split() == [w for u in truth for w in normalize(u.text).split()], result.text
    assert "repeats_at_pauses" in result.redecodes
    assert all(s.temperature == 0.0 for s in result.segments)


@pytest.mark.parametrize("voice, times, pauses, prompted", [("A", 6, "varied", False), ("D", 9, "equal", False),
                                                            ("D", 9, "varied", False), ("A", 6, "equal", True)],
                         ids=["festival-6-varied", "espeak-9-equal", "espeak-9-varied", "festival-6-prompted"])
async def test_a_sentence_said_again_and_again_is_kept_every_time(runtime, voice, times, pauses, prompted):
    """One sentence said N times by a synthetic voice (Festival's, espeak-ng's), with pauses
    short enough to stay inside a window, all equal or varied: the default decode (timestamps,
    beams, fallback) keeps it N times, at the N places it is said. With the sentence itself as
    the prompt, a decode writes two of the repeats once, in a segment at half the voice's pace:
    the thin segment is cut at the pause under it and the halves decoded again. Where Whisper
    times a sentence's end a second early (espeak-9-varied), the speech still going on after it
    is that sentence's tail, not a missed sentence: no segment writes its last word again."""
    audio, truth = hard_audio.sentence_repeats(voice, times, pauses)
    fields = {"prompt": hard_audio.SENTENCE} if prompted else {}
    options = build_options(fields, runtime.adapter, "transcribe", "json", default_beam_size=runtime.default_beam_size)
    result = await runtime.transcriber.transcribe(audio, options)
    assert normalize(result.text).count("the first") == times, result.text
    # Each segment is one of the repeats, nothing written twice at a seam, and lies mostly over
    # the repeat it writes (Whisper's times may run a second early or late, not a sentence).
    found = [(s.start, s.end) for s in result.segments if s.text.strip()]
    assert all(normalize(s.text).startswith("the first") for s in result.segments if s.text.strip()), result.segments
    said = [(u.start, u.end) for u in truth]
    assert len(found) == times and all(min(e, te) - max(s, ts) > 0.5 * (e - s)
                                       for (s, e), (ts, te) in zip(found, said)), (found, said)
    # No text in a segment shorter than a word, nor over silence.
    assert all(s.end - s.start >= 0.1 for s in result.segments if s.text.strip()), result.segments
    assert all(any(min(s.end, u.end) - max(s.start, u.start) > 0.1 for u in truth) for s in result.segments)
    if prompted:
        assert "thin_segment" in result.redecodes


class _Recording:
    """The real engine, keeping each decode it is given (params and stream) for inspection."""

    def __init__(self, engine):
        self.engine, self.name, self.warm_copies, self.beam_search = engine, engine.name, engine.warm_copies, engine.beam_search
        self.max_request_windows, self.audio_sized_encoder = engine.max_request_windows, engine.audio_sized_encoder
        self.carries_prompt_text = engine.carries_prompt_text
        self.decodes = []

    def submit(self, audio, params, priority=None):
        stream = self.engine.submit(audio, params, priority)
        self.decodes.append((params, stream))
        return stream

    def refusal(self, params):
        return self.engine.refusal(params)


class _HotRetriesLoop(_Recording):
    """The real engine, except that the first decode and the retries at 0.4 and hotter decode
    white noise greedily, on which Whisper base loops ("1,5,5,5,...") to its token limit: a
    stand-in for a window whose first decode fails and whose hot retries run on and on."""

    NOISE = LOOPING_NOISE

    def __init__(self, engine):
        super().__init__(engine)
        self.hot = []

    def submit(self, audio, params, priority=None):
        if params.temperature == 0:
            return super().submit(self.NOISE, params, priority)
        if params.temperature >= 0.4:
            self.hot.append(super().submit(self.NOISE, replace(params, temperature=0.0), priority))
            return self.hot[-1]
        return super().submit(audio, params, priority)


async def test_hotter_retries_are_cancelled_once_a_cooler_one_passes(runtime):
    """The first retry that passes is the one kept, so the hotter ones still running are
    cancelled once it and the cooler ones have ended: they cannot change the choice."""
    fox = load_clip("en", "quick_brown_fox")
    engine = _HotRetriesLoop(runtime.engine)
    result = await Transcriber(engine, runtime.adapter, runtime.transcriber.gate).transcribe(fox, TranscriptionOptions())
    assert result.redecodes == {"compression_ratio": 1} and result.segments[0].temperature == 0.2
    assert normalize(result.text) == normalize(reference("en", "quick_brown_fox"))
    ended = [(stream.result.finish_reason, len(stream.result.token_ids)) for stream in engine.hot]
    # Left running, each would loop on to its token limit (224) and end with "length".
    assert len(ended) == 4 and all(reason != "length" and tokens < 100 for reason, tokens in ended), ended


async def test_the_fallback_gives_the_same_answer_to_the_same_request(runtime):
    """No seed in the request: the retries still sample with fixed seeds, so every retry (not
    only the kept one) comes out the same each time."""
    fox = load_clip("en", "quick_brown_fox")
    strict = TranscriptionOptions(thresholds=QualityThresholds(log_prob=0.0))  # every temperature is tried
    runs = []
    for _ in range(2):
        engine = _Recording(runtime.engine)
        await Transcriber(engine, runtime.adapter, runtime.transcriber.gate).transcribe(fox, strict)
        assert len(engine.decodes) == 1 + len(strict.fallback_temperatures)
        assert all(p.seed is not None for p, _ in engine.decodes[1:])
        runs.append([(p.temperature, p.seed, stream.result.token_ids) for p, stream in engine.decodes])
    assert runs[0] == runs[1]


# ---- silence and noise ----

def _tone(freqs, seconds=10.0):
    t = np.arange(int(seconds * SR)) / SR
    return (0.3 / len(freqs) * sum(np.sin(2 * np.pi * f * t) for f in freqs)).astype(np.float32)


@pytest.mark.parametrize("kind", ["silence", "quiet-hiss", "white-noise", "tone", "chord"])
@pytest.mark.parametrize("timestamps", [False, True], ids=["text", "timed"])
async def test_no_speech_gives_no_invented_text(runtime, kind, timestamps):
    rng = np.random.default_rng(7)
    audio = {
        "silence": np.zeros(10 * SR, np.float32),
        "quiet-hiss": (3e-4 * rng.standard_normal(10 * SR)).astype(np.float32),
        "white-noise": (0.05 * rng.standard_normal(10 * SR)).astype(np.float32),
        "tone": _tone([440.0]),
        "chord": _tone([261.6, 329.6, 392.0]),
    }[kind]
    result = await runtime.transcriber.transcribe(audio, TranscriptionOptions(timestamps=timestamps, seed=0))
    assert len(result.text) <= 3, result.text  # measured: empty for all of these
    assert sum(len(s.text.strip()) for s in result.segments) <= 3


async def test_speech_after_silence_is_kept(runtime):
    audio = np.concatenate([np.zeros(35 * SR, np.float32), load_clip("en", "quick_brown_fox")])
    result, decodes = await _count_decodes(runtime, audio, TranscriptionOptions(timestamps=True))
    assert decodes == 1  # the silence was not decoded at all
    assert result.text == "The quick brown fox jumps over the lazy dog."
    windows = await (await runtime.transcriber.plan(audio, TranscriptionOptions(timestamps=True))).all_windows()
    assert len(windows) == 1 and 34.0 <= windows[0].start <= 35.0  # the window opens where speech does
    assert all(s.start >= 34.5 for s in result.segments), [(s.start, s.text) for s in result.segments]


async def test_without_the_speech_gate_the_no_speech_rule_still_applies(runtime):
    """vad_filter off: the decode runs, and Whisper's own figures (no-speech probability and
    low log-probability) drop what it invents on a tone (measured: "you" at -1.84)."""
    options = TranscriptionOptions(vad_filter=False)
    result, decodes = await _count_decodes(runtime, _tone([440.0]), options)
    assert decodes >= 1 and result.text == ""


# ---- language across chunks ----

ES = [("es", "conteo"), ("es", "pangrama"), ("es", "hola_mundo")]


def _spanish_then(last_window: np.ndarray) -> np.ndarray:
    return np.concatenate([_window(*ES, *ES), _window(*ES[::-1], *ES), last_window])


async def test_a_low_confidence_outlier_chunk_is_decoded_again_with_the_files_language(runtime):
    # Whisper base hears this two-word Italian greeting as French, with low confidence. The
    # Spanish before it is 28 s of speech with short pauses, a window that nothing more fits
    # in, so the greeting after the long pause opens a window of its own.
    audio = np.concatenate([_window(*ES, *ES, *ES), _window(("it", "ciao_mondo"), seconds=5.0)])
    windows = await (await runtime.transcriber.plan(audio, TranscriptionOptions())).all_windows()
    assert len(windows) == 2 and windows[1].start >= 29.5, [(w.start, w.end) for w in windows]
    voted, decodes = await _count_decodes(runtime, audio, replace_options(timestamps=True))
    assert voted.language == "es"
    assert {s.language for s in voted.segments} == {"es"}
    assert decodes == 3  # two windows, and the outlier once more

    per_chunk, decodes = await _count_decodes(runtime, audio, replace_options(timestamps=True, detect_language_per_chunk=True))
    assert decodes == 2 and per_chunk.language == "es"
    assert per_chunk.segments[-1].language not in (None, "es")


async def test_two_languages_with_per_chunk_detection(runtime):
    en = [("en", "quick_brown_fox"), ("en", "counting"), ("en", "hello_world")]
    audio = _spanish_then(_window(*en, *en[::-1]))
    result = await runtime.transcriber.transcribe(audio, replace_options(timestamps=True, detect_language_per_chunk=True))
    languages = [s.language for s in result.segments]
    assert languages[0] == "es" and languages[-1] == "en", languages
    assert languages == sorted(languages, key=lambda code: code != "es")  # es first, then en
    assert result.language == "es"  # two of three chunks, by duration
    text = result.text.lower()
    assert "quick brown fox" in text and text.index("hola") < text.index("quick brown fox")


def replace_options(**changes) -> TranscriptionOptions:
    from dataclasses import replace

    return replace(NO_FALLBACK, **changes)


# ---- prompting ----

async def test_prompt_changes_the_spelling_of_a_name(runtime):
    fr = load_clip("fr", "pangrama")  # "Portez ce vieux whisky au juge blond qui fume."
    plain = await runtime.transcriber.transcribe(fr, TranscriptionOptions())
    assert "Blanqui" in plain.text  # measured: Whisper base hears a name
    prompted = await runtime.transcriber.transcribe(fr, TranscriptionOptions(previous_text="Le juge blond qui fume."))
    assert "blond qui fume" in prompted.text.lower() and "Blanqui" not in prompted.text


@pytest.fixture
def prompts(runtime, monkeypatch) -> list[tuple[int, ...]]:
    """The prompt of every decode submitted during the test (the real engine decodes them)."""
    seen = []
    submit = runtime.engine.submit

    def recording_submit(samples, params, priority=None):
        seen.append(params.prompt_ids)
        return submit(samples, params, priority)

    monkeypatch.setattr(runtime.engine, "submit", recording_submit)
    return seen


def _two_conditioned_windows() -> np.ndarray:
    en = [("en", "quick_brown_fox"), ("en", "counting")]
    return np.concatenate([_window(*en), _window(*en[::-1])])


# Two windows, each conditioned on the one before: per-window language detection, so the long
# pause between them ends a window instead of being left out of one (chunking.speech_windows).
CONDITIONED = dict(condition_on_previous_text=True, detect_language_per_chunk=True)


async def test_each_chunk_can_be_conditioned_on_the_one_before(runtime, prompts):
    audio = _two_conditioned_windows()
    result = await runtime.transcriber.transcribe(audio, replace_options(**CONDITIONED, hotwords="Fox"))
    assert result.text.lower().count("quick brown fox") == 2
    tok = runtime.adapter.tok
    first, second = prompts
    # Both carry the hotwords; the second also carries the first chunk's text, in order.
    assert first[0] == tok.sot_prev and tok.decode(list(first[1 : first.index(tok.sot)])).strip() == "Fox"
    context = tok.decode(list(second[1 : second.index(tok.sot)]))
    assert context.startswith(" Fox ") and "quick brown fox" in context.lower()


async def test_a_stream_is_conditioned_on_the_text_before_like_the_full_response(runtime, prompts):
    """One decode: a stream conditions each chunk on the one before, and its deltas add up to
    the same text as the full response."""
    from asr_service.streaming import StreamDelta, StreamDone, render_stream

    audio = _two_conditioned_windows()
    options = replace_options(**CONDITIONED)
    items = [item async for item in render_stream(runtime.transcriber.run(audio, options))]
    streamed_prompts = list(prompts)
    full = await runtime.transcriber.transcribe(audio, options)
    deltas = "".join(i.text for i in items if isinstance(i, StreamDelta))
    done = items[-1]
    assert isinstance(done, StreamDone) and done.text == deltas == full.text
    assert full.text.lower().count("quick brown fox") == 2
    tok = runtime.adapter.tok
    second = streamed_prompts[1]
    assert second[0] == tok.sot_prev and "quick brown fox" in tok.decode(list(second[1 : second.index(tok.sot)])).lower()


async def test_two_stage_detection_applies_to_streams_too(runtime):
    from asr_service.streaming import StreamDone, render_stream

    clip = load_clip("fr", "pangrama")
    options = replace_options(detection="two-stage")
    before = runtime.engine.submitted_total
    items = [item async for item in render_stream(runtime.transcriber.run(clip, options))]
    assert runtime.engine.submitted_total - before == 2  # the detection decode, then the transcription
    assert isinstance(items[-1], StreamDone) and items[-1].result.language == "fr"


# ---- word timestamps ----

def _assert_plausible(words, duration):
    assert words
    for w in words:
        assert 0.0 <= w.start <= w.end <= duration + 0.05, w
    assert all(a.start <= b.start and a.end <= b.end + 1e-6 for a, b in zip(words, words[1:])), words


@pytest.mark.parametrize("timestamps", [False, True], ids=["notimestamps", "timestamps"])
async def test_word_times_lie_in_order_and_a_word_after_a_pause_starts_after_it(runtime, timestamps):
    fox, hello = load_clip("en", "quick_brown_fox"), load_clip("en", "hello_world")
    pause_end = (fox.shape[0] + 3 * SR) / SR
    audio = np.concatenate([fox, np.zeros(3 * SR, np.float32), hello])
    result = await runtime.transcriber.transcribe(audio, TranscriptionOptions(word_timestamps=True, timestamps=timestamps))
    _assert_plausible(result.words, result.duration)
    assert [w.word for w in result.words] == result.text.split()  # every word, punctuation attached
    hello_word = next(w for w in result.words if w.word.startswith("Hello"))
    assert pause_end - 0.5 <= hello_word.start <= pause_end + 0.5, (pause_end, hello_word)
    dog = next(w for w in result.words if w.word.startswith("dog"))
    assert dog.end <= fox.shape[0] / SR + 0.3  # the pause is not given to the word before it


async def test_word_times_across_chunks_carry_true_offsets(runtime):
    en = [("en", "quick_brown_fox"), ("en", "counting"), ("en", "hello_world")]
    audio = np.concatenate([_window(*en), _window(*en[::-1])])
    result = await runtime.transcriber.transcribe(audio, TranscriptionOptions(word_timestamps=True, timestamps=True))
    _assert_plausible(result.words, result.duration)
    # The second half of the audio starts at 29.5 s, and "hello" 1 s into it (at 30.5 s).
    late = [w for w in result.words if w.start >= 29.5]
    assert late and late[0].word.lower().startswith("hello")
    assert 30.0 <= late[0].start <= 31.1


async def test_each_window_drops_its_alignment_attention_once_its_words_are_timed(runtime, monkeypatch):
    """The alignment heads' attention (megabytes a window) is turned into word times as each
    window's decode ends, not held for every window of a long file until the response is
    assembled."""
    outcomes = []
    build = PieceDecode._outcome

    def kept(self, *args):
        outcomes.append(build(self, *args))
        return outcomes[-1]

    monkeypatch.setattr(PieceDecode, "_outcome", kept)
    en = [("en", "counting"), ("en", "quick_brown_fox")]
    audio = np.concatenate([_window(*en), _window(*en[::-1])])
    options = TranscriptionOptions(word_timestamps=True, timestamps=True, vad_filter=False)  # two fixed windows
    result = await runtime.transcriber.transcribe(audio, options)
    assert len(outcomes) == 2 and all(o.words for o in outcomes)
    assert all(o.result.cross_attention is None for o in outcomes)
    assert [w.word for w in result.words] == [w.word for o in outcomes for w in o.words]


async def test_a_decoded_window_keeps_its_time_map_and_not_its_samples(runtime, monkeypatch):
    """A window joined across pauses is a copy of its stretches of the audio. What is kept of a
    decoded window until the response is assembled is its map alone, so a long file's speech is
    not held twice: when the result is ready, no window's samples are alive, and the segments
    are still timed in the audio."""
    samples_alive = []
    submit = runtime.transcriber.engine.submit

    def watched(audio, params, priority=None):
        samples_alive.append(weakref.ref(audio if audio.base is None else audio.base))
        return submit(audio, params, priority)

    monkeypatch.setattr(runtime.transcriber.engine, "submit", watched)
    pause = np.zeros(int(2.5 * SR), np.float32)
    clips = [load_clip(*c) for c in (("en", "counting"), ("en", "quick_brown_fox"))] * 4
    audio = np.concatenate([part for clip in clips for part in (pause, clip)])
    async with aclosing(runtime.transcriber.run(audio, TranscriptionOptions(timestamps=True))) as events:
        async for event in events:
            if isinstance(event, Finished):
                # Another thread (the engine's, ending the step that finished the last decode)
                # may hold the last window a few milliseconds more, in a running frame gc cannot
                # see: wait for it. The transcription itself cannot let go meanwhile (it is
                # suspended at this event), so a window it kept would still be found.
                for _ in range(100):
                    gc.collect()
                    alive = [ref for ref in samples_alive if ref() is not None]
                    if not alive:
                        break
                    await asyncio.sleep(0.01)
                assert samples_alive and alive == []
                result = event.result
    assert len(samples_alive) >= 2  # windows (and any continuations or parts) were decoded
    assert result.text.lower().count("fox") == 4, result.text
    assert all(0 <= s.start <= s.end <= result.duration for s in result.segments)
    assert [s.start for s in result.segments] == sorted(s.start for s in result.segments)


async def test_word_times_in_a_language_without_spaces(runtime):
    zh = load_clip("zh", "nihao_shijie")
    result = await runtime.transcriber.transcribe(zh, TranscriptionOptions(word_timestamps=True))
    _assert_plausible(result.words, result.duration)
    assert "".join(w.word for w in result.words) == result.text.replace(" ", "")


# ---- beam search ----

@pytest.fixture(scope="module")
async def greedy_and_beam(runtime):
    """Every English clip and one clip of each other language, fused detection, decoded greedily
    and with 5 beams (one chunk each), a clip's two decodes side by side on one array (the
    engine's encoder cache then encodes it once)."""
    from support.clips import all_clips

    first_of_each = {}
    for lang, name in all_clips():
        first_of_each.setdefault(lang, (lang, name))
    clips = sorted({c for c in all_clips() if c[0] == "en"} | set(first_of_each.values()))
    t = runtime.transcriber
    decodes = []
    for beams in (1, 5):
        options = TranscriptionOptions(beam_size=beams, fallback_temperatures=())
        decodes.append((PieceDecode(t.parts, options, priority=Priority(0.0)), decode_params(t.adapter, options)))
    chunks = [AudioChunk(0, load_clip(*c), 16000) for c in clips]
    both = await asyncio.gather(*(decode.decode(chunk, params) for chunk in chunks for decode, params in decodes))
    return clips, both[0::2], both[1::2]


async def test_beam_search_keeps_the_grammar_in_every_beam(greedy_and_beam, runtime):
    clips, _, beam = greedy_and_beam
    tok = runtime.adapter.tok
    for clip, outcome in zip(clips, beam):
        ids = outcome.result.token_ids
        assert outcome.parsed.failure is None, (clip, outcome.parsed.failure)
        assert ids[0] in tok.id_to_language and ids[1] == tok.transcribe and ids[2] == tok.no_timestamps
        assert all(i < tok.eot for i in ids[3:-1]) and ids[-1] == tok.eot  # no special token in the text


async def test_beam_search_is_at_least_as_good_as_greedy(greedy_and_beam):
    """In the model's own terms (log-probability per token, what beam search maximises) over
    all clips, and in English WER."""
    clips, greedy, beam = greedy_and_beam

    def per_token(outcomes):
        return sum(sum(o.result.logprobs) / len(o.result.logprobs) for o in outcomes) / len(outcomes)

    assert per_token(beam) >= per_token(greedy)
    english = [i for i, c in enumerate(clips) if c[0] == "en"]
    refs = [normalize(reference(*clips[i])) for i in english]
    assert jiwer.wer(refs, [normalize(beam[i].parsed.text) for i in english]) <= jiwer.wer(
        refs, [normalize(greedy[i].parsed.text) for i in english])


async def test_beam_search_with_word_timestamps_and_long_audio(runtime):
    en = [("en", "quick_brown_fox"), ("en", "hello_world")]
    audio = np.concatenate([_window(*en), _window(*en[::-1])])
    result = await runtime.transcriber.transcribe(audio, TranscriptionOptions(beam_size=3, timestamps=True, word_timestamps=True))
    assert normalize(result.text).count("quick brown fox") == 2
    _assert_plausible(result.words, result.duration)
    assert runtime.engine.figures().active_sequences == 0
