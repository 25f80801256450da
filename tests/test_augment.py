"""Tests of `readers.augment`: image/mask alignment, padding, determinism, resume, every
field's validation, compact and device modes, `keras_dataset`, classification, and a
real `model.fit` with augmentation."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
from PIL import Image

sys.path.insert(0, os.path.dirname(__file__))

import _shards  # noqa: E402

import readers  # noqa: E402
from readers.augment import Augment, draw_params, key_ids  # noqa: E402

tf = pytest.importorskip("tensorflow")

@pytest.fixture(autouse=True, params=["c-kernel", "tf-fallback"])
def host_implementation(request, monkeypatch):
    """Every test runs on the host implementation (the `_warp` C kernel) and on the
    TensorFlow fallback (what runs without a C compiler): IMGSHARD_FAST_AUGMENT=0."""
    from readers.augment_host import fast_augment_available

    if request.param == "c-kernel" and not fast_augment_available():
        pytest.skip("readers._warp is not built (no C compiler)")
    if request.param == "tf-fallback":
        monkeypatch.setenv("IMGSHARD_FAST_AUGMENT", "0")
    return request.param


COLORS = [(200, 30, 40), (30, 180, 60), (40, 60, 210), (230, 220, 20), (20, 200, 220)]
RECIPE = Augment(hflip=0.5, vflip=0.5, scale=(0.6, 1.8), crop=(24, 28), brightness=0.0)


def _blocky_classes(rng, h, w):
    """Random class map of rectangles of random sizes (uniform regions with edges)."""
    cmap = np.zeros((h, w), np.uint8)
    for _ in range(12):
        y, x = rng.integers(0, h), rng.integers(0, w)
        cmap[y:y + rng.integers(4, 14), x:x + rng.integers(4, 14)] = rng.integers(0, len(COLORS))
    return cmap


@pytest.fixture
def colour_dataset(tmp_path):
    """A real conversion of images drawn in their masks' colours (CamVid layout)."""
    from converter.convert import convert
    from converter.options import OutputOptions, SourceSpec

    src = tmp_path / "src"
    rng = np.random.default_rng(5)
    (src / "train").mkdir(parents=True)
    (src / "train_labels").mkdir()
    palette = np.array(COLORS, np.uint8)
    for i in range(9):
        h, w = (30, 40) if i % 2 else (36, 32)
        rgb = palette[_blocky_classes(rng, h, w)]
        Image.fromarray(rgb).save(src / "train" / f"s{i:02d}.png")
        Image.fromarray(rgb).save(src / "train_labels" / f"s{i:02d}_L.png")
    (src / "class_dict.csv").write_text("name,r,g,b\n" + "".join(
        f"c{k},{r},{g},{b}\n" for k, (r, g, b) in enumerate(COLORS)))
    out = tmp_path / "out"
    convert(SourceSpec(root=str(src)), str(out), OutputOptions(size=(32, 36), image_filter="nearest"))
    return readers.open(out)


def _uniform_pixels(image):
    """Boolean (H, W): the 3x3 neighbourhood holds one colour (interior pixels only)."""
    img = image.astype(np.int32)
    same = np.ones(img.shape[:2], bool)
    same[0, :] = same[-1, :] = same[:, 0] = same[:, -1] = False
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            shifted = np.roll(np.roll(img, dy, 0), dx, 1)
            same &= (shifted == img).all(-1)
    return same


def _check_aligned(x, y, fill):
    palette = np.array(COLORS, np.int32)
    checked = 0
    for image, cmap in zip(np.asarray(x), np.asarray(y)):
        uniform = _uniform_pixels(image)
        colour_class = (image[:, :, None, :].astype(np.int32) == palette).all(-1)
        for k in range(len(COLORS)):
            where = uniform & colour_class[..., k]
            assert (cmap[where] == k).all(), f"class {k}: {np.unique(cmap[where])}"
            checked += int(where.sum())
        padded = uniform & (image == np.array(fill)).all(-1)
        assert (cmap[padded] == 255).all()
    return checked


