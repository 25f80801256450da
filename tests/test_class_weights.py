"""Class statistics on the reader: class_pixel_counts, class_weights, per-pixel sample weights."""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest

import readers
from readers.stats import class_weights, with_sample_weights
from tests._look import add_unused_class, convert_tiny, write_classification


def _counts_from_records(ds, split):
    c = ds.num_classes
    pixels = np.zeros(c, np.int64)
    present = np.zeros(c, np.int64)
    for rec in ds.records(split):
        n = np.bincount(rec.mask.ravel(), minlength=256)[:c]
        pixels += n
        present += n > 0
    return pixels, present


@pytest.fixture
def converted(camvid_src, tmp_path):
    add_unused_class(camvid_src.class_dict_path)  # class 5 never occurs
    convert_tiny(camvid_src.root, tmp_path / "out")
    return readers.open(tmp_path / "out")


def test_class_images_in_manifest_equal_record_counts(converted):
    for split in converted.splits:
        pixels, present = _counts_from_records(converted, split)
        entry = converted.manifest.split(split)
        assert entry.class_images(converted.num_classes) == present.tolist()
        assert converted.class_pixel_counts(split).tolist() == pixels.tolist()


def test_median_frequency_matches_hand_computed(converted):
    pixels, present = _counts_from_records(converted, "train")
    h, w, _ = converted.image_shape
    got = converted.class_weights("train", scheme="median-frequency")
    assert got.dtype == np.float32 and got.shape == (6,)
    # by hand, SegNet: f_c = pixels_c / (pixels of images containing c); w_c = median(f) / f_c
    freqs = [pixels[c] / (present[c] * h * w) for c in range(5)]
    med = sorted(freqs)[2]
    expected = [med / f for f in freqs] + [0.0]
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert got[np.argsort(freqs)[2]] == pytest.approx(1.0)


def test_inverse_frequency_matches_hand_computed(converted):
    pixels, _ = _counts_from_records(converted, "val")
    got = converted.class_weights("val", scheme="inverse-frequency")
    total = pixels.sum()
    present = [c for c in range(6) if pixels[c] > 0]
    expected = [total / (len(present) * pixels[c]) if pixels[c] else 0.0 for c in range(6)]
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    # the average weight of a pixel is 1
    assert float((got[:5] * pixels[:5]).sum() / total) == pytest.approx(1.0, rel=1e-6)


def test_absent_class_gets_zero_weight_not_inf(converted):
    for scheme in ("median-frequency", "inverse-frequency"):
        w = converted.class_weights("train", scheme=scheme)
        assert np.isfinite(w).all()
        assert w[5] == 0.0
        assert (w[:5] > 0).all()


def test_unknown_scheme_is_an_error_listing_the_schemes(converted):
    with pytest.raises(ValueError, match=r"scheme must be one of \['inverse-frequency', 'median-frequency'\]"):
        converted.class_weights("train", scheme="log")


def test_unknown_split_names_the_valid_splits(converted):
    with pytest.raises(KeyError, match="Unknown split 'nope'"):
        converted.class_weights("nope")


def test_old_manifest_without_class_images_falls_back_with_warning(converted):
    path = os.path.join(converted.path, "imgshard.json")
    doc = json.load(open(path))
    for split in doc["splits"].values():
        for shard in split["shards"]:
            del shard["class_images"]
    with open(path, "w") as f:
        json.dump(doc, f)
    ds = readers.open(converted.path)
    pixels = ds.class_pixel_counts("train").astype(float)
    with pytest.warns(UserWarning, match="no per-class image counts"):
        got = ds.class_weights("train")
    freqs = pixels[:5] / pixels.sum()
    np.testing.assert_allclose(got[:5], np.median(freqs) / freqs, rtol=1e-6)


def test_class_weights_function_rejects_negative_counts():
    with pytest.raises(ValueError, match="negative"):
        class_weights([3, -1], "inverse-frequency")


def test_all_absent_gives_all_zero():
    assert class_weights([0, 0, 0]).tolist() == [0.0, 0.0, 0.0]


def test_classification_class_weights_from_label_counts(classification_src, tmp_path):
    manifest = write_classification(classification_src, tmp_path / "cls")
    ds = readers.open(tmp_path / "cls")
    labels = np.bincount([r.label for r in ds.records("train")], minlength=ds.num_classes)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        inv = ds.class_weights("train", scheme="inverse-frequency")
        med = ds.class_weights("train", scheme="median-frequency")
    total = labels.sum()
    np.testing.assert_allclose(inv, total / (len(labels) * labels), rtol=1e-6)
    freqs = labels / total
    np.testing.assert_allclose(med, np.median(freqs) / freqs, rtol=1e-6)
    assert manifest.task == "classification"


def test_weighted_model_fit_uses_per_pixel_class_weights(converted):
    """A real Keras model trains with per-pixel class weights, and the weighted loss Keras
    reports equals the weighted cross-entropy computed by hand."""
    import keras
    import tensorflow as tf

    w = converted.class_weights("train")
    h, wd, _ = converted.image_shape
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((h, wd, 3)),
        keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(converted.num_classes, 1, activation="softmax"),
    ])
    model.compile(optimizer="adam", loss="categorical_crossentropy")
    train = converted.tf_dataset("train", 3, seed=0).map(with_sample_weights(w))
    history = model.fit(train, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()

    data = converted.tf_dataset("val", 2, shuffle=False).map(with_sample_weights(w))
    x, y, sw = next(iter(data))
    assert sw.shape == y.shape[:-1]
    labels = np.argmax(y.numpy(), -1)
    np.testing.assert_allclose(sw.numpy(), w[labels] * (y.numpy().max(-1) > 0), rtol=1e-6)
    probs = model.predict(x, verbose=0)
    ce = -np.log(np.clip((probs * y.numpy()).sum(-1), 1e-7, 1.0))
    expected = float((ce * sw.numpy()).sum() / ce.size)
    got = model.evaluate(tf.data.Dataset.from_tensors((x, y, sw)), verbose=0)
    assert got == pytest.approx(expected, rel=1e-4)
    unweighted = model.evaluate(tf.data.Dataset.from_tensors((x, y)), verbose=0)
    assert unweighted != pytest.approx(got, rel=1e-3)


def test_sample_weights_for_class_maps_give_ignore_index_zero(converted):
    import tensorflow as tf

    w = converted.class_weights("train")
    add = with_sample_weights(w)
    y = tf.constant([[0, 1, 255], [4, 5, 2]], tf.uint8)
    _, _, sw = add(tf.zeros((2, 3)), y)
    np.testing.assert_allclose(sw.numpy(), [[w[0], w[1], 0.0], [w[4], w[5], w[2]]], rtol=1e-6)
