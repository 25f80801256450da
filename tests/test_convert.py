"""End-to-end tests of `imgshard convert` (issue: foundation): every input mode, both formats.

Each test converts a generated dataset with the real converter (real processes when
workers > 1, real files) and reads it back through `readers`, comparing against an
independent Pillow / TensorFlow reference.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image, ImageOps

import readers
from readers.index import shard_keys
from converter.cli import main as cli_main
from converter.convert import BadInputError, convert
from converter.discover.classes import ClassTableError, load_class_table
from converter.options import OutputOptions, RunOptions, SourceSpec
from converter.testing import synth

OUT_SIZE = (40, 56)  # (h, w): not a multiple of the sources, so resampling really happens


def _convert(src, out, *, workers=1, fmt="tfrecord", **opts):
    options = OutputOptions(size=opts.pop("size", OUT_SIZE), format=fmt, **opts)
    return convert(SourceSpec(root=str(src)), str(out), options, RunOptions(workers=workers))


def _class_of_colors(rgb: np.ndarray, classes) -> np.ndarray:
    """Reference colour -> class: the classic per-colour equality loop (slow, obvious)."""
    out = np.full(rgb.shape[:2], 255, dtype=np.uint8)
    for i, (_, color) in enumerate(classes):
        out[np.all(rgb == np.array(color, dtype=np.uint8), axis=-1)] = i
    return out


def _reference(image_path, mask_path, classes, size=OUT_SIZE):
    """Pillow reference: convert('RGB') + resize(BILINEAR); mask: RGB, NEAREST, per-colour classes."""
    h, w = size
    image = np.asarray(Image.open(image_path).convert("RGB").resize((w, h), Image.Resampling.BILINEAR))
    mask_rgb = np.asarray(Image.open(mask_path).convert("RGB").resize((w, h), Image.Resampling.NEAREST))
    return image, _class_of_colors(mask_rgb, classes)


def _records_by_key(out, split):
    return {r.key: r for r in readers.open(out).records(split)}


@pytest.mark.parametrize("fmt", ["tfrecord", "npz"])
def test_round_trip_every_image_and_mask_mode_is_bit_exact(camvid_all_modes, tmp_path, fmt):
    ds = camvid_all_modes
    out = tmp_path / "out"
    result = _convert(ds.root, out, fmt=fmt, workers=2)
    assert result.published
    data = readers.open(out)
    assert data.splits == {s: len(p) for s, p in ds.pairs.items()}
    assert data.classes == [(n, tuple(c)) for n, c in ds.classes]
    modes = set()
    for split, pairs in ds.pairs.items():
        records = _records_by_key(out, split)
        assert len(records) == len(pairs)
        for image_path, mask_path in pairs:
            key = f"{split}/{image_path.name}"
            rec = records[key]
            ref_image, ref_mask = _reference(image_path, mask_path, ds.classes)
            assert rec.image.dtype == np.uint8 and rec.image.shape == OUT_SIZE + (3,)
            np.testing.assert_array_equal(rec.image, ref_image, err_msg=key)
            np.testing.assert_array_equal(rec.mask, ref_mask, err_msg=key)
            sample = ds.sample(image_path)
            modes.add((sample.image_mode, sample.mask_mode))
    assert {m for m, _ in modes} == {"RGB", "RGBA", "P", "L"}
    assert {m for _, m in modes} == {"RGB", "RGBA", "P"}


def test_greyscale_masks_resolve_grey_values_as_colours(camvid_grey_masks, tmp_path):
    ds = camvid_grey_masks
    out = tmp_path / "out"
    _convert(ds.root, out)
    for split, pairs in ds.pairs.items():
        records = _records_by_key(out, split)
        for image_path, mask_path in pairs:
            _, ref_mask = _reference(image_path, mask_path, ds.classes)
            np.testing.assert_array_equal(records[f"{split}/{image_path.name}"].mask, ref_mask)
    assert {s.mask_mode for s in ds.samples} >= {"L"}


def test_jpeg_images_and_masks_named_like_the_image(camvid_jpeg, tmp_path):
    ds = camvid_jpeg
    out = tmp_path / "out"
    _convert(ds.root, out)
    records = _records_by_key(out, "train")
    for image_path, mask_path in ds.pairs["train"]:
        assert mask_path.stem == image_path.stem  # no _L suffix in this layout
        ref_image, ref_mask = _reference(image_path, mask_path, ds.classes)
        rec = records[f"train/{image_path.name}"]
        np.testing.assert_array_equal(rec.image, ref_image)
        np.testing.assert_array_equal(rec.mask, ref_mask)


def test_mask_class_map_matches_the_generator_at_full_resolution(camvid_src, tmp_path):
    ds = camvid_src
    out = tmp_path / "out"
    image_path, _ = ds.pairs["train"][0]
    h, w = ds.sample(image_path).height, ds.sample(image_path).width
    _convert(ds.root, out, size=(h, w))  # same size: nearest is the identity
    rec = _records_by_key(out, "train")[f"train/{image_path.name}"]
    np.testing.assert_array_equal(rec.mask, ds.expected_class_map(image_path))


@pytest.mark.parametrize("fit", ["cover", "contain", "crop-or-pad"])
def test_fit_modes_match_independent_references(camvid_src, tmp_path, fit):
    import tensorflow as tf

    ds = camvid_src
    out = tmp_path / "out"
    size = (40, 40)
    _convert(ds.root, out, fit=fit, size=size)
    records = _records_by_key(out, "train")
    for image_path, mask_path in ds.pairs["train"]:
        rec = records[f"train/{image_path.name}"]
        img = Image.open(image_path).convert("RGB")
        cls = Image.fromarray(_class_of_colors(np.asarray(Image.open(mask_path).convert("RGB")), ds.classes))
        if fit == "cover":
            ref_img = ImageOps.fit(img, (40, 40), Image.Resampling.BILINEAR)
            ref_cls = ImageOps.fit(cls, (40, 40), Image.Resampling.NEAREST)
        elif fit == "contain":
            ref_img = ImageOps.pad(img, (40, 40), Image.Resampling.BILINEAR, color=0)
            ref_cls = ImageOps.pad(cls, (40, 40), Image.Resampling.NEAREST, color=255)
        else:
            ref_img = tf.image.resize_with_crop_or_pad(np.asarray(img), 40, 40).numpy()
            pad = tf.image.resize_with_crop_or_pad(np.asarray(cls)[..., None].astype(np.int32) - 255, 40, 40)
            ref_cls = (pad.numpy()[..., 0] + 255).astype(np.uint8)  # pads with the ignore index 255
        np.testing.assert_array_equal(rec.image, np.asarray(ref_img), err_msg=f"{fit} image {image_path.name}")
        np.testing.assert_array_equal(rec.mask, np.asarray(ref_cls), err_msg=f"{fit} mask {image_path.name}")
    if fit == "contain":
        assert any((r.mask == 255).any() for r in records.values())  # padding is the ignore index


@pytest.mark.parametrize("image_filter", ["nearest", "bicubic", "lanczos", "box"])
def test_image_filters_equal_pillow(camvid_src, tmp_path, image_filter):
    out = tmp_path / "out"
    _convert(camvid_src.root, out, image_filter=image_filter)
    records = _records_by_key(out, "train")
    pil = {"nearest": Image.Resampling.NEAREST, "bicubic": Image.Resampling.BICUBIC,
           "lanczos": Image.Resampling.LANCZOS, "box": Image.Resampling.BOX}[image_filter]
    for image_path, _ in camvid_src.pairs["train"]:
        ref = np.asarray(Image.open(image_path).convert("RGB").resize((OUT_SIZE[1], OUT_SIZE[0]), pil))
        np.testing.assert_array_equal(records[f"train/{image_path.name}"].image, ref)


def test_tf_dataset_one_hot_equals_classic_per_colour_one_hot(camvid_src, tmp_path):
    ds = camvid_src
    out = tmp_path / "out"
    _convert(ds.root, out, fmt="tfrecord")
    data = readers.open(out)
    keys = [r.key for r in data.records("train")]
    xs, ys = [], []
    for x, y in data.tf_dataset("train", 4, shuffle=False):
        xs.append(x.numpy())
        ys.append(y.numpy())
    x, y = np.concatenate(xs), np.concatenate(ys)
    for i, key in enumerate(keys):
        image_path = ds.root / key
        mask_path = next(m for im, m in ds.pairs["train"] if im == image_path)
        ref_image, _ = _reference(image_path, mask_path, ds.classes)
        mask_rgb = np.asarray(Image.open(mask_path).convert("RGB").resize((OUT_SIZE[1], OUT_SIZE[0]), Image.Resampling.NEAREST))
        classic = np.stack([np.all(mask_rgb == np.array(c, np.uint8), axis=-1) for _, c in ds.classes], -1).astype(np.float32)
        np.testing.assert_array_equal(y[i], classic)
        np.testing.assert_allclose(x[i], ref_image.astype(np.float32) / 255.0, rtol=0, atol=1e-6)


def test_unknown_colours_fail_by_default_listing_colour_count_files_and_nearest_class(camvid_unknown_colors, tmp_path):
    ds = camvid_unknown_colors
    out = tmp_path / "out"
    with pytest.raises(BadInputError) as err:
        _convert(ds.root, out)
    msg = str(err.value)
    for planted in ds.planted_unknown:
        assert str(tuple(planted.color)) in msg
        assert str(planted.mask_path) in msg
        assert f"{planted.pixels} px" in msg
        assert repr(ds.classes[planted.nearest_class][0]) in msg or planted.kind == "far"
    assert "--color-tolerance" in msg and "--unknown-color ignore" in msg
    assert not (out / "imgshard.json").exists()
    assert not [f for f in os.listdir(out) if f.endswith(".tfrecord")]


def test_color_tolerance_snaps_near_colours_and_ignore_maps_the_rest_to_255(camvid_unknown_colors, tmp_path):
    ds = camvid_unknown_colors
    near = [p for p in ds.planted_unknown if p.kind == "near"]
    far = [p for p in ds.planted_unknown if p.kind == "far"]
    assert near and far
    with pytest.raises(BadInputError) as err:  # tolerance alone leaves the far colour unknown
        _convert(ds.root, tmp_path / "tol", color_tolerance=2)
    assert all(str(tuple(p.color)) not in str(err.value) for p in near)
    assert any(str(tuple(p.color)) in str(err.value) for p in far)

    out = tmp_path / "out"
    size = (ds.samples[0].height, ds.samples[0].width)
    _convert(ds.root, out, color_tolerance=2, unknown_color="ignore", size=size)
    all_records = {r.key: r for s in ds.pairs for r in readers.open(out).records(s)}
    for p in ds.planted_unknown:
        s = ds.sample(p.image_path)
        if (s.height, s.width) != size:
            continue
        rec = all_records[f"{s.split}/{p.image_path.name}"]
        top, left, bottom, right = p.region
        region = rec.mask[top:bottom, left:right]
        if p.kind == "near":
            assert (region == p.nearest_class).all()
        else:
            assert (region == 255).all()


def test_ambiguous_tolerance_is_an_error(tmp_path):
    classes = [("a", (100, 100, 100)), ("b", (104, 100, 100))]
    ds = synth.make_camvid(tmp_path / "src", splits={"train": 2}, classes=classes, unknown_colors=0, seed=3)
    mask_path = ds.pairs["train"][0][1]
    m = np.asarray(Image.open(mask_path).convert("RGB")).copy()
    m[:4, :4] = (102, 100, 100)  # within 2 of both classes
    Image.fromarray(m).save(mask_path)
    with pytest.raises(BadInputError, match="ambiguous"):
        _convert(ds.root, tmp_path / "out", color_tolerance=2)


def test_output_is_byte_identical_with_one_and_two_workers(camvid_all_modes, tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    for fmt in ("tfrecord", "npz"):
        a, b = tmp_path / f"a-{fmt}", tmp_path / f"b-{fmt}"
        convert(SourceSpec(root=str(camvid_all_modes.root)), str(a), OutputOptions(size=OUT_SIZE, format=fmt),
                RunOptions(workers=1, shard_size_bytes=20_000))
        convert(SourceSpec(root=str(camvid_all_modes.root)), str(b), OutputOptions(size=OUT_SIZE, format=fmt),
                RunOptions(workers=2, shard_size_bytes=20_000))
        files_a = sorted(f for f in os.listdir(a) if not f.startswith(".") and f != "reports")
        files_b = sorted(f for f in os.listdir(b) if not f.startswith(".") and f != "reports")
        assert files_a == files_b and len(files_a) > 3  # several shards per split
        for f in files_a:
            assert (a / f).read_bytes() == (b / f).read_bytes(), f"{fmt}: {f} differs between 1 and 2 workers"


def test_tfrecord_shards_follow_the_documented_schema_for_plain_tf_data(camvid_src, tmp_path):
    import tensorflow as tf

    out = tmp_path / "out"
    _convert(camvid_src.root, out)
    data = readers.open(out)
    files = [str(out / s.file) for s in data.manifest.shards("train")]
    spec = {
        "image": tf.io.FixedLenFeature([], tf.string), "mask": tf.io.FixedLenFeature([], tf.string),
        "height": tf.io.FixedLenFeature([], tf.int64), "width": tf.io.FixedLenFeature([], tf.int64),
        "key": tf.io.FixedLenFeature([], tf.string),
    }
    expected = list(data.records("train"))
    for rec, raw in zip(expected, tf.data.TFRecordDataset(files)):
        ex = tf.io.parse_single_example(raw, spec)
        h, w = int(ex["height"]), int(ex["width"])
        assert (h, w) == OUT_SIZE
        np.testing.assert_array_equal(tf.reshape(tf.io.decode_raw(ex["image"], tf.uint8), (h, w, 3)).numpy(), rec.image)
        np.testing.assert_array_equal(tf.reshape(tf.io.decode_raw(ex["mask"], tf.uint8), (h, w)).numpy(), rec.mask)
        assert ex["key"].numpy().decode() == rec.key


def test_tfrecord_writer_matches_tensorflow_byte_for_byte(camvid_src, tmp_path):
    import tensorflow as tf

    out = tmp_path / "out"
    _convert(camvid_src.root, out)
    data = readers.open(out)
    shard = data.manifest.shards("train")[0]
    ref = tmp_path / "ref.tfrecord"
    with tf.io.TFRecordWriter(str(ref)) as w:
        for rec in data.records("train"):
            if rec.key not in shard_keys(str(out), shard):
                continue
            feats = {
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[rec.image.tobytes()])),
                "mask": tf.train.Feature(bytes_list=tf.train.BytesList(value=[rec.mask.tobytes()])),
                "height": tf.train.Feature(int64_list=tf.train.Int64List(value=[rec.image.shape[0]])),
                "width": tf.train.Feature(int64_list=tf.train.Int64List(value=[rec.image.shape[1]])),
                "key": tf.train.Feature(bytes_list=tf.train.BytesList(value=[rec.key.encode()])),
            }
            w.write(tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString(deterministic=True))
    assert (out / shard.file).read_bytes() == ref.read_bytes()


def test_npz_shards_hold_documented_arrays_without_pickle(camvid_src, tmp_path):
    for compression, stored in (("deflate", False), ("none", True)):
        out = tmp_path / compression
        _convert(camvid_src.root, out, fmt="npz", compression=compression)
        data = readers.open(out)
        shard = data.manifest.shards("train")[0]
        with np.load(out / shard.file, allow_pickle=False) as z:
            assert sorted(z.files) == ["images", "keys", "masks"]
            assert z["images"].shape == (shard.records,) + OUT_SIZE + (3,) and z["images"].dtype == np.uint8
            assert z["masks"].shape == (shard.records,) + OUT_SIZE and z["masks"].dtype == np.uint8
            assert z["keys"].dtype.kind == "U" and list(z["keys"]) == shard_keys(str(out), shard)
        import zipfile

        with zipfile.ZipFile(out / shard.file) as zf:
            kinds = {i.compress_type for i in zf.infolist()}
        assert kinds == ({zipfile.ZIP_STORED} if stored else {zipfile.ZIP_DEFLATED})


def test_onehot_mask_encoding_stores_uint8_planes(camvid_src, tmp_path):
    out = tmp_path / "out"
    _convert(camvid_src.root, out, fmt="npz", mask_encoding="onehot")
    ref_out = tmp_path / "ref"
    _convert(camvid_src.root, ref_out, fmt="npz")
    ref = _records_by_key(ref_out, "train")
    for key, rec in _records_by_key(out, "train").items():
        assert rec.mask.shape == OUT_SIZE + (5,) and rec.mask.dtype == np.uint8
        np.testing.assert_array_equal(rec.mask.argmax(-1), ref[key].mask)
        assert (rec.mask.sum(-1) == 1).all()


def test_more_than_255_classes_store_uint16_class_maps(tmp_path):
    classes = [(f"c{i}", ((i * 7) % 256, (i * 13) % 256, i // 2)) for i in range(300)]
    assert len({c for _, c in classes}) == 300
    src = tmp_path / "src"
    (src / "train").mkdir(parents=True)
    (src / "train_labels").mkdir()
    (src / "class_dict.csv").write_text("name,r,g,b\n" + "".join(f"{n},{r},{g},{b}\n" for n, (r, g, b) in classes))
    rng = np.random.default_rng(9)
    colors = np.array([c for _, c in classes], dtype=np.uint8)
    truth = {}
    for i in range(2):
        Image.fromarray(synth.textured_image(48, 64, rng)).save(src / "train" / f"f{i}.png")
        blocks = rng.integers(0, 300, (6, 8))
        cls = np.kron(blocks, np.ones((8, 8), dtype=np.int64))  # 48x64 map of 8x8 blocks, classes up to 299
        Image.fromarray(colors[cls]).save(src / "train_labels" / f"f{i}_L.png")
        truth[f"train/f{i}.png"] = cls
    out = tmp_path / "out"
    _convert(src, out, size=(48, 64))
    data = readers.open(out)
    assert data.manifest.mask["dtype"] == "uint16" and data.manifest.mask["ignore_index"] == 65535
    records = _records_by_key(out, "train")
    assert max(int(r.mask.max()) for r in records.values()) > 255
    for key, cls in truth.items():
        assert records[key].mask.dtype == np.uint16
        np.testing.assert_array_equal(records[key].mask, cls)


def test_explicit_image_and_mask_folders(explicit_src, tmp_path):
    ds = explicit_src
    out = tmp_path / "out"
    images_dir = ds.pairs["train"][0][0].parent
    masks_dir = ds.pairs["train"][0][1].parent
    rc = cli_main(["convert", "--images", str(images_dir), "--masks", str(masks_dir), "--classes",
                   str(ds.class_dict_path), "--split", "train", str(out), "--size", "40x56", "--quiet",
                   "--workers", "1"])
    assert rc == 0
    records = _records_by_key(out, "train")
    assert set(records) == {f"train/{im.name}" for im, _ in ds.pairs["train"]}
    for image_path, mask_path in ds.pairs["train"]:
        ref_image, ref_mask = _reference(image_path, mask_path, ds.classes)
        np.testing.assert_array_equal(records[f"train/{image_path.name}"].image, ref_image)
        np.testing.assert_array_equal(records[f"train/{image_path.name}"].mask, ref_mask)


def test_class_dict_quirks_are_tolerated(tmp_path):
    p = tmp_path / "class_dict.csv"
    p.write_bytes("\ufeffname, r, g, b, class_11\r\n\r\nSky, 128, 128, 128, 1\r\nRoad,128,64,128,1\r\n\r\n".encode("utf-8"))
    classes = load_class_table(p)
    assert [(c.name, c.color) for c in classes] == [("Sky", (128, 128, 128)), ("Road", (128, 64, 128))]


def test_class_dict_malformed_line_names_file_and_line(tmp_path):
    p = tmp_path / "class_dict.csv"
    p.write_text("name,r,g,b\nSky,128,128,128\nRoad,128,x,128\n")
    with pytest.raises(ClassTableError, match=r"class_dict.csv, line 3: column 'g'"):
        load_class_table(p)


def test_class_dict_duplicate_colour_names_both_lines(tmp_path):
    p = tmp_path / "class_dict.csv"
    p.write_text("name,r,g,b\nSky,128,128,128\nCloud,128,128,128\n")
    with pytest.raises(ClassTableError, match=r"line 3: colour \(128, 128, 128\).*'Sky' on line 2"):
        load_class_table(p)


def test_image_without_mask_and_mask_without_image_are_named(camvid_src, tmp_path):
    ds = camvid_src
    image_path, mask_path = ds.pairs["train"][0]
    os.unlink(mask_path)
    stray = ds.root / "val_labels" / "stray_L.png"
    shutil.copy(ds.pairs["val"][0][1], stray)
    out = tmp_path / "out"
    with pytest.raises(BadInputError) as err:
        _convert(ds.root, out)
    msg = str(err.value)
    assert f"{image_path}: image without mask" in msg
    assert f"{stray}: mask without image" in msg
    assert not (out / "imgshard.json").exists()


def test_image_mask_size_mismatch_is_named(camvid_src, tmp_path):
    image_path, mask_path = camvid_src.pairs["train"][1]
    Image.open(mask_path).resize((10, 10), Image.Resampling.NEAREST).save(mask_path)
    with pytest.raises(BadInputError, match="mask is 10x10 but its image"):
        _convert(camvid_src.root, tmp_path / "out")


def test_keras_fit_from_tf_dataset_and_keras_dataset(camvid_src, tmp_path):
    import keras

    out = tmp_path / "out"
    _convert(camvid_src.root, out, size=(32, 32))
    data = readers.open(out)
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(inputs)
    model = keras.Model(inputs, keras.layers.Conv2D(data.num_classes, 1, activation="softmax")(x))
    model.compile(optimizer="adam", loss="categorical_crossentropy")
    h1 = model.fit(data.tf_dataset("train", 2, seed=1), epochs=1, verbose=0)
    h2 = model.fit(data.keras_dataset("train", 2, seed=1), epochs=1, verbose=0)
    for h in (h1, h2):
        assert len(h.history["loss"]) == 1 and np.isfinite(h.history["loss"][0])


def test_cli_requires_size_and_reports_bad_size(camvid_src, tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli_main(["convert", str(camvid_src.root), str(tmp_path / "o")])
    rc = cli_main(["convert", str(camvid_src.root), str(tmp_path / "o"), "--size", "big"])
    assert rc == 1
    assert "--size must look like HxW" in capsys.readouterr().err


def test_console_script_convert_runs_in_a_subprocess(camvid_src, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "converter.cli", "convert", str(camvid_src.root), str(out),
                           "--size", "24x24", "--workers", "2"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Converted 10 new" in proc.stderr
    assert readers.open(out).splits == {"train": 6, "val": 2, "test": 2}
    # The manifest lists every shard with its digest (xxh3-128 of the file).
    import xxhash

    data = readers.open(out)
    for _, shard in data.manifest.iter_shards():
        assert shard.digest == "xxh3_128:" + xxhash.xxh3_128_hexdigest((out / shard.file).read_bytes())


def test_gzip_tfrecord_round_trips_through_records_tf_dataset_and_plain_tf_data(camvid_src, tmp_path):
    import tensorflow as tf

    out, ref_out = tmp_path / "gz", tmp_path / "plain"
    _convert(camvid_src.root, out, compression="gzip")
    _convert(camvid_src.root, ref_out)
    data, ref = readers.open(out), readers.open(ref_out)
    assert data.manifest.compression == "gzip"
    got = list(data.records("train"))
    want = list(ref.records("train"))
    assert [r.key for r in got] == [r.key for r in want]
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a.image, b.image)
        np.testing.assert_array_equal(a.mask, b.mask)
    # Smaller on disk, and plain TensorFlow reads it with compression_type="GZIP".
    assert sum(s.bytes for s in data.manifest.shards("train")) < sum(s.bytes for s in ref.manifest.shards("train"))
    files = [str(out / s.file) for s in data.manifest.shards("train")]
    assert sum(1 for _ in tf.data.TFRecordDataset(files, compression_type="GZIP")) == len(want)
    xs = np.concatenate([x.numpy() for x, _ in data.tf_dataset("train", 4, shuffle=False, normalize=False)])
    np.testing.assert_array_equal(xs, np.stack([r.image for r in want]))