@pytest.mark.parametrize("rotating", [False, True], ids=["crop-resize", "affine"])
def test_augmented_image_and_mask_stay_aligned(colour_dataset, rotating):
    aug = Augment(hflip=0.5, vflip=0.5, scale=(0.5, 2.0), crop=(40, 44), fill=(255, 0, 255),
                  rotate=25.0 if rotating else 0.0, rot90=rotating)
    checked = 0
    for x, y in colour_dataset.tf_dataset("train", 4, seed=3, augment=aug, normalize=False, one_hot=False):
        assert x.shape[1:] == (40, 44, 3) and y.shape[1:] == (40, 44)
        checked += _check_aligned(x.numpy(), y.numpy(), (255, 0, 255))
    assert checked > 1000


def test_padding_is_ignore_index_and_fill(colour_dataset):
    aug = Augment(scale=(0.4, 0.5), crop=(48, 48), fill=(255, 0, 255))
    x, y = next(iter(colour_dataset.tf_dataset("train", 9, seed=0, augment=aug, normalize=False,
                                               one_hot=False)))
    x, y = x.numpy(), y.numpy()
    outside = (x == (255, 0, 255)).all(-1)
    assert outside.mean() > 0.5  # a 0.45x image inside a 48x48 crop: mostly padding
    assert (y[outside] == 255).all() and (y[~outside] < len(COLORS)).all()
    _, hot = next(iter(colour_dataset.tf_dataset("train", 9, seed=0, augment=aug)))
    assert np.array_equal(np.asarray(hot).sum(-1) == 0, outside)  # padding: all-zero one-hot rows


@pytest.fixture(params=[("tfrecord", "none"), ("tfrecord", "gzip"), ("npz", "deflate")],
                ids=["tfrecord", "tfrecord-gzip", "npz"])
def small(request, tmp_path):
    return _small(tmp_path, *request.param)


@pytest.fixture
def small_tfrecord(tmp_path):
    """One format only, for the slower Keras tests."""
    return _small(tmp_path, "tfrecord", "none")


def _small(tmp_path, fmt, compression):
    root = tmp_path / f"{fmt}-{compression}"
    _shards.write_dataset(root, fmt, compression=compression, splits={"train": 11}, height=20, width=18,
                          records_per_shard=3, num_classes=4)
    return readers.open(root)


def _stream(ds, **kw):
    kw.setdefault("augment", Augment(hflip=0.5, scale=(0.7, 1.4), crop=(16, 16), brightness=0.2,
                                     contrast=0.2, saturation=0.2, hue=0.05))
    return [(np.asarray(x), np.asarray(y)) for x, y in ds.tf_dataset("train", 3, **kw)]


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(x1, x2) and np.array_equal(y1, y2)
                                    for (x1, y1), (x2, y2) in zip(a, b))


def test_same_seed_same_batches_other_seed_other_batches(small):
    first = _stream(small, seed=1, normalize=False, one_hot=False)
    assert _same(first, _stream(small, seed=1, normalize=False, one_hot=False))
    assert not _same(first, _stream(small, seed=2, normalize=False, one_hot=False))


def test_determinism_whatever_the_parallelism(small, monkeypatch):
    from readers.formats import batching, workers

    reference = _stream(small, seed=4)
    monkeypatch.setattr(batching, "LOADER_THREADS", 1)
    monkeypatch.setattr(batching, "SHARDS_AHEAD", 1)
    monkeypatch.setattr(batching, "BATCHES_AHEAD", 1)
    monkeypatch.setitem(workers._pools, "load", (os.getpid(), workers.DaemonPool(1, "one-loader")))
    opts = tf.data.Options()
    opts.threading.private_threadpool_size = 1
    single = [(np.asarray(x), np.asarray(y)) for x, y in
              small.tf_dataset("train", 3, seed=4, augment=Augment(hflip=0.5, scale=(0.7, 1.4), crop=(16, 16),
                                                                     brightness=0.2, contrast=0.2, saturation=0.2,
                                                                     hue=0.05)).with_options(opts)]
    assert _same(reference, single)


