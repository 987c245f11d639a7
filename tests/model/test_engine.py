"""The decode loop itself: cancellation, token budget, probes."""

import asyncio
import threading
import time
from dataclasses import replace

import jiwer
import numpy as np
import pytest
import torch

from asr_service.engine.params import DecodeFailed, Priority, raise_if_failed
from asr_service.engine.stream import SequenceStream
from asr_service.runtime import cpu_has_native_bf16
from asr_service.transcription_types import TranscriptionOptions
from support.clips import load_clip, reference
from support.textnorm import normalize

pytestmark = pytest.mark.model


async def after_three_tokens_of_a_long_decode(runtime, act) -> SequenceStream:
    """A decode that goes on for many steps (sampling at temperature 1 on noise), with ``act``
    called once its third token has arrived; returns its stream once it has ended."""
    noise = (0.1 * np.random.default_rng(0).standard_normal(16000 * 20)).astype(np.float32)
    params = replace(runtime.adapter.build_fused_autodetect_params(), temperature=1.0, seed=7, max_new_tokens=200)
    stream = runtime.engine.submit(noise, params)
    seen = 0
    async for _ in stream:
        seen += 1
        if seen == 3:
            act(stream)
    return stream


async def test_cancel_frees_the_slot_within_a_step(runtime):
    engine = runtime.engine
    at_cancel = []

    def cancel(stream):
        at_cancel.append(engine.steps)
        stream.cancel()

    stream = await after_three_tokens_of_a_long_decode(runtime, cancel)
    steps_at_cancel = at_cancel[0]
    assert stream.result.finish_reason == "cancelled"
    assert engine.steps - steps_at_cancel <= 2
    for _ in range(50):
        if engine.figures().active_sequences == 0:
            break
        await asyncio.sleep(0.01)
    assert engine.figures().active_sequences == 0


async def test_token_budget_ends_with_length(runtime):
    adapter = runtime.adapter
    params = replace(adapter.build_fused_autodetect_params(), max_new_tokens=5)
    result = await runtime.engine.submit(load_clip("en", "counting"), params).collect()
    assert result.finish_reason == "length" and len(result.token_ids) == 5
    # The forced prefix came first, then two text tokens.
    assert result.token_ids[:3] == [adapter.tok.language_ids["en"], adapter.tok.transcribe, adapter.tok.no_timestamps]


async def test_probe_reports_language_and_no_speech_probabilities(runtime):
    adapter = runtime.adapter
    params = adapter.build_prompt("en")  # the probe position is inside the prompt here
    speech = await runtime.engine.submit(load_clip("en", "quick_brown_fox"), params).collect()
    silence = await runtime.engine.submit(np.zeros(16000 * 3, dtype=np.float32), params).collect()
    assert adapter.language_probabilities(speech.probe_probs)["en"] > 0.9
    assert adapter.no_speech_probability(speech.probe_probs) < 0.1
    assert adapter.no_speech_probability(silence.probe_probs) > adapter.no_speech_probability(speech.probe_probs)


async def test_sequences_decode_the_same_alone_and_beside_beam_searches(runtime):
    """Beams of one search share their window's cross-attention K/V (one audio slot). A greedy
    decode beside beam searches, and each search beside the others, yields exactly the tokens it
    yields alone, also while other sequences finish and their slots are reused mid-decode."""
    adapter, engine = runtime.adapter, runtime.engine
    greedy, detecting = adapter.build_prompt("en"), adapter.build_fused_autodetect_params()
    work = [(load_clip("en", "hello_world"), greedy),
            (load_clip("es", "pangrama"), replace(detecting, beam_size=4)),
            (load_clip("en", "counting"), replace(greedy, beam_size=4)),
            (load_clip("en", "quick_brown_fox"), detecting)]
    alone = [await engine.submit(audio, params).collect() for audio, params in work]
    together = await asyncio.gather(*(engine.submit(audio, params).collect() for audio, params in work))
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    assert all(r.finish_reason == "stop" for r in together)
    assert engine.figures().active_sequences == 0


