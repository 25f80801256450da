"""`readers.mix`: datasets mixed in given proportions, deterministic and resumable; the
proportions tested statistically (each epoch: the weights to within a sample)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import readers
from readers.augment import Augment, augment_sample

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


def _dihedral(image):
    """The 8 flips/quarter turns of a square image, numbered."""
    return [np.rot90(np.flip(image, 1) if f else image, k) for f in (0, 1) for k in range(4)]


@pytest.mark.parametrize("reader", ["tf", "keras"])
def test_datasets_sharing_keys_draw_their_own_augmentation(tmp_path, reader):
    """Keys alike (train/00000.png ... in both), pixels not: the flips and turns of a key's sample
    differ between the datasets; dataset 0 augments as when read alone; the stream replays."""
    _, a = _shards.write_dataset(tmp_path / "a", "tfrecord", splits={"train": 16}, height=8, width=8,
                                 records_per_shard=5, num_classes=3, seed=4)
    _, b = _shards.write_dataset(tmp_path / "b", "tfrecord", splits={"train": 16}, height=8, width=8,
                                 records_per_shard=6, num_classes=3, seed=5)
    assert [s.key for s in a["train"]] == [s.key for s in b["train"]]
    seen = {}  # turned image bytes -> (dataset, key, turn)
    for name, samples in (("a", a["train"]), ("b", b["train"])):
        for s in samples:
            for turn, img in enumerate(_dihedral(s.image)):
                seen.setdefault(np.ascontiguousarray(img).tobytes(), (name, s.key, turn))
    aug = Augment(hflip=0.5, vflip=0.5, rot90=True)
    mixed = readers.mix([readers.open(tmp_path / "a"), readers.open(tmp_path / "b")], weights=[1, 1])

    def stream(**kw):
        if reader == "tf":
            pipe = mixed.tf_dataset("train", 8, seed=7, augment=aug, epoch=1, one_hot=False, normalize=False, **kw)
            return [np.asarray(x) for x, _ in pipe]
        seq = mixed.keras_dataset("train", 8, seed=7, augment=aug, epoch=1, one_hot=False, normalize=False)
        return [np.asarray(seq[i][0]) for i in range(len(seq))]

    batches = stream()
    turns = {}
    for x in batches:
        for img in x:
            name, key, turn = seen[np.ascontiguousarray(np.round(img).astype(np.uint8)).tobytes()]
            turns[name, key] = turn
    assert len(turns) == 32  # weights 1:1 on 16 + 16: each sample once
    keys = [s.key for s in a["train"]]
    differ = sum(turns["a", k] != turns["b", k] for k in keys)
    assert differ >= len(keys) // 2, f"only {differ} of {len(keys)} shared keys were augmented differently"
    for s in a["train"]:  # dataset 0: the draws of its key alone, as before mixing
        alone, _ = augment_sample(aug, s.image, s.mask, key=s.key, seed=7, epoch=1)
        assert np.array_equal(alone, _dihedral(s.image)[turns["a", s.key]])
    again = stream()
    assert all(np.array_equal(p, q) for p, q in zip(batches, again)) and len(again) == len(batches)
    if reader == "tf":
        tail = stream(start_step=2)
        assert len(tail) == 2 and all(np.array_equal(p, q) for p, q in zip(batches[2:], tail))
