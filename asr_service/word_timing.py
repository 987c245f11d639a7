"""Word times from cross-attention: dynamic time warping over the alignment heads.

The algorithm is openai/whisper's (timing.py), written here in numpy: the alignment heads'
attention rows for the predicted text tokens (and the end token) are normalised per head,
median-filtered along time, averaged, and a monotonic path from the first token at the first
frame to the end token at the last frame is found by DTW. A token starts where the path
first reaches its row; a word spans its tokens. No DTW library: it is a dozen lines of numpy
with the inner recurrence vectorised (prefix minima), and it runs on small matrices.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

FRAMES_PER_SECOND = 50  # encoder frames: 1500 per 30 s
MEDIAN_WIDTH = 7


@dataclass(frozen=True)
class Word:
    word: str
    start: float  # seconds from the start of the audio window
    end: float
    # The mean of its tokens' probabilities under the kept decode (faster-whisper's measure):
    # how sure the model was of the word.
    probability: float


def _median_filter(x: np.ndarray, width: int) -> np.ndarray:
    """Median over the last axis, edges reflected (like openai/whisper's)."""
    if x.shape[-1] <= width // 2:
        return x
    pad = width // 2
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)], mode="reflect")
    return np.median(np.lib.stride_tricks.sliding_window_view(padded, width, axis=-1), axis=-1)


def dtw_path(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cheapest monotonic path through ``cost`` [N, M] from (0, 0) to (N-1, M-1), moving
    right, down or diagonally. Returns (row indices, column indices) along the path."""
    n, m = cost.shape
    total = np.full((n, m), np.inf)
    total[0] = np.cumsum(cost[0])
    for i in range(1, n):
        from_above = np.minimum(total[i - 1], np.concatenate(([np.inf], total[i - 1][:-1]))) + cost[i]
        # Moves within row i: total[i, j] = min over k <= j of from_above[k] + cost[i, k+1..j].
        running = np.cumsum(cost[i])
        total[i] = running + np.minimum.accumulate(from_above - running)
    rows, cols = [n - 1], [m - 1]
    i, j = n - 1, m - 1
    while i > 0 or j > 0:
        options = []
        if i > 0 and j > 0:
            options.append((total[i - 1, j - 1], i - 1, j - 1))
        if i > 0:
            options.append((total[i - 1, j], i - 1, j))
        if j > 0:
            options.append((total[i, j - 1], i, j - 1))
        _, i, j = min(options)
        rows.append(i)
        cols.append(j)
    return np.array(rows[::-1]), np.array(cols[::-1])


def token_start_times(attention: np.ndarray, n_frames: int) -> np.ndarray:
    """``attention`` [heads, tokens + 1, frames] (the last row: the end token) -> the time at
    which each of the tokens + 1 rows starts, in seconds."""
    weights = attention[:, :, :n_frames]
    mean = weights.mean(axis=-2, keepdims=True)
    std = weights.std(axis=-2, keepdims=True) + 1e-6
    weights = _median_filter((weights - mean) / std, MEDIAN_WIDTH)
    matrix = weights.mean(axis=0)
    rows, cols = dtw_path(-matrix.astype(np.float64))
    jumps = np.concatenate(([True], np.diff(rows) > 0))
    return cols[jumps] / FRAMES_PER_SECOND


SENTENCE_END = tuple(".。!！?？")


def clamp_at_sentence_ends(words: list[Word]) -> list[Word]:
    """DTW hands a pause to the word beside it. Where a sentence ends, a word longer than
    twice the median word (median capped at 0.7 s) is cut back to that length: the word that
    ends the sentence keeps its start, the word that opens the next keeps its end (openai/
    whisper's correction)."""
    durations = [w.end - w.start for w in words if w.end > w.start]
    if not durations:
        return words
    longest = 2 * min(0.7, float(np.median(durations)))
    out = list(words)
    for i, w in enumerate(out):
        if w.end - w.start <= longest:
            continue
        if w.word.rstrip().endswith(SENTENCE_END):
            out[i] = replace(w, end=round(w.start + longest, 2))
        elif i == 0 or out[i - 1].word.rstrip().endswith(SENTENCE_END):
            out[i] = replace(w, start=round(w.end - longest, 2))
    return out


def word_times(words: list[tuple[str, int]], token_logprobs: list[float], attention: np.ndarray,
               duration: float) -> list[Word]:
    """``words``: (text, number of tokens) in order, covering every row of ``attention`` but
    the last (the end token); ``token_logprobs``: those tokens' log-probabilities. Times are
    relative to the audio window."""
    n_frames = max(1, min(attention.shape[-1], int(round(duration * FRAMES_PER_SECOND))))
    starts = token_start_times(attention, n_frames)
    out, index = [], 0
    for text, n_tokens in words:
        start, end = float(starts[index]), float(starts[index + n_tokens])
        probability = float(np.mean(np.exp(token_logprobs[index : index + n_tokens])))
        out.append(Word(text, round(start, 2), round(max(end, start), 2), round(probability, 4)))
        index += n_tokens
    return clamp_at_sentence_ends(out)


# How far a word's start may move back to where the VAD hears speech start: more, and the word
# is likely not the one that opens the speech (DTW lost its place), so it is left alone.
MAX_ONSET_SHIFT_S = 1.0
# How much earlier than where the VAD hears its speech start an opening word may start.
EARLY_ONSET_S = 0.4


def snap_to_speech_onsets(words: list[Word], speech: list[tuple[float, float]]) -> list[Word]:
    """A word that opens a stretch of speech (``speech``: sorted (start, end) seconds as the
    VAD hears it, no padding) cannot start after the speech does: DTW often starts the first
    word after a pause a few hundred milliseconds late, and such a start moves back to the
    onset. Forward only as far as EARLY_ONSET_S before the onset: the VAD hears voicing, so it
    tends to hear a word begin late itself (a fricative or a stop before the vowel), but DTW
    also stretches an opening word back over a second or more of the pause before it. A word
    reaching into a stretch from an earlier word's speech is not an opening word and stays."""
    out = list(words)
    k = 0
    previous_end = 0.0  # where the speech before this stretch ended
    for start, end in speech:
        while k < len(out) and out[k].end <= start:
            k += 1
        if k == len(out):
            break
        word = out[k]
        opens = k == 0 or out[k - 1].end <= start
        if opens and start < word.start < min(end, start + MAX_ONSET_SHIFT_S):
            out[k] = replace(word, start=round(start, 2))
        elif opens and previous_end <= word.start < start - EARLY_ONSET_S:
            out[k] = replace(word, start=round(start - EARLY_ONSET_S, 2))
        previous_end = end
    return out