async def test_windows_past_the_cap_wait_and_decode_the_same(runtime):
    """With room for two audio windows, six decodes and a beam search submitted at once still all
    finish, with the tokens the session's engine gives them, and the caches never held more
    than two windows' cross-attention K/V."""
    from asr_service.engine.batch_engine import BatchEngine

    adapter = runtime.adapter
    capped = BatchEngine(runtime.loaded.model, max_batch_size=8, max_audio_windows=2, threads=2,
                         encoder_dtype=runtime.engine.encoder_dtype)
    try:
        params = adapter.build_fused_autodetect_params()
        work = [(load_clip(*c), params) for c in BATCH_CLIPS] + [(load_clip("en", "counting"), replace(params, beam_size=3))]
        expected = await asyncio.gather(*(runtime.engine.submit(a, p).collect() for a, p in work))
        results = await asyncio.gather(*(capped.submit(a, p).collect() for a, p in work))
        assert [r.token_ids for r in results] == [r.token_ids for r in expected]
        assert all(r.finish_reason == "stop" for r in results)
        assert capped.audio_window_capacity == 2
    finally:
        capped.shutdown()


async def test_an_audio_sized_encoding_hears_the_words_and_never_stands_in_for_the_whole_window(runtime):
    """A realtime preview's encoder reads only the audio's seconds; the decoder still hears the
    clip's words. The encoder cache keeps it apart from the same audio's whole-window encoding,
    so a final decode of the same array is the whole window's, token for token."""
    adapter, engine = runtime.adapter, runtime.engine
    clip = load_clip("en", "quick_brown_fox")
    params = adapter.build_prompt("en")
    whole = await engine.submit(clip, params).collect()
    passes = engine.encoder_windows
    sized = await engine.submit(clip, replace(params, audio_sized_encoder=True)).collect()
    assert engine.encoder_windows == passes + 1  # encoded anew, not the whole window's output
    words = normalize(adapter.decode_text(sized.token_ids)).split()
    assert jiwer.wer(normalize(reference("en", "quick_brown_fox")), " ".join(words)) <= 0.2, words
    again = await engine.submit(clip, params).collect()
    assert again.token_ids == whole.token_ids


@pytest.mark.parametrize("timed", [False, True], ids=["untimed", "timed"])
@pytest.mark.parametrize("draft", ["its own tokens", "one token wrong", "the adapter's from the text"])
async def test_a_greedy_decode_with_a_draft_gives_its_own_tokens_in_fewer_steps(runtime, draft, timed):
    """A draft (a realtime preview's last decode) is checked in one pass as the decode is
    admitted: right, the decode needs no step of its own; wrong from some token on, it takes the
    draft up to there, and its tokens are the ones it gives without a draft. The adapter builds
    the draft from what a decode generated after its prefix (text, and a timed decode's
    timestamps), for a decode with its language given as for a detecting one."""
    adapter, engine = runtime.adapter, runtime.engine
    clip = load_clip("en", "quick_brown_fox")
    params = adapter.build_fused_autodetect_params(timestamps=timed)
    steps = engine.steps
    plain = await engine.submit(clip, params).collect()
    plain_steps = engine.steps - steps
    tokens = list(plain.token_ids)
    if draft == "one token wrong":
        tokens[6] = tokens[7]
    elif draft == "the adapter's from the text":
        body = list(adapter.draft_body(params, plain.token_ids))
        # After <|en|><|transcribe|> and (untimed) <|notimestamps|>, before the end of text.
        assert body == plain.token_ids[2 if timed else 3:-1]
        tokens = list(adapter.draft_ids(params, "transcribe", "en", body))
        assert tokens == plain.token_ids[:-1]
        given = adapter.build_prompt("en", timestamps=timed)
        assert adapter.draft_ids(given, "transcribe", "en", body) == tuple(body)
    steps = engine.steps
    drafted = await engine.submit(clip, replace(params, draft_ids=tuple(tokens))).collect()
    drafted_steps = engine.steps - steps
    assert drafted.token_ids == plain.token_ids and drafted.finish_reason == plain.finish_reason == "stop"
    # Each step makes one token: the check made the draft's right tokens and the one after them.
    assert {"its own tokens": drafted_steps == 0, "one token wrong": drafted_steps == plain_steps - 7,
            "the adapter's from the text": drafted_steps == 1}[draft], (drafted_steps, plain_steps)


