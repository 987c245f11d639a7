import numpy as np
import pytest

from asr_service.chunking import SpeechWindowPacker, pad_regions, speech_windows, split_audio
from asr_service.word_timing import Word, snap_to_speech_onsets

pytestmark = pytest.mark.unit

SR = 16000


def noise(seconds, seed=0, level=0.3):
    return (level * np.random.default_rng(seed).standard_normal(int(seconds * SR))).astype(np.float32)


def test_short_audio_is_one_chunk():
    chunks = split_audio(noise(12))
    assert len(chunks) == 1 and chunks[0].start_sample == 0 and chunks[0].samples.shape[0] == 12 * SR


def test_cut_lands_in_the_quietest_window_including_the_last_one():
    audio = noise(45)
    # The only quiet 100 ms is the very last window before the 30 s limit.
    audio[30 * SR - 1600 : 30 * SR] = 0.0
    chunks = split_audio(audio)
    assert len(chunks) == 2
    cut = chunks[1].start_sample
    assert 30 * SR - 1600 <= cut < 30 * SR
    assert cut == 30 * SR - 800  # the middle of that window


def test_cut_at_a_quiet_spot_inside_the_last_second():
    audio = noise(70, seed=1)
    audio[int(29.3 * SR) : int(29.5 * SR)] *= 0.01
    audio[int(58.8 * SR) : int(59.0 * SR)] *= 0.01
    chunks = split_audio(audio)
    assert len(chunks) == 3
    assert 29.3 <= chunks[1].start <= 29.5
    assert 58.8 <= chunks[2].start <= 59.0
    # Chunks tile the input exactly: true offsets, no gaps, no overlap.
    assert sum(c.samples.shape[0] for c in chunks) == audio.shape[0]
    for a, b in zip(chunks, chunks[1:]):
        assert a.start_sample + a.samples.shape[0] == b.start_sample
    assert all(c.duration <= 30.0 for c in chunks)


def _stretches(window):
    """The audio's (start, end) seconds that the window holds, in order."""
    starts = [(0, window.start_sample)] + list(window.joins)
    ends = [o for o, _ in window.joins] + [window.samples.shape[0]]
    return [(source / SR, (source + end - offset) / SR) for (offset, source), end in zip(starts, ends)]


def _holds_its_stretches(window, audio):
    pieces = [audio[round(a * SR) : round(b * SR)] for a, b in _stretches(window)]
    return np.array_equal(window.samples, np.concatenate(pieces))


def test_speech_windows_pack_regions_and_skip_the_silence_between():
    audio = noise(120)
    s = lambda a, b: (int(a * SR), int(b * SR))  # noqa: E731 - seconds to samples
    # Turns with short pauses, a long silence, then more turns.
    regions = [s(15, 20), s(20.5, 27), s(27.6, 40), s(40.5, 46), s(60, 65), s(65.4, 70)]
    windows = speech_windows(audio, regions, pad_seconds=0, kept_pause_seconds=0)
    # Each window holds at most 30 s and is cut between turns; the 14 s silence is left out
    # and the turns after it share the second window.
    assert [_stretches(w) for w in windows] == [[(15, 40)], [(40.5, 46), (60, 70)]]
    assert all(_holds_its_stretches(w, audio) for w in windows)
    assert windows[1].duration == 15.5 and windows[1].start == 40.5 and windows[1].end == 70


def test_a_long_pause_is_left_out_and_the_speech_around_it_shares_a_window():
    regions = [(0, 5 * SR), (int(6.5 * SR), 10 * SR), (12 * SR, 15 * SR)]
    audio = noise(20)
    [window] = speech_windows(audio, regions, pad_seconds=0, kept_pause_seconds=0)
    assert _stretches(window) == [(0, 10), (12, 15)] and window.duration == 13  # 1.5 s kept, 2 s left out
    assert _holds_its_stretches(window, audio)
    [kept] = speech_windows(audio, regions, pad_seconds=0, long_pause_seconds=3.0)  # pauses under 3 s stay
    assert _stretches(kept) == [(0, 15)]
    [cut] = speech_windows(audio, regions, pad_seconds=0, long_pause_seconds=1.0, kept_pause_seconds=0)
    assert _stretches(cut) == [(0, 5), (6.5, 10), (12, 15)] and cut.duration == 11.5
    # Not joined across long pauses (per-window language detection): a long pause ends a window.
    apart = speech_windows(audio, regions, pad_seconds=0, join_long_pauses=False)
    assert [_stretches(w) for w in apart] == [[(0, 10)], [(12, 15)]]


