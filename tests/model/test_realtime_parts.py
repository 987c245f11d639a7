"""The realtime building blocks without a server: input audio, turn detection, stable text, protocol."""

import base64

import numpy as np
import pytest

from adapters.base import TranscriptionAdapter

from asr_service.realtime import protocol
from asr_service.realtime.input_audio import InputAudioDecoder, InputAudioError, InputFormat, parse_format
from asr_service.realtime.session import SessionConfig
from asr_service.realtime.stable_text import agreed, before_loop, continuation, extension
from asr_service.realtime.turn_detection import TurnDetectionSettings, TurnDetector
from support.clips import load_clip
from tests.helpers import pcm16, resample

pytestmark = pytest.mark.model


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# ---- input audio ----

def test_24khz_pcm_in_100ms_frames_matches_the_16khz_original():
    speech = load_clip("en", "quick_brown_fox")
    at_24k = resample(speech, 24000)
    decoder = InputAudioDecoder(InputFormat("audio/pcm", 24000))
    frames = [decoder.decode(b64(pcm16(at_24k[i : i + 2400]))) for i in range(0, len(at_24k), 2400)]
    back = np.concatenate(frames)
    assert abs(len(back) - len(speech)) < 64  # the resampler holds back a few samples
    n = min(len(back), len(speech)) - 64
    # Same signal after two resamplings (small filter delay allowed): strongly correlated.
    assert np.corrcoef(back[64:n], speech[64:n])[0, 1] > 0.95


def test_g711_mu_law_and_a_law_decode_to_the_standard_values():
    # ITU G.711: mu-law 0xFF and A-law 0xD5 are (near) zero; mu-law 0x00 is the negative extreme.
    mu = InputAudioDecoder(parse_format({"type": "audio/pcmu"}, InputFormat()))
    a = InputAudioDecoder(parse_format({"type": "audio/pcma"}, InputFormat()))
    assert mu.format.rate == a.format.rate == 8000
    quiet = mu.decode(b64(bytes([0xFF]) * 800))
    loud = mu.decode(b64(bytes([0x00]) * 800))
    assert len(quiet) > 1500 and np.abs(quiet).max() < 1e-3  # 100 ms at 8 kHz -> ~1600 samples at 16 kHz
    assert loud[800:].min() < -0.9
    assert np.abs(a.decode(b64(bytes([0xD5]) * 800))).max() < 1e-2


@pytest.mark.parametrize("payload, code", [("not base64!!", "invalid_base64"), (b64(b"\x00\x01\x02"), "invalid_audio"),
                                           (42, "invalid_value")])
def test_bad_audio_payloads_are_named(payload, code):
    with pytest.raises(InputAudioError) as e:
        InputAudioDecoder(InputFormat()).decode(payload)
    assert e.value.code == code


def test_formats_are_checked():
    assert parse_format("g711_ulaw", InputFormat()) == InputFormat("audio/pcmu", 8000)
    assert parse_format({"type": "audio/pcm", "rate": 16000}, InputFormat()).rate == 16000
    for bad in ({"type": "audio/opus"}, {"type": "audio/pcmu", "rate": 16000}, {"type": "audio/pcm", "rate": "x"}, "mp3"):
        with pytest.raises(InputAudioError):
            parse_format(bad, InputFormat())


# ---- turn detection ----

def test_turn_detector_finds_each_phrase_in_a_stream(runtime):
    rate = 16000
    silence = np.zeros(rate, dtype=np.float32)
    first, second = load_clip("en", "hello_world"), load_clip("en", "quick_brown_fox")
    stream = np.concatenate([silence, first, silence, second, silence])
    detector = TurnDetector(runtime.transcriber.gate.model_copy(), TurnDetectionSettings(silence_duration_ms=500))
    found = []
    for i in range(0, len(stream), 1600):  # 100 ms frames, as a client sends them
        found += detector.feed(stream[i : i + 1600])
    assert [b.kind for b in found] == ["start", "stop", "start", "stop"], found
    second_start = 2 * rate + len(first)
    assert abs(found[0].sample - rate) < 0.3 * rate
    assert abs(found[2].sample - second_start) < 0.3 * rate
    assert found[1].sample < second_start and found[3].sample <= len(stream)


# ---- stable text ----

def test_only_text_two_decodes_agree_on_is_sent():
    stable = agreed("The quick brown", "The quick brown fox jumps", " ", None)
    assert stable == ["The", "quick", "brown"]
    assert extension([], stable, " ", None) == "The quick brown"
    assert extension(["The", "quick"], stable, " ", None) == " brown"
    # A word sent that the decodes now hear otherwise stands (deltas only append); the preview
    # goes on after it.
    assert extension(["The", "quack"], stable, " ", None) == " brown"
    assert agreed("一二三", "一二三四", "", None) == ["一", "二", "三"]  # no spaces: characters