async def test_waiting_sequences_are_admitted_oldest_work_first(runtime):
    """The priority a sequence is submitted with (when its work arrived) orders the queue: a
    window's continuation submitted late goes ahead of a window planned after it. One slot,
    so the finishing order is the admission order."""
    from asr_service.engine.batch_engine import BatchEngine

    single = BatchEngine(runtime.loaded.model, max_batch_size=1, threads=2, encoder_dtype=runtime.engine.encoder_dtype)
    try:
        params = runtime.adapter.build_fused_autodetect_params()
        ended = []

        async def decode(name, clip, priority=None):
            await single.submit(load_clip("en", clip), params, priority).collect()
            ended.append(name)

        first = asyncio.ensure_future(decode("busy", "counting"))
        await asyncio.sleep(0.2)  # admitted: the one slot is taken
        now = time.monotonic()
        await asyncio.gather(first, decode("later window", "hello_world", Priority(now)),
                             decode("no priority", "hello_world"), decode("older window", "hello_world", Priority(now - 60)))
        assert ended == ["busy", "older window", "later window", "no priority"]
    finally:
        single.shutdown()


async def test_a_live_decode_starts_at_once_however_full_the_engine_is(runtime):
    """A realtime session's decode (live) goes ahead of file windows queued before it, in the
    engine's live lane: with the one bulk row busy and a file window waiting for it, the live
    decode starts at once and ends first."""
    from asr_service.engine.batch_engine import BatchEngine
    from asr_service.transcription import Transcriber

    single = BatchEngine(runtime.loaded.model, max_batch_size=1, threads=2, encoder_dtype=runtime.engine.encoder_dtype)
    try:
        transcriber = Transcriber(single, runtime.adapter)
        ended = []

        async def transcribe(name, clip, live_since=None):
            await transcriber.transcribe(load_clip("en", clip), live_since=live_since)
            ended.append(name)

        busy = asyncio.ensure_future(transcribe("busy", "counting"))
        await asyncio.sleep(0.2)  # admitted: the one slot is taken
        queued = asyncio.ensure_future(transcribe("file", "hello_world"))
        await asyncio.sleep(0.05)  # queued behind it
        await asyncio.gather(busy, queued, transcribe("live", "hello_world", live_since=time.monotonic()))
        assert ended == ["live", "busy", "file"]
    finally:
        single.shutdown()


async def bulk_tokens_during_a_live_decode(engine, adapter, bulk_turn_s: float, monkeypatch) -> tuple[int, int]:
    """A long file decode (sampling on noise) running; a live decode of the same kind submitted
    beside it: (tokens the file decode got while the live one ran, tokens the live one made)."""
    from asr_service.engine import batch_engine

    monkeypatch.setattr(batch_engine, "BULK_TURN_S", bulk_turn_s)
    noise = (0.1 * np.random.default_rng(0).standard_normal(16000 * 20)).astype(np.float32)
    params = replace(adapter.build_fused_autodetect_params(), temperature=1.0, seed=7, max_new_tokens=200)
    bulk = engine.submit(noise, params)
    live = asyncio.get_running_loop().create_future()
    bulk_tokens = 0

    async def count():
        nonlocal bulk_tokens
        async for _ in bulk:
            bulk_tokens += 1
            if bulk_tokens == 3:  # the file decode is stepping: start the live one
                live.set_result(engine.submit(noise, params, Priority(time.monotonic(), live=True)))

    counter = asyncio.ensure_future(count())
    result = await (await live).collect()
    gained = bulk_tokens - 3
    bulk.cancel()
    await counter
    return gained, len(result.token_ids)


async def test_live_rows_step_apart_from_file_rows(runtime, monkeypatch):
    """While a live decode runs, the file rows beside it do not step with it (the live lane
    steps alone) until the bulk lane's turn comes: with that turn an hour away, a long live
    decode ends while the file decode gains at most the token of the step it was admitted in."""
    gained, live_tokens = await bulk_tokens_during_a_live_decode(runtime.engine, runtime.adapter, 3600.0, monkeypatch)
    assert live_tokens >= 20
    assert gained <= 1


async def test_file_decodes_still_step_while_live_work_runs(runtime, monkeypatch):
    """The bulk lane's turn: a file decode keeps moving beside live work that never pauses
    (a turn every 0.2 s here, over a live decode of at least 20 steps)."""
    gained, live_tokens = await bulk_tokens_during_a_live_decode(runtime.engine, runtime.adapter, 0.2, monkeypatch)
    assert live_tokens >= 20
    assert gained >= 3