def test_a_long_pause_keeps_its_kept_length_around_the_join():
    # Padded by 0.4 s, a long pause keeps 1.2 s: 0.6 s after the speech before the join (its
    # padding and 0.2 s more) and 0.6 s before the speech after it.
    audio = noise(40)
    [window] = speech_windows(audio, [(2 * SR, 5 * SR), (20 * SR, 24 * SR)])
    assert _stretches(window) == [(1.6, 5.6), (19.4, 24.4)] and window.duration == 9
    assert window.join_margin == round(0.6 * SR) and _holds_its_stretches(window, audio)
    assert window.source_seconds(3.5) == 19.4 and window.source_seconds(4.5, closing=True) == 5.6


def test_a_window_maps_its_own_time_back_to_the_audio():
    audio = noise(40)
    [window] = speech_windows(audio, [(2 * SR, 5 * SR), (20 * SR, 24 * SR), (30 * SR, 31 * SR)], pad_seconds=0,
                              kept_pause_seconds=0)
    assert window.duration == 8 and (window.start, window.end) == (2, 31)
    assert window.source_seconds(0.0) == 2 and window.source_seconds(1.5) == 3.5
    # At a join a start is the next stretch's first sample, an end the last stretch's end.
    assert window.source_seconds(3.0) == 20 and window.source_seconds(3.0, closing=True) == 5
    assert window.source_seconds(6.25) == 23.25 and window.source_seconds(7.5) == 30.5
    assert window.source_seconds(8.0, closing=True) == 31
    # The rest of a window (the seek decodes it again) keeps the map.
    rest = window.tail(int(4.5 * SR))
    assert (rest.start, rest.end, rest.duration) == (21.5, 31, 3.5)
    assert rest.source_seconds(2.5) == 30 and rest.source_seconds(2.5, closing=True) == 24
    assert np.array_equal(rest.samples, window.samples[int(4.5 * SR) :])
    assert window.tail(int(3 * SR)).joins == ((4 * SR, 30 * SR),) and window.tail(int(3 * SR)).start == 20


def test_a_window_cut_at_some_of_its_joins_keeps_its_map():
    audio = noise(60)
    regions = [(0, 4 * SR), (10 * SR, 13 * SR), (20 * SR, 25 * SR), (40 * SR, 42 * SR)]
    [window] = speech_windows(audio, regions, pad_seconds=0, kept_pause_seconds=0)
    parts = window.split([7 * SR])  # the join before the third stretch
    assert [_stretches(p) for p in parts] == [[(0, 4), (10, 13)], [(20, 25), (40, 42)]]
    assert parts[1].source_seconds(5.5) == 40.5 and parts[0].end == 13
    stretches = window.split([o for o, _ in window.joins])
    assert [_stretches(p) for p in stretches] == [[(0, 4)], [(10, 13)], [(20, 25)], [(40, 42)]]
    for cut in (parts, stretches):
        assert np.array_equal(np.concatenate([p.samples for p in cut]), window.samples)
        assert all(_holds_its_stretches(p, audio) for p in cut)


