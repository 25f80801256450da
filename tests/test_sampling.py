"""Repeat-factor sampling (LVIS): the class presence stored in the index files at
conversion, the repeat factors, and their effect on class frequency in `tf_dataset` and
`keras_dataset` streams, tested statistically; deterministic and resumable."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from PIL import Image

import readers
from readers.augment import Augment
from readers.index import ref_classes
from readers.sampling import epoch_counts, repeat_factors

import _shards

COLORS = [(0, 0, 0), (200, 30, 30), (30, 200, 30), (30, 30, 200)]
N = 40
RARE = range(4)            # class 3 ("rare") is in samples 0-3: f = 0.1
MID = range(4, 16)         # class 2 is in samples 4-15: f = 0.3


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A converted CamVid-style dataset: classes 0 and 1 everywhere, class 2 in 12 of 40
    images, class 3 in 4 of 40 (textured images, blocky masks)."""
    from converter.convert import convert
    from converter.options import OutputOptions, RunOptions, SourceSpec

    tmp = tmp_path_factory.mktemp("rfs")
    src = tmp / "src"
    (src / "train").mkdir(parents=True)
    (src / "train_labels").mkdir()
    rng = np.random.default_rng(3)
    truth = np.zeros((N, 4), bool)
    for i in range(N):
        cmap = np.zeros((16, 16), np.int64)
        cmap[:, 8:] = 1
        if i in MID:
            cmap[:6, :6] = 2
        if i in RARE:
            cmap[10:, 10:] = 3
        truth[i] = [(cmap == c).any() for c in range(4)]
        image = (rng.integers(0, 256, (16, 16, 3)) // 2 + np.array(COLORS, np.int64)[cmap] // 2).astype(np.uint8)
        Image.fromarray(image).save(src / "train" / f"s{i:02d}.png")
        Image.fromarray(np.array(COLORS, np.uint8)[cmap]).save(src / "train_labels" / f"s{i:02d}_L.png")
    (src / "class_dict.csv").write_text("name,r,g,b\n" + "".join(
        f"c{k},{r},{g},{b}\n" for k, (r, g, b) in enumerate(COLORS)))
    out = tmp / "out"
    convert(SourceSpec(root=str(src)), str(out), OutputOptions(size=(16, 16), image_filter="nearest"),
            RunOptions(workers=1, shard_size_bytes=7 * 1024))
    ds = readers.open(out)
    key_index = {f"train/s{i:02d}.png": i for i in range(N)}
    return ds, truth, key_index


def test_conversion_stores_each_samples_classes_in_the_index(converted):
    ds, truth, key_index = converted
    shards = ds.shards("train")
    assert len(shards) > 1
    for shard in shards:
        presence = ref_classes(shard, ds.num_classes)
        for rec, row in zip(ds._iter_records([shard]), presence):
            assert list(row) == [bool((rec.mask == c).any()) for c in range(4)]  # from the stored mask
            assert list(row) == list(truth[key_index[rec.key]])  # and from the sources


def test_repeat_factors_follow_the_lvis_rule():
    presence = np.zeros((10, 3), bool)
    presence[:, 0] = True           # f = 1.0 -> 1
    presence[:2, 1] = True          # f = 0.2 -> sqrt(0.5 / 0.2)
    presence[:1, 2] = True          # f = 0.1 -> sqrt(5)
    r = repeat_factors(presence, 0.5)
    np.testing.assert_allclose(r, [np.sqrt(5), np.sqrt(2.5)] + [1.0] * 8)
    assert repeat_factors(np.zeros((3, 2), bool), 0.5).tolist() == [1.0, 1.0, 1.0]  # no class: 1


def test_epoch_counts_have_a_fixed_length_and_the_expected_mean():
    r = np.array([np.sqrt(5), np.sqrt(2.5)] + [1.0] * 8)
    draws = round(r.sum())
    counts = np.stack([epoch_counts(r, seed=1, epoch=e) for e in range(2000)])
    assert (counts.sum(axis=1) == draws).all()
    expected = r * draws / r.sum()
    assert (np.abs(counts - expected) < 1).all()  # floor or ceil of the expectation, every epoch
    np.testing.assert_allclose(counts.mean(axis=0), expected, rtol=0.03)
    np.testing.assert_array_equal(epoch_counts(r, 1, 7), epoch_counts(r, 1, 7))


def _samples(ds, key_index, batches):
    """Sample numbers of a stream of (compact) batches, identified by image content."""
    by_hash = {hashlib.sha256(np.ascontiguousarray(rec.image).tobytes()).hexdigest(): key_index[rec.key]
               for rec in ds.records("train")}
    return [by_hash[hashlib.sha256(np.ascontiguousarray(img).tobytes()).hexdigest()]
            for x in batches for img in np.asarray(x)]


@pytest.mark.parametrize("reader", ["tf", "keras"])
def test_rare_class_frequency_rises_as_expected(converted, reader):
    ds, truth, key_index = converted
    t, epochs = 0.4, 12
    kw = dict(seed=5, one_hot=False, normalize=False, sampling="repeat-factor", repeat_threshold=t)
    if reader == "tf":
        pipe = ds.tf_dataset("train", 8, **kw)
        stream = [[x for x, _ in pipe] for _ in range(epochs)]
    else:
        seq = ds.keras_dataset("train", 8, **kw)
        stream = []
        for _ in range(epochs):
            stream.append([seq[i][0] for i in range(len(seq))])
            seq.on_epoch_end()
    r = np.where(truth[:, 3], 2.0, np.where(truth[:, 2], np.sqrt(0.4 / 0.3), 1.0))  # the LVIS rule by hand
    draws = round(r.sum())
    per_epoch = [_samples(ds, key_index, batches) for batches in stream]
    assert all(len(p) == draws for p in per_epoch)  # fixed epoch length: sum of the factors
    drawn = np.concatenate(per_epoch)
    rare_share = truth[drawn, 3].mean()
    expected = r[truth[:, 3]].sum() / r.sum()  # 8 / 45.9: 0.174, against 0.1 uniform
    assert abs(rare_share - expected) < 0.01  # systematic sampling: within a draw per epoch
    assert rare_share > 0.15 and truth[:, 3].mean() == 0.1
    assert per_epoch[0] != per_epoch[1]


def test_sampling_is_deterministic_and_resumable(converted):
    ds, _, _ = converted
    kw = dict(seed=2, one_hot=False, normalize=False, sampling="repeat-factor", repeat_threshold=0.4)
    full = [np.asarray(x) for x, _ in ds.tf_dataset("train", 8, epoch=3, **kw)]
    again = [np.asarray(x) for x, _ in ds.tf_dataset("train", 8, epoch=3, **kw)]
    tail = [np.asarray(x) for x, _ in ds.tf_dataset("train", 8, epoch=3, start_step=4, **kw)]
    assert all(np.array_equal(a, b) for a, b in zip(full, again)) and len(full) == len(again)
    assert len(tail) == len(full) - 4 and all(np.array_equal(a, b) for a, b in zip(full[4:], tail))


def test_datasets_without_stored_classes_get_a_named_error(tmp_path):
    _shards.write_dataset(tmp_path / "old", "tfrecord", splits={"train": 6})
    ds = readers.open(tmp_path / "old")
    with pytest.raises(ValueError, match="Re-convert it with `imgshard convert ... --rebuild`"):
        ds.tf_dataset("train", 2, seed=0, sampling="repeat-factor", repeat_threshold=0.1)
    with pytest.raises(ValueError, match="repeat_threshold must be a number in"):
        ds.keras_dataset("train", 2, seed=0, sampling="repeat-factor")
    with pytest.raises(ValueError, match="sampling must be one of"):
        ds.tf_dataset("train", 2, sampling="balanced")


@pytest.mark.parametrize("reader", ["tf", "keras"])
def test_repeats_of_a_sample_in_an_epoch_get_their_own_augmentation(converted, reader):
    """A sample drawn several times in one epoch (repeat-factor sampling, `readers.mix`) is
    augmented with fresh draws per copy, not the same flip / crop every time (the first copy
    keeps the draws uniform sampling gives it)."""
    ds, truth, key_index = converted
    kw = dict(seed=7, one_hot=False, normalize=False, sampling="repeat-factor", repeat_threshold=1.0,
              augment=Augment(hflip=0.5))
    if reader == "tf":
        batches = [np.asarray(x) for x, _ in ds.tf_dataset("train", 8, **kw)]
    else:
        seq = ds.keras_dataset("train", 8, **kw)
        batches = [np.asarray(seq[i][0]) for i in range(len(seq))]
    plain = [np.asarray(x) for x, _ in ds.tf_dataset("train", 8, seed=0, one_hot=False, normalize=False)]
    by_image = {}
    for x in plain:
        for img in x:
            by_image[img.tobytes()] = (img.tobytes(), False)
            by_image[img[:, ::-1].tobytes()] = (img.tobytes(), True)
    flips: dict[bytes, list] = {}
    for x in batches:
        for img in x:
            source, flipped = by_image[np.ascontiguousarray(img).tobytes()]
            flips.setdefault(source, []).append(flipped)
    repeated = [f for f in flips.values() if len(f) > 1]
    assert len(repeated) >= 8
    assert any(len(set(f)) == 2 for f in repeated)  # some copy flipped, another not