async def test_live_decodes_step_a_while_before_the_next_live_admission(runtime, monkeypatch):
    """A live admission (an encoder pass) waits until the live rows have stepped
    LIVE_ADMISSION_GAP_S since the last one: with the gap an hour, a live decode submitted while
    another steps is admitted only once that one has ended."""
    from asr_service.engine import batch_engine

    monkeypatch.setattr(batch_engine, "LIVE_ADMISSION_GAP_S", 3600.0)
    engine, adapter = runtime.engine, runtime.adapter
    noise = (0.1 * np.random.default_rng(1).standard_normal(16000 * 20)).astype(np.float32)
    params = replace(adapter.build_fused_autodetect_params(), temperature=1.0, seed=7, max_new_tokens=60)
    first = engine.submit(noise, params, Priority(time.monotonic(), live=True))
    second: asyncio.Future = asyncio.get_running_loop().create_future()

    async def run_first():
        tokens = 0
        async for _ in first:
            tokens += 1
            if tokens == 3:  # the first decode is stepping: submit the second
                second.set_result(engine.submit(noise, params, Priority(time.monotonic(), live=True)))

    runner = asyncio.ensure_future(run_first())
    async for _ in await second:  # its first token: the first decode had ended by then
        assert first.result.finish_reason, "admitted while the first live decode still stepped"
        assert len(first.result.token_ids) > 3
        break
    (await second).cancel()
    await runner


async def test_the_engine_keeps_its_thread_count_whatever_other_threads_set(runtime):
    """torch gives a thread the process-wide count when the thread first runs a kernel, and
    set_num_threads on any thread changes that count (the speech gate's one-thread scans do).
    An engine whose first work comes while another thread has set one thread still runs on
    the count it was built with."""
    import threading

    from asr_service.engine.batch_engine import BatchEngine

    main_count = torch.get_num_threads()
    engine = BatchEngine(runtime.loaded.model, max_batch_size=2, threads=2, encoder_dtype=runtime.engine.encoder_dtype)
    other = threading.Thread(target=torch.set_num_threads, args=(1,))
    other.start()
    other.join()
    try:
        result = await engine.submit(load_clip("en", "hello_world"), runtime.adapter.build_fused_autodetect_params()).collect()
        assert result.finish_reason == "stop"
        assert engine.figures().threads == 2
    finally:
        torch.set_num_threads(main_count)
        engine.shutdown()


# Clips of several lengths and languages, for the batch-independence checks below.
BATCH_CLIPS = [("en", "quick_brown_fox"), ("fr", "pangrama"), ("en", "counting"), ("pt", "pangrama"),
               ("ja", "pangrama"), ("en", "hello_world")]


@pytest.fixture(scope="module")
def runtime_of(runtime):
    """The session's runtime (the default precision) and, built here, the others."""
    from asr_service.runtime import RuntimeSettings, build_runtime

    built = {}

    def get(quantize: str):
        if quantize == runtime.precision:
            return runtime
        if quantize not in built:
            built[quantize] = build_runtime(RuntimeSettings(device="cpu", threads=2, quantize=quantize))
        return built[quantize]

    yield get
    for rt in built.values():
        rt.close()