def test_times_in_the_silence_around_a_join_belong_to_the_speech_on_their_side():
    audio = noise(40)
    # Regions padded by 0.5 s: the window keeps 0.5 s of silence on each side of the join.
    [window] = speech_windows(audio, [(int(2.5 * SR), int(4.5 * SR)), (int(20.5 * SR), int(23.5 * SR))],
                              pad_seconds=0.5, kept_pause_seconds=1.0)
    assert window.join_margin == SR // 2 and window.joins == ((3 * SR, 20 * SR),)
    # A start in the silence before the join opens the speech after it, an end in the silence
    # after it closes the speech before it; further away, or on their own side, times map as
    # they are.
    assert window.source_seconds(2.6) == 20 and window.source_seconds(2.4) == 4.4
    assert window.source_seconds(3.4, closing=True) == 5 and window.source_seconds(3.6, closing=True) == 20.6
    assert window.source_seconds(3.4) == 20.4 and window.source_seconds(2.6, closing=True) == 4.6
    # The rest of the window from inside the margin starts where its samples do.
    assert window.tail(int(2.75 * SR)).start == 4.75


def test_a_word_is_never_stretched_over_a_left_out_pause():
    audio = noise(40)
    [window] = speech_windows(audio, [(2 * SR, 5 * SR), (20 * SR, 24 * SR)])  # join at 4.0 s, 0.6 s kept each side
    # Mostly after the join: it starts where the speech after it is padded from; mostly before:
    # it ends where the speech before it stops being padded; apart from a join: as it is.
    assert window.source_span(3.3, 4.8) == (20.0, 20.2)
    assert window.source_span(3.0, 4.3) == (4.6, 5.0)
    assert window.source_span(1.0, 2.0) == (2.6, 3.6)


def test_speech_with_no_pause_is_cut_inside_at_a_quiet_point():
    audio = noise(80)
    audio[50 * SR - 1600 : 50 * SR] = 0.0  # the quiet 100 ms before the 30 s limit of a window opening at 20 s
    windows = speech_windows(audio, [(20 * SR, 75 * SR)], pad_seconds=0)
    assert len(windows) == 2 and windows[0].start_sample == 20 * SR and not windows[0].joins
    assert windows[1].start_sample == 50 * SR - 800
    assert windows[1].start_sample + windows[1].samples.shape[0] == 75 * SR
    assert speech_windows(audio, []) == []
    breath = noise(80)
    breath[46 * SR - 1600 : 46 * SR] = 0.0  # 4 s before the limit: a breath between sentences is found
    assert speech_windows(breath, [(20 * SR, 75 * SR)], pad_seconds=0)[1].start_sample == 46 * SR - 800


def test_padding_widens_regions_and_splits_a_short_silence_between_them():
    # Padded by 4 samples: the first at the audio's start, the gap of 6 between the second and
    # third (under twice the padding) shared half and half, the last at the audio's end.
    assert pad_regions([(2, 10), (20, 30), (36, 40)], 4, 42) == [(0, 14), (16, 33), (33, 42)]
    assert pad_regions([], 4, 42) == []


def test_a_word_that_opens_speech_never_starts_after_the_speech_does():
    words = [Word("Fine.", 1.50, 1.90, 0.9), Word("What", 2.00, 2.20, 0.9), Word("Good.", 4.30, 4.60, 0.9)]
    speech = [(1.00, 2.40), (4.00, 5.00)]
    snapped = snap_to_speech_onsets(words, speech)
    assert [w.start for w in snapped] == [1.00, 2.00, 4.00]  # late openers move back; "What" stays
    assert [w.end for w in snapped] == [w.end for w in words]
    early = [Word("I", 3.70, 4.20, 0.9)]  # starts in the pause before the speech: left (the VAD hears onsets late)
    assert snap_to_speech_onsets(early, speech) == early
    stretched = [Word("Fine.", 1.50, 1.90, 0.9), Word("My", 2.80, 4.30, 0.9)]  # DTW took most of the pause
    assert [w.start for w in snap_to_speech_onsets(stretched, speech)] == [1.00, 3.60]
    far = [Word("So", 6.30, 6.50, 0.9)]  # more than a second after the onset: not the word that opened it
    assert snap_to_speech_onsets(far, [(5.00, 7.00)]) == far