def test_words_agree_whatever_their_punctuation_and_case():
    # A decode that ends with its audio punctuates its last words as an ending; the words
    # agree all the same, and the latest decode's spelling goes out.
    assert agreed("1 2 3 4", "1, 2, 3, 4, 5, 6", " ", None) == ["1,", "2,", "3,", "4,"]
    assert agreed("The Quick Brown Fist.", "The quick brown fox jumps", " ", None) == ["The", "quick", "brown"]
    assert agreed("El Velós Murcia.", "El Belos Murcia Lago,", " ", None) == ["El"]  # a changed word is not agreed
    assert extension(["1", "2"], ["1,", "2,", "3,"], " ", None) == " 3,"  # the sent words stand as they were sent


def test_english_words_agree_whatever_their_number_spelling():
    # On its first second of audio the model writes numbers as words, then as digits: in
    # English the two agree (Whisper's English normaliser), and the later spelling goes out.
    assert agreed("One, two, three.", "1, 2, 3, 4,", " ", "en") == ["1,", "2,", "3,"]
    assert agreed("It costs twenty dollars", "It costs 20 dollars", " ", "en") == ["It", "costs", "20", "dollars"]
    assert agreed("One, two, three.", "1, 2, 3, 4,", " ", None) == []  # other languages: letters only
    assert agreed("uno, dos", "1, 2, 3", " ", "es") == []
    # A different number is a different word.
    assert agreed("one, two, three", "1, 2, 4", " ", "en") == ["1,", "2,"]
    assert continuation(["One,", "two,", "three,"], "1, 2, 3, 4. The fox.", " ", "en") == " 4. The fox."


def test_a_looping_preview_keeps_its_text_up_to_the_loop():
    # Cut by its token budget on audio that ends mid-word: what came before the loop can still
    # be agreed with; a loop without a short period leaves nothing to trust.
    looped = "1, 2, 3, 4, 5, 6, 7, 8, 7, 8, 7, 8, 7, 8, 7, 8, 7"
    assert before_loop(looped, " ") == "1, 2, 3, 4, 5, 6, 7, 8,"
    assert before_loop("1, 2, 3, 4, 5, 6, 7, 8, 8, 8, 8, 8, 8, 8, 8", " ") == "1, 2, 3, 4, 5, 6, 7, 8,"
    assert before_loop("天地玄黄黄黄黄", "") == "天地玄黄"
    assert before_loop("Chandler Property Swarthe ubiquitous W Adlynn And the engine", " ") == ""


def test_final_text_continues_what_was_sent():
    assert continuation(["The", "quick"], "The quick brown fox.", " ", None) == " brown fox."
    assert continuation([], "Hello world.", " ", None) == "Hello world."
    # The final decode changed a sent word: the sent text stands, the rest follows it.
    assert continuation(["but", "weather"], "The weather today is fine.", " ", None) == " today is fine."
    assert continuation(["Hello", "world."], "Hello world.", " ", None) == ""
    # Units split differently: aligned on letters and digits, nothing of the new text is lost.
    counted = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10.".split()
    assert continuation(counted, "1-2-3-4-5-6-7-8-9-10. The quick brown fox.", " ", None) == " The quick brown fox."
    assert continuation(["The", "quick", "brown"], "The quick, brown fox.", " ", None) == " fox."
    assert continuation(["一", "二"], "一二三。", "", None) == "三。"
    # The final spells the sent part otherwise: the sent units stand for as many of its words.
    assert continuation(["One,", "two,", "three,"], "1, 2, 3, 4. The quick brown fox.", " ", None) == " 4. The quick brown fox."
    assert continuation(["Howdy,"], "Had he married a more amiable woman,", " ", None) == " he married a more amiable woman,"
    # A final unit the sent text covers only in part goes out whole: said twice, never lost.
    assert continuation(["One,", "two,"], "1-2-3-4. The fox.", " ", None) == " 1-2-3-4. The fox."


def test_a_preview_that_spells_the_sent_words_otherwise_goes_on_after_them():
    assert extension(["One,", "two,"], "1, 2, 3, 4".split(), " ", None) == " 3, 4"
    assert extension(["1,", "2,"], "1, 2, 3, 4".split(), " ", None) == " 3, 4"
    assert extension(["One,", "two,"], ["1-2"], " ", None) == ""  # nothing past the sent words yet


# ---- protocol ----