@pytest.mark.parametrize("precision", ["none", "bf16"])
async def test_a_sequences_decode_does_not_depend_on_its_batch(precision, runtime_of):
    """The same decodes alone, all together, in reverse order, in pairs and beside beam searches
    give the same tokens; so does a beam search beside other work.

    With bf16 on a CPU that multiplies bfloat16 natively (AVX512-BF16 or AMX: where it is the
    default) the log-probabilities are the same bit for bit as well: oneDNN's bfloat16 products,
    the decoder's attention as plain products over a span of whole blocks, and the shared
    cross-attention of beams multiplied per run of equal reader counts (engine/model.py,
    batch_engine.py) round a row alike in any batch. oneDNN's emulation of bfloat16 elsewhere,
    like BLAS in float32, rounds a row's last digits differently at other batch sizes, so there
    only tokens are compared."""
    bit_for_bit = precision == "bf16" and cpu_has_native_bf16()
    rt = runtime_of(precision)
    engine = rt.engine
    audios = [load_clip(*c) for c in BATCH_CLIPS]
    kinds = [rt.adapter.build_fused_autodetect_params(), rt.adapter.build_fused_autodetect_params(timestamps=True)]
    work = [(audio, kinds[i % 2]) for i, audio in enumerate(audios)]
    searches = [(audios[1], replace(kinds[0], beam_size=3)), (audios[2], replace(kinds[1], beam_size=5))]

    async def decode(batch):
        return await asyncio.gather(*(engine.submit(audio, params).collect() for audio, params in batch))

    def check(result, expected):
        assert result.token_ids == expected.token_ids
        if bit_for_bit:
            assert result.logprobs == expected.logprobs

    alone = [(await decode([w]))[0] for w in work]
    searched_alone = [(await decode([s]))[0] for s in searches]
    assert all(r.finish_reason == "stop" for r in alone + searched_alone)
    for batch in [work, work[::-1], *[work[i:i + 2] for i in range(0, len(work), 2)]]:
        for (audio, _), result in zip(batch, await decode(batch)):
            check(result, alone[next(i for i, w in enumerate(work) if w[0] is audio)])
    beside_searches = await decode([searches[0], *work[:3], searches[1], *work[3:]])
    for result, expected in zip(beside_searches, [searched_alone[0], *alone[:3], searched_alone[1], *alone[3:]]):
        check(result, expected)


async def test_float32_on_float16_stored_weights_decodes_as_on_float32_weights(runtime_of):
    """float32 (``none``) keeps Whisper's float16 weights in float16 where fbgemm can widen them
    inside its products (engine/quantize.py): the same decodes as the same weights held as float32
    tensors, greedy and beam search, with and without timestamps."""
    from asr_service.engine.batch_engine import BatchEngine
    from asr_service.engine.quantize import Fp16WeightLinear, fbgemm_available
    from asr_service.model_loading import load_model

    if not fbgemm_available():
        pytest.skip("no fbgemm on this CPU: float32 keeps float32 weights")
    rt = runtime_of("none")
    dims = rt.loaded.model.dims  # every linear layer: 4 an encoder layer, 7 a decoder layer, the projection
    assert sum(isinstance(m, Fp16WeightLinear) for m in rt.loaded.model.modules()) == 4 * dims.n_audio_layer + 7 * dims.n_text_layer + 1
    # Lookups read the token table mapped from the model file: the weights held in memory once.
    assert rt.loaded.model.decoder.token_embedding.row_bytes.data_ptr() == rt.loaded.mapped_float16_token_rows.data_ptr()
    plain = BatchEngine(load_model().model, max_batch_size=16, threads=2)
    try:
        kinds = [rt.adapter.build_fused_autodetect_params(), rt.adapter.build_fused_autodetect_params(timestamps=True)]
        work = [(load_clip(*c), kinds[i % 2]) for i, c in enumerate(BATCH_CLIPS)]
        work.append((load_clip("fr", "pangrama"), replace(kinds[1], beam_size=5)))
        stored_float16, stored_float32 = [await asyncio.gather(*(engine.submit(a, p).collect() for a, p in work))
                                          for engine in (rt.engine, plain)]
    finally:
        plain.shutdown()
    assert [r.token_ids for r in stored_float16] == [r.token_ids for r in stored_float32]
    assert all(r.finish_reason == "stop" for r in stored_float16)


@pytest.mark.parametrize("quantize", ["int8", "bf16"])
def test_reduced_precision_engine_still_transcribes(quantize):
    """--quantize int8 (quantized linear layers) and bf16 (bfloat16 matrix products in the encoder
    and the decoder, the audio's K/V cached in bfloat16): same pipeline, word times included."""
    from asr_service.runtime import RuntimeSettings, build_runtime
    from asr_service.transcription_types import TranscriptionOptions

    rt = build_runtime(RuntimeSettings(device="cpu", threads=2, max_batch_size=4, quantize=quantize))
    try:
        async def run():
            clips = await asyncio.gather(*(rt.transcriber.transcribe(load_clip(*c), TranscriptionOptions())
                                           for c in [("en", "quick_brown_fox"), ("fr", "pangrama"), ("zh", "nihao_shijie")]))
            timed = await rt.transcriber.transcribe(load_clip("en", "quick_brown_fox"),
                                                    TranscriptionOptions(timestamps=True, word_timestamps=True))
            return *clips, timed
        fox, fr, zh, timed = asyncio.run(run())
    finally:
        rt.close()
    assert [w.word for w in timed.words] == timed.text.split() and timed.words[-1].end > timed.words[0].start
    assert fox.language == "en" and fox.text == "The quick brown fox jumps over the lazy dog."
    assert fr.language == "fr" and fr.text.lower().startswith("portez ce vi")  # int8 on AVX2 writes "portez"
    assert zh.language == "zh" and zh.text.startswith("你好")