def test_each_epoch_draws_anew_and_epoch_argument_rebuilds_it(small):
    aug = Augment(hflip=0.5, scale=(0.7, 1.4), crop=(16, 16))
    ds = small.tf_dataset("train", 3, seed=0, augment=aug, normalize=False, one_hot=False)
    epochs = [[(np.asarray(x), np.asarray(y)) for x, y in ds] for _ in range(3)]
    assert not _same(epochs[0], epochs[1]) and not _same(epochs[1], epochs[2])
    assert _same(epochs[2], _stream(small, seed=0, augment=aug, epoch=2, normalize=False, one_hot=False))


def test_draws_depend_on_sample_key_not_position():
    aug = Augment(hflip=0.5, scale=(0.5, 2.0), crop=(8, 8), hue=0.1)
    ids = key_ids(["train/a.png", "train/b.png", "train/c.png"])
    together = draw_params(aug, 16, 16, 7, 3, ids)
    assert np.array_equal(together[1:], draw_params(aug, 16, 16, 7, 3, ids[::-1][:2][::-1]))
    assert not np.array_equal(together, draw_params(aug, 16, 16, 7, 4, ids))


@pytest.mark.parametrize("start", [0, 1, 2, 4])
def test_start_step_resume_equals_tail_of_full_epoch(small, start):
    full = _stream(small, seed=9, epoch=1, normalize=False, one_hot=False)
    assert _same(full[start:], _stream(small, seed=9, epoch=1, start_step=start, normalize=False, one_hot=False))
    plain = _stream(small, seed=9, epoch=1, augment=None)
    assert _same(plain[start:], _stream(small, seed=9, epoch=1, start_step=start, augment=None))


def test_start_step_skips_shards_without_reading_them(small, monkeypatch):
    from readers.formats import batching

    loaded = []
    original = batching.BatchGenerator._loaded

    def spy(self, order):
        loaded.append(list(order))
        return original(self, order)

    monkeypatch.setattr(batching.BatchGenerator, "_loaded", spy)
    _stream(small, shuffle=False, augment=None, start_step=2)  # batches of 3, shards of 3: shards 0, 1 skipped
    assert loaded == [[2, 3]]


def test_start_step_past_the_epoch_is_an_error(small):
    with pytest.raises(ValueError, match="start_step"):
        small.tf_dataset("train", 3, seed=0, start_step=5)
    with pytest.raises(ValueError, match="epoch"):
        small.tf_dataset("train", 3, seed=0, epoch=-1)


@pytest.mark.parametrize("field, value", [
    ("hflip", 1.5), ("hflip", "0.5"), ("vflip", -0.1), ("rot90", 1), ("rotate", 200.0), ("rotate", float("nan")),
    ("scale", (0.0, 1.0)), ("scale", (2.0, 1.0)), ("scale", 1.5), ("crop", (0, 4)), ("crop", (4.5, 4)),
    ("crop", 512), ("brightness", 1.5), ("contrast", 1.0), ("saturation", -0.2), ("hue", 0.6),
    ("fill", 256), ("fill", (1, 2)), ("fill", (0, 0, 300)), ("fill", True),
    # issue 25: reciprocals that overflow float32 (1 / 1e-39 = inf), crops with no upper bound
    ("scale", (1e-39, 1.0)), ("scale", (1.0, 1e39)), ("crop", (10**9, 10**9)), ("crop", (40000, 4)),
    ("crop", (30000, 30000)),
])
def test_every_field_is_validated(field, value):
    with pytest.raises(ValueError, match=rf"Augment\.{field} must be .*Received: {field}="):
        Augment(**{field: value})


