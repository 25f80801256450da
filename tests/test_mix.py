"""`readers.mix`: datasets mixed in given proportions, deterministic and resumable; the
proportions tested statistically (each epoch: the weights to within a sample)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import readers
from readers.augment import Augment

import _shards


@pytest.fixture
def pair(tmp_path):
    _, a = _shards.write_dataset(tmp_path / "a", "tfrecord", splits={"train": 30}, height=12, width=10,
                                 records_per_shard=7, num_classes=3, seed=1)
    _, b = _shards.write_dataset(tmp_path / "b", "tfrecord", splits={"train": 10}, height=12, width=10,
                                 records_per_shard=4, num_classes=3, seed=2)
    origin = {hashlib.sha256(s.image.tobytes()).hexdigest(): "a" for s in a["train"]}
    origin.update({hashlib.sha256(s.image.tobytes()).hexdigest(): "b" for s in b["train"]})
    return readers.open(tmp_path / "a"), readers.open(tmp_path / "b"), origin


def _origins(origin, batches):
    return [origin[hashlib.sha256(np.ascontiguousarray(img).tobytes()).hexdigest()]
            for x in batches for img in np.asarray(x)]


@pytest.mark.parametrize("reader", ["tf", "keras"])
def test_each_epoch_draws_the_weights_share_from_each_dataset(pair, reader):
    a, b, origin = pair
    mixed = readers.mix([a, b], weights=[0.3, 0.7])  # b is 1/4 of the samples, 70 % of the draws
    if reader == "tf":
        pipe = mixed.tf_dataset("train", 8, seed=3, one_hot=False, normalize=False)
        epochs = [_origins(origin, [x for x, _ in pipe]) for _ in range(6)]
    else:
        seq = mixed.keras_dataset("train", 8, seed=3, one_hot=False, normalize=False)
        epochs = []
        for _ in range(6):
            epochs.append(_origins(origin, [seq[i][0] for i in range(len(seq))]))
            seq.on_epoch_end()
    for drawn in epochs:
        assert len(drawn) == 40  # as many draws as samples in both
        assert abs(drawn.count("b") - 28) <= 2  # 0.7 x 40 (systematic sampling: a draw or two)
    assert abs(np.mean([d.count("b") for d in epochs]) - 28) <= 0.5
    assert epochs[0] != epochs[1]


def test_mixed_stream_is_deterministic_and_resumable(pair):
    a, b, _ = pair
    aug = Augment(hflip=0.5, crop=(8, 8))
    mixed = readers.mix([a, b], weights=[1, 1])
    full = [np.asarray(x) for x, _ in mixed.tf_dataset("train", 6, seed=9, augment=aug, epoch=2)]
    tail = [np.asarray(x) for x, _ in mixed.tf_dataset("train", 6, seed=9, augment=aug, epoch=2, start_step=3)]
    again = [np.asarray(x) for x, _ in readers.mix([a, b], [1, 1]).tf_dataset("train", 6, seed=9, augment=aug,
                                                                              epoch=2)]
    assert len(full) == 7 and all(np.array_equal(p, q) for p, q in zip(full, again))
    assert len(tail) == 4 and all(np.array_equal(p, q) for p, q in zip(full[3:], tail))


def test_datasets_must_match_and_weights_be_positive(pair, tmp_path):
    a, b, _ = pair
    _shards.write_dataset(tmp_path / "c", "tfrecord", splits={"train": 4}, height=12, width=10, num_classes=5)
    with pytest.raises(ValueError, match=r"datasets\[1\] .* must have the same format"):
        readers.mix([a, readers.open(tmp_path / "c")], [0.5, 0.5])
    with pytest.raises(ValueError, match="weights must be positive numbers"):
        readers.mix([a, b], [1, 0])
    with pytest.raises(ValueError, match="same length"):
        readers.mix([a, b], [1])