def test_sampling_with_every_token_masked_ends_like_greedy(runtime):
    """Found by the fuzz suite: a fallback retry (sampling) on damaged audio reached a step where
    no token was allowed; softmax of all -inf is NaN and torch.multinomial raised (a 500)."""
    import torch

    from asr_service.engine.logits import sample_one

    params = replace(runtime.adapter.build_fused_autodetect_params(), temperature=0.6, top_k=5, top_p=0.9)
    masked = torch.full((51865,), float("-inf"))
    token = sample_one(masked, params, torch.Generator().manual_seed(0))
    assert 0 <= token < 51865 and masked[token] == float("-inf")  # the caller ends the sequence as "grammar"
    with_nan = torch.zeros(51865)
    with_nan[:10] = float("nan")
    assert sample_one(with_nan, params, torch.Generator().manual_seed(0)) >= 10


def test_the_torch_bitmask_used_on_gpus_matches_xgrammars_kernel():
    """The CUDA engine masks with apply_bitmask (plain torch); on the CPU it must agree with
    xgrammar's own kernel bit for bit, for random masks over Whisper's vocabulary."""
    import torch
    import xgrammar as xgr

    from asr_service.engine.logits import apply_bitmask

    generator = torch.Generator().manual_seed(0)
    vocab = 51865
    bitmask = xgr.allocate_token_bitmask(4, vocab)
    bitmask.copy_(torch.randint(-2**31, 2**31 - 1, bitmask.shape, generator=generator, dtype=torch.int64).to(torch.int32))
    bitmask[3] = -1  # a row without a grammar: everything allowed
    logits = torch.randn(4, vocab, generator=generator)
    expected = logits.clone()
    xgr.apply_token_bitmask_inplace(expected, bitmask)
    apply_bitmask(logits, bitmask)
    assert torch.equal(torch.isinf(logits), torch.isinf(expected)) and torch.equal(logits, expected)
    assert not torch.isinf(logits[3]).any() and torch.isinf(logits[:3]).any()


async def test_a_row_left_with_nan_by_its_last_sequence_does_not_poison_the_next(runtime):
    """A step reads keys past a row's length, masked (softmax weight 0); 0 x NaN is NaN, so the
    engine zeroes a row's caches when a sequence takes it. Seen before: after the fuzz suite a
    server answered clear speech with ""."""
    from asr_service.transcription_types import TranscriptionOptions

    audio = load_clip("en", "hello_world")
    assert (await runtime.transcriber.transcribe(audio, TranscriptionOptions())).text == "Hello world."
    with torch.inference_mode():
        for k, v in runtime.engine._bulk.slots.self_kv:
            k[:, :, 40:] = float("nan")
            v[:, :, 40:] = float("nan")
    assert (await runtime.transcriber.transcribe(audio, TranscriptionOptions())).text == "Hello world."


async def test_an_exception_in_a_step_fails_that_steps_decodes_and_the_engine_serves_on(runtime, monkeypatch, caplog):
    engine = runtime.engine
    armed = threading.Event()
    real_step = engine._step

    def faulty_step(lane):
        if armed.is_set():
            armed.clear()
            raise RuntimeError("injected fault")
        real_step(lane)

    monkeypatch.setattr(engine, "_step", faulty_step)
    stream = await after_three_tokens_of_a_long_decode(runtime, lambda _: armed.set())
    assert stream.result.finish_reason == "error" and "injected fault" in stream.result.error
    with pytest.raises(DecodeFailed, match="the engine's step failed: RuntimeError: injected fault"):
        raise_if_failed(stream.result)
    assert "engine step failed" in caplog.text  # logged with its traceback
    assert engine.figures().active_sequences == 0
    result = await runtime.transcriber.transcribe(load_clip("en", "hello_world"), TranscriptionOptions(language="en"))
    assert result.text.strip(" .").lower() == "hello world"
