"""Voices grouped into speakers: which window embeddings belong to the same voice, and how many
voices there are, with scipy's hierarchical clustering (a kept library; average linkage on
cosine distance does not need the number of speakers in advance)."""

from __future__ import annotations

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.optimize import linear_sum_assignment

# Average cosine distance above which two groups of windows are different voices. Windows of
# one voice sit at 0.13-0.23 on average from one another, distinct voices at 0.45 and more; two
# voices closer than this (seen: two Festival male diphone voices, at 0.37) count as one unless
# the request bounds the number of speakers.
SAME_VOICE_DISTANCE = 0.35
# A known speaker's reference names a cluster only this close to it (cosine similarity).
KNOWN_VOICE_SIMILARITY = 0.7
REFINE_ROUNDS = 3
# The tree's pairwise distances grow with the square of the windows: 4000 windows (27 minutes of
# speech at a window every 0.4 s) need 64 MB.
MAX_TREE_WINDOWS = 4000
MIN_SPEAKER_WINDOWS = 4  # a speaker has at least this many windows (~1.6 s of speech and more)


def cluster(embeddings: np.ndarray, min_speakers: int | None = None, max_speakers: int | None = None,
            threshold: float = SAME_VOICE_DISTANCE) -> np.ndarray:
    """A speaker index for every row of ``embeddings`` (L2-normalised), numbered 0, 1, ... in
    order of first appearance. The number of speakers is where the average-linkage tree's
    distance passes ``threshold``, brought within [min_speakers, max_speakers] when given.
    Each window then moves to the speaker whose centroid it is closest to (a few rounds): the
    tree's early merges are final, and a window merged into the wrong branch is put right."""
    n = embeddings.shape[0]
    if n < 2:
        return np.zeros(n, dtype=np.int64)
    if n > MAX_TREE_WINDOWS:  # long audio: the tree over windows spread evenly, the rest joins the nearest
        sample = np.linspace(0, n - 1, MAX_TREE_WINDOWS).round().astype(np.int64)
        sampled = cluster(embeddings[sample], min_speakers, max_speakers, threshold)
        return in_order_of_appearance(np.argmax(embeddings @ centroids(embeddings[sample], sampled).T, axis=1))
    tree = linkage(embeddings.astype(np.float64), method="average", metric="cosine")
    labels = fcluster(tree, t=threshold, criterion="distance")
    found = int(labels.max())
    wanted = min(max(found, min_speakers or 1), max_speakers or n, n)
    if wanted != found:
        labels = fcluster(tree, t=wanted, criterion="maxclust")
    labels = _absorb_small(embeddings, labels - 1, keep=min_speakers or 1)
    for _ in range(REFINE_ROUNDS):
        moved = np.argmax(embeddings @ centroids(embeddings, labels).T, axis=1)
        if np.array_equal(moved, labels) or len(np.unique(moved)) < len(np.unique(labels)):
            break  # settled, or a speaker would vanish (the count was decided above)
        labels = moved
    return in_order_of_appearance(labels)


def _absorb_small(embeddings: np.ndarray, labels: np.ndarray, keep: int) -> np.ndarray:
    """Clusters of fewer than MIN_SPEAKER_WINDOWS windows join the nearest larger one, smallest
    first, while more than ``keep`` speakers remain: such clusters are windows that straddle a
    change of speaker, or a word too short to embed well, not a voice of their own."""
    labels = labels.copy()
    while True:
        sizes = np.bincount(labels)
        present = np.flatnonzero(sizes)
        small = [c for c in present if sizes[c] < MIN_SPEAKER_WINDOWS]
        large = [c for c in present if sizes[c] >= MIN_SPEAKER_WINDOWS]
        if not small or not large or len(present) <= keep:
            return np.unique(labels, return_inverse=True)[1]
        smallest = min(small, key=lambda c: sizes[c])
        means = centroids(embeddings, labels)
        labels[labels == smallest] = large[int(np.argmax(means[large] @ means[smallest]))]


def centroids(embeddings: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The normalised mean embedding of each label 0..max (a label with no rows: zeros)."""
    sums = np.zeros((int(labels.max()) + 1, embeddings.shape[1]), dtype=np.float64)
    np.add.at(sums, labels, embeddings)
    norms = np.linalg.norm(sums, axis=1, keepdims=True)
    return (sums / np.where(norms > 0, norms, 1)).astype(np.float32)


def in_order_of_appearance(labels: np.ndarray) -> np.ndarray:
    _, first = np.unique(labels, return_index=True)
    order = np.argsort(np.argsort(first))  # the rank of each distinct label by its first row
    return order[np.unique(labels, return_inverse=True)[1]]


def match_known(speaker_centroids: np.ndarray, references: np.ndarray,
                min_similarity: float = KNOWN_VOICE_SIMILARITY) -> dict[int, int]:
    """Speaker index -> reference index, one to one, maximising the total similarity; a pair
    less similar than ``min_similarity`` is left unmatched."""
    if not len(speaker_centroids) or not len(references):
        return {}
    similarity = speaker_centroids @ references.T
    rows, cols = linear_sum_assignment(-similarity)
    return {int(r): int(c) for r, c in zip(rows, cols) if similarity[r, c] >= min_similarity}