class TwoLanguages(TranscriptionAdapter):
    """The base adapter's language checks (the code under test) with two languages; nothing
    here decodes, so the decoding methods are left out."""

    supported_languages = ("en", "fr")

    def _not_here(self, *args, **kwargs):
        raise NotImplementedError("the protocol tests only check languages")

    build_prompt = parse_fused_output = parse_output = forced_prefix_tokens = _not_here
    tokens_before_text = draft_body = draft_ids = decode_text = strip_special_tokens = _not_here


validate = TwoLanguages()


def test_openai_session_update_sets_format_language_and_vad():
    config = protocol.openai_session_update(protocol.OPENAI_DEFAULTS, {"type": "transcription", "audio": {"input": {
        "format": {"type": "audio/pcmu"}, "transcription": {"model": "whisper-1", "language": "fr", "prompt": "Bonjour"},
        "turn_detection": {"type": "server_vad", "silence_duration_ms": 300}}}}, validate)
    assert config == SessionConfig("fr", "Bonjour", InputFormat("audio/pcmu", 8000), TurnDetectionSettings(silence_duration_ms=300),
                                   model="whisper-1")
    off = protocol.openai_session_update(config, {"type": "transcription", "audio": {"input": {"turn_detection": None}}}, validate)
    assert off.turn_detection is None and off.language == "fr"  # fields not named stay as they were


def test_allowed_languages_are_set_shown_and_cleared():
    config = protocol.openai_session_update(protocol.OPENAI_DEFAULTS, {"type": "transcription", "audio": {"input": {
        "transcription": {"allowed_languages": ["fr", "en"]}}}}, validate)
    assert config.allowed_languages == ("fr", "en") and config.language is None
    shown = protocol.session_object("s", config, "whisper-1")["audio"]["input"]["transcription"]
    assert shown["allowed_languages"] == ["fr", "en"]
    cleared = protocol.vllm_session_update(config, {"allowed_languages": None}, validate)
    assert cleared.allowed_languages is None
    assert "allowed_languages" not in protocol.session_object("s", cleared, "whisper-1")["audio"]["input"]["transcription"]


def test_legacy_session_update_maps_onto_the_same_settings():
    config = protocol.legacy_session_update(protocol.OPENAI_DEFAULTS, {
        "input_audio_format": "g711_alaw", "input_audio_transcription": {"language": "en"}, "turn_detection": None}, validate)
    assert config == SessionConfig("en", None, InputFormat("audio/pcma", 8000), None)


@pytest.mark.parametrize("session, param", [
    ({"type": "realtime"}, "session.type"),
    ({"type": "transcription", "audio": {"input": {"transcription": {"language": "xx"}}}}, "session.audio.input.transcription.language"),
    ({"type": "transcription", "audio": {"input": {"transcription": {"allowed_languages": ["fr", "xx"]}}}},
     "session.audio.input.transcription.allowed_languages"),
    ({"type": "transcription", "audio": {"input": {"transcription": {"allowed_languages": "fr"}}}},
     "session.audio.input.transcription.allowed_languages"),
    ({"type": "transcription", "audio": {"input": {"transcription": {"allowed_languages": [""]}}}},
     "session.audio.input.transcription.allowed_languages"),
    ({"type": "transcription", "audio": {"input": {"transcription": {"allowed_languages": ["fr", " "]}}}},
     "session.audio.input.transcription.allowed_languages"),
    ({"type": "transcription", "audio": {"input": {"transcription": {"language": 5}}}},
     "session.audio.input.transcription.language"),
    ({"type": "transcription", "audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}}, "session.audio.input.turn_detection.type"),
    ({"type": "transcription", "audio": {"input": {"turn_detection": {"threshold": 2}}}}, "session.audio.input.turn_detection"),
    ({"type": "transcription", "audio": {"input": {"format": {"type": "audio/flac"}}}}, "session.audio.input.format"),
])
def test_bad_session_updates_name_the_field(session, param):
    with pytest.raises(protocol.ProtocolError) as e:
        protocol.openai_session_update(protocol.OPENAI_DEFAULTS, session, validate)
    assert e.value.param == param and str(e.value)


def test_error_events_take_each_dialect_shape():
    assert protocol.error_event(protocol.VLLM, "bad", "invalid_base64") == {"type": "error", "error": "bad", "code": "invalid_base64"}
    event = protocol.error_event(protocol.OPENAI, "bad", "invalid_base64", "audio", "evt_1")
    assert event["error"] == {"type": "invalid_request_error", "code": "invalid_base64", "message": "bad",
                              "param": "audio", "event_id": "evt_1"}