def test_scale_and_crop_bounds_are_inclusive_and_float32_safe():
    from readers.augment import MAX_CROP_PIXELS, MAX_CROP_SIDE, SCALE_LIMITS

    a = Augment(scale=SCALE_LIMITS, crop=(MAX_CROP_SIDE, MAX_CROP_PIXELS // MAX_CROP_SIDE))
    assert np.all(np.isfinite(np.float32(1) / np.float32(a.scale)))
    assert np.isinf(np.float32(1) / np.float32(1e-39))  # what the lower bound keeps out


def test_augment_argument_must_be_an_augment(small):
    with pytest.raises(TypeError, match="augment must be"):
        small.tf_dataset("train", 3, augment={"hflip": 0.5})


def test_float_mode_equals_compact_mode_expanded(small):
    aug = Augment(hflip=0.5, scale=(0.7, 1.4), crop=(16, 16), brightness=0.3, contrast=0.3)
    compact = _stream(small, seed=2, augment=aug, normalize=False, one_hot=False)
    floats = _stream(small, seed=2, augment=aug)
    for (cx, cy), (fx, fy) in zip(compact, floats):
        assert cx.dtype == np.uint8 and fx.dtype == np.float32
        assert np.abs(fx * 255 - cx).max() <= 0.5 + 1e-3
        assert np.array_equal(fy, np.eye(5, dtype=np.float32)[np.minimum(cy, 4)][..., :4])


def test_device_side_augmentation_equals_host_side(small):
    from readers.device import augment_batch

    aug = Augment(hflip=0.5, scale=(0.7, 1.4), crop=(16, 16), saturation=0.3, hue=0.1)
    host = _stream(small, seed=6, augment=aug, one_hot=True)
    device = small.tf_dataset("train", 3, seed=6, augment=aug, normalize=False, one_hot=False, augment_on="device")
    for ((x, params), y), (hx, hy) in zip(device, host):
        assert x.dtype == tf.uint8 and x.shape[1:] == (20, 18, 3)
        dx, dy = augment_batch(x, y, params, aug, num_classes=4)
        # The accelerator runs the TensorFlow implementation; the host the C kernel (or the
        # same TensorFlow one): images within 2 levels (float rounding order), same classes.
        assert np.allclose(np.asarray(dx), hx, atol=2 / 255) and np.array_equal(np.asarray(dy), hy)


def test_keras_dataset_augments_like_tf_dataset(small):
    aug = Augment(hflip=0.5, scale=(0.7, 1.4), crop=(16, 16), brightness=0.2)
    seq = small.keras_dataset("train", 3, seed=3, augment=aug, shuffle=False, normalize=False, one_hot=False)
    stream = _stream(small, seed=3, augment=aug, shuffle=False, normalize=False, one_hot=False)
    assert _same([seq[i] for i in range(len(seq))], stream)
    seq.on_epoch_end()
    again = _stream(small, seed=3, augment=aug, shuffle=False, normalize=False, one_hot=False, epoch=1)
    assert _same([seq[i] for i in range(len(seq))], again)


def test_keras_dataset_workers_do_not_change_batches(small):
    """Batches read concurrently, in any order, by several threads (as PyDataset workers
    do) equal the batches read one by one in order."""
    from concurrent.futures import ThreadPoolExecutor

    aug = Augment(hflip=0.5, scale=(0.7, 1.4), crop=(16, 16), contrast=0.2)
    seq = small.keras_dataset("train", 3, seed=8, augment=aug, workers=3)
    one = [seq[i] for i in range(len(seq))]
    other = small.keras_dataset("train", 3, seed=8, augment=aug, workers=3)
    order = [3, 1, 0, 2]
    with ThreadPoolExecutor(3) as pool:
        got = dict(zip(order, pool.map(other.__getitem__, order)))
    assert _same(one, [got[i] for i in range(len(seq))])
    seq.on_epoch_end()
    assert not _same(one, [seq[i] for i in range(len(seq))])


def test_classification_images_augmented_labels_kept(tmp_path):
    root = tmp_path / "cls"
    _, samples = _shards.write_dataset(root, "tfrecord", splits={"train": 7}, task="classification",
                                       height=20, width=18, num_classes=3)
    ds = readers.open(root)
    aug = Augment(hflip=1.0, crop=(20, 18))
    x, y = next(iter(ds.tf_dataset("train", 7, shuffle=False, augment=aug, normalize=False, one_hot=False)))
    expected = np.stack([s.image for s in samples["train"]])[:, :, ::-1]
    assert np.array_equal(np.asarray(x), expected)
    assert np.asarray(y).tolist() == [s.label for s in samples["train"]]


def _tiny_model(num_classes, size):
    import keras

    inputs = keras.Input((*size, 3))
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(inputs)
    model = keras.Model(inputs, keras.layers.Conv2D(num_classes, 1, activation="softmax")(x))
    model.compile(optimizer="adam", loss="categorical_crossentropy")
    return model


@pytest.mark.parametrize("source", ["tf_dataset", "keras_dataset"])
def test_model_fit_one_epoch_with_augmentation(small, source):
    aug = Augment(hflip=0.5, scale=(0.75, 1.5), crop=(16, 16), brightness=0.2)
    data = getattr(small, source)("train", 3, seed=0, augment=aug)
    history = _tiny_model(4, (16, 16)).fit(data, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_keras_preprocessing_layers_take_tf_dataset_batches(small_tfrecord):
    import keras

    flip = keras.layers.RandomFlip("horizontal", seed=1)
    x, y = next(iter(small_tfrecord.tf_dataset("train", 3, seed=0, one_hot=False)))
    out = flip(x, training=True)
    assert out.shape == x.shape and out.dtype == tf.float32
    crop = keras.layers.RandomCrop(8, 8, seed=1)
    assert tuple(crop(x, training=True).shape) == (3, 8, 8, 3)


def test_resume_point_from_backup_and_restore_metadata(tmp_path):
    from readers.augment import resume_point

    assert resume_point(tmp_path / "none") == (0, 0)
    (tmp_path / "training_metadata.json").write_text(json.dumps({"epoch": 3, "batch": 0}))
    assert resume_point(tmp_path) == (3, 0)


def test_preview_augment_shows_the_training_view_of_each_sample(colour_dataset, tmp_path):
    from converter.cli import main as cli_main
    from converter.inspect.preview import PreviewOptions, dataset_samples
    from readers.augment import parse_augment

    spec = "hflip=0.5,scale=0.5:1.5,crop=20x24,fill=255:0:255"
    aug = parse_augment(spec)
    assert aug == Augment(hflip=0.5, scale=(0.5, 1.5), crop=(20, 24), fill=(255, 0, 255))
    _, _, samples = dataset_samples(colour_dataset.path, PreviewOptions(n=9, seed=4, augment=aug, epoch=1))
    training = colour_dataset.tf_dataset("train", 9, shuffle=False, seed=4, epoch=1, augment=aug, normalize=False,
                                         one_hot=False)
    x, y = (np.asarray(t) for t in next(iter(training)))
    keys = [r.key for r in colour_dataset.records("train")]
    for s in samples:
        i = keys.index(s.key)
        assert np.array_equal(s.image, x[i]) and np.array_equal(s.class_map, y[i])
    out = tmp_path / "aug.png"
    assert cli_main(["preview", colour_dataset.path, "-o", str(out), "-n", "3", "--augment", spec]) == 0
    assert Image.open(out).size[0] > 0
    assert cli_main(["preview", colour_dataset.path, "-o", str(out), "--augment", "flip=0.5"]) != 0


@pytest.mark.parametrize("text", ["hflip", "scale=2", "crop=12", "rot90=maybe", "hue=lots"])
def test_parse_augment_names_the_bad_field(text):
    from readers.augment import parse_augment

    field = text.partition("=")[0]
    with pytest.raises(ValueError, match=rf"(?i)augment.*{field}"):
        parse_augment(text)


def test_keras_geometric_layers_keep_mask_classes_on_tf_dataset_batches(small_tfrecord):
    import keras

    x, y = next(iter(small_tfrecord.tf_dataset("train", 3, seed=0, one_hot=False)))
    masks = tf.cast(y[..., None], tf.float32)
    for layer in (keras.layers.RandomRotation(0.2, seed=1), keras.layers.RandomZoom(0.3, seed=1),
                  keras.layers.RandomFlip("horizontal_and_vertical", seed=1)):
        out = layer({"images": x, "segmentation_masks": masks}, training=True)
        values = set(np.unique(np.asarray(out["segmentation_masks"])).tolist())
        assert values <= set(np.unique(np.asarray(y)).tolist()) | {0.0}, type(layer).__name__


def test_resume_after_interrupted_fit_with_backup_and_restore(small_tfrecord, tmp_path):
    """A fit killed at the start of epoch 2 resumes at epoch 2 with the batches that an
    uninterrupted run feeds in its third epoch."""
    import keras

    aug = Augment(hflip=0.5, scale=(0.75, 1.5), crop=(16, 16))
    backup = str(tmp_path / "backup")

    class Stop(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 2:
                raise RuntimeError("preempted")

    from readers.augment import resume_point

    model = _tiny_model(4, (16, 16))
    with pytest.raises(RuntimeError, match="preempted"):
        model.fit(small_tfrecord.tf_dataset("train", 3, seed=5, augment=aug, epoch=resume_point(backup)[0]), epochs=4,
                  verbose=0, callbacks=[keras.callbacks.BackupAndRestore(backup), Stop()])
    epoch, step = resume_point(backup)
    assert (epoch, step) == (2, 0)
    resumed = small_tfrecord.tf_dataset("train", 3, seed=5, augment=aug, epoch=epoch, start_step=step, normalize=False,
                               one_hot=False)
    full = small_tfrecord.tf_dataset("train", 3, seed=5, augment=aug, normalize=False, one_hot=False)
    third = [[(np.asarray(x), np.asarray(y)) for x, y in full] for _ in range(3)][2]
    assert _same([(np.asarray(x), np.asarray(y)) for x, y in resumed], third)
    seen = []

    class Record(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            seen.append(epoch)

    model.fit(small_tfrecord.tf_dataset("train", 3, seed=5, augment=aug, epoch=epoch, start_step=step), epochs=4,
              verbose=0, callbacks=[keras.callbacks.BackupAndRestore(backup), Record()])
    assert seen == [2, 3]


@pytest.mark.parametrize("fmt", ["tfrecord", "npz"])
def test_augmentation_composes_with_png_encoded_shards(tmp_path, fmt):
    """Encoded shards are decoded first; the augmentation sees the same uint8 batch as
    from raw shards, so both give the same augmented batches."""
    from converter.convert import convert
    from converter.options import OutputOptions, SourceSpec
    from converter.testing import synth

    src = synth.make_camvid(tmp_path / "src", size=[(40, 44)], seed=2)
    outs = {}
    for encoding in ("raw", "png"):
        out = tmp_path / f"{fmt}-{encoding}"
        convert(SourceSpec(root=str(src.root)), str(out), OutputOptions(size=(32, 36), format=fmt,
                                                                        image_encoding=encoding))
        ds = readers.open(out)
        outs[encoding] = [(np.asarray(x), np.asarray(y)) for x, y in
                          ds.tf_dataset("train", 3, seed=1, augment=RECIPE, normalize=False, one_hot=False)]
    assert len(outs["raw"]) > 1 and _same(outs["raw"], outs["png"])