@pytest.mark.parametrize("first_seconds", [None, 10.0], ids=["full-first", "short-first"])
@pytest.mark.parametrize("join_long_pauses", [True, False], ids=["joined", "apart"])
def test_windows_handed_out_as_regions_arrive_are_the_windows_of_all_regions_at_once(join_long_pauses, first_seconds):
    """A long file's windows are planned while it is still scanned (SpeechWindowPacker): fed
    the regions found so far, a few more each time, the windows it hands out before the end
    and those it finishes with are speech_windows' for every region at once, pauses of every
    length and speech that runs past a window included."""
    rng = np.random.default_rng(3)
    audio = noise(600, seed=1)
    regions, t = [], 1.0
    while t < 580:
        length = rng.choice([0.6, 3.0, 9.0, 41.0], p=[0.3, 0.4, 0.25, 0.05])
        regions.append((int(t * SR), int(min(t + length, 598) * SR)))
        t += length + rng.choice([0.2, 0.9, 1.5, 2.5, 8.0])
    want = speech_windows(audio, regions, join_long_pauses=join_long_pauses, first_seconds=first_seconds)
    assert len(want) > 15 and any(w.joins for w in want) == join_long_pauses
    for step in (1, 2, 7):
        packer = SpeechWindowPacker(audio, SR, 30.0, 0.4, 1.8, 1.2, join_long_pauses, first_seconds)
        got = []
        for known in range(step, len(regions), step):
            got += packer.windows_final(regions[:known])
        got += packer.finish(regions)
        assert [(w.start_sample, w.samples.shape[0], w.joins) for w in got] == \
            [(w.start_sample, w.samples.shape[0], w.joins) for w in want]
        assert all(np.array_equal(g.samples, w.samples) for g, w in zip(got, want))


def test_a_short_first_window_changes_only_the_first_window():
    """A long file's first window holds at most first_seconds of speech (cut between regions),
    so its text comes early; the windows after it pack as full as ever, and every region is
    in exactly one window."""
    audio = noise(200)
    regions = [(int((1 + 4 * i) * SR), int((4 + 4 * i) * SR)) for i in range(45)]  # 3 s said, 1 s pause
    usual = speech_windows(audio, regions, pad_seconds=0, long_pause_seconds=3.0)
    short = speech_windows(audio, regions, pad_seconds=0, long_pause_seconds=3.0, first_seconds=10.0)
    assert usual[0].samples.shape[0] > 20 * SR
    assert 6 * SR <= short[0].samples.shape[0] <= 10 * SR
    assert all(w.samples.shape[0] > 20 * SR for w in short[1:-1])
    assert len(usual) <= len(short) <= len(usual) + 1
    covered = [(w.start_sample, w.start_sample + w.samples.shape[0]) for w in short]
    assert all(sum(a <= start and end <= b for a, b in covered) == 1 for start, end in regions)
    [alone] = speech_windows(audio, [(SR, 25 * SR)], pad_seconds=0, first_seconds=10.0)  # one region, longer
    assert alone.samples.shape[0] == 24 * SR


def test_a_released_window_keeps_its_map_and_is_rebuilt_from_the_audio():
    """A decoded window is kept without its samples (its time map only) and made again from the
    request's audio when it must be decoded again (a language outlier): the same samples, the
    same map."""
    audio = noise(60)
    [window] = speech_windows(audio, [(2 * SR, 5 * SR), (20 * SR, 24 * SR), (30 * SR, 31 * SR)])
    assert len(window.joins) == 2
    released = window.released()
    assert released.samples is None
    assert (released.start_sample, released.length, released.joins) == \
        (window.start_sample, window.samples.shape[0], window.joins)
    assert released.duration == window.duration and released.end == window.end
    assert released.source_seconds(5.0) == window.source_seconds(5.0)
    assert released.stretches == [(int(1.6 * SR), int(5.6 * SR)), (int(19.4 * SR), int(24.6 * SR)),
                                  (int(29.4 * SR), int(31.4 * SR))]
    rebuilt = released.rebuilt(audio)
    assert np.array_equal(rebuilt.samples, window.samples)
    assert (rebuilt.start_sample, rebuilt.joins, rebuilt.join_margin) == \
        (window.start_sample, window.joins, window.join_margin)
