"""Balanced sampling: repeat-factor sampling (LVIS) from the class presence in the index files.

`repeat_factors(presence, t)`: sample i's repeat factor is
``r_i = max over the classes c present in i of max(1, sqrt(t / f(c)))``, where ``f(c)``
is the fraction of the split's samples containing c (Gupta et al., LVIS, 2019; as
mmsegmentation's `RareClassSampleDataset` / detectron2's `RepeatFactorTrainingSampler`).
A sample with no class (all ignored) keeps 1.

`epoch_counts(r, seed, epoch)`: how often each sample appears in an epoch, a pure function
of (seed, epoch): systematic sampling over the samples in a random order, so an epoch has
exactly ``M = round(sum(r))`` draws (a fixed epoch length, as Keras needs) and sample i
appears ``floor(r_i * M / sum(r))`` or one more times (expected ``r_i * M / sum(r)``).
The repeated samples are then shuffled like any epoch (`readers.order.epoch_order`).
"""

from __future__ import annotations

import numpy as np

#: Names of the `sampling` argument of `tf_dataset` / `keras_dataset`.
SAMPLING_MODES = ("uniform", "repeat-factor")


def check_sampling(sampling: object, repeat_threshold: object) -> None:
    if sampling not in SAMPLING_MODES:
        raise ValueError(f"sampling must be one of {SAMPLING_MODES}. Received: sampling={sampling!r}")
    if sampling == "repeat-factor":
        ok = (not isinstance(repeat_threshold, bool) and isinstance(repeat_threshold, (int, float, np.floating))
              and 0 < float(repeat_threshold) <= 1)
        if not ok:
            raise ValueError("repeat_threshold must be a number in (0, 1] with sampling='repeat-factor' (LVIS uses "
                             f"0.001). Received: repeat_threshold={repeat_threshold!r}")


def repeat_factors(presence: np.ndarray, threshold: float) -> np.ndarray:
    """float64 repeat factor per sample from (samples, classes) bool presence."""
    presence = np.asarray(presence, bool)
    n = max(1, len(presence))
    freq = presence.sum(axis=0) / n
    with np.errstate(divide="ignore"):
        per_class = np.maximum(1.0, np.sqrt(threshold / np.where(freq > 0, freq, np.inf)))
    return np.where(presence, per_class[None, :], 1.0).max(axis=1, initial=1.0)


def epoch_length(factors: np.ndarray) -> int:
    """Draws per epoch: round(sum of the repeat factors), at least 1."""
    return max(1, int(round(float(np.sum(factors)))))


def epoch_counts(factors: np.ndarray, seed: int, epoch: int) -> np.ndarray:
    """int64 appearances of each sample in `epoch` (see the module doc)."""
    n = len(factors)
    draws = epoch_length(factors)
    rng = np.random.default_rng([int(seed), int(epoch), 0x7266])
    order = rng.permutation(n)
    edges = np.concatenate([[0.0], np.cumsum(np.asarray(factors, np.float64)[order])])
    edges *= draws / edges[-1]
    points = rng.random() + np.arange(draws)
    hits = np.diff(np.searchsorted(points, edges, side="left"))
    counts = np.zeros(n, np.int64)
    counts[order] = hits
    return counts


__all__ = ["SAMPLING_MODES", "check_sampling", "epoch_counts", "epoch_length", "repeat_factors"]
