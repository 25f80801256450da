"""TFRecord output is a TensorFlow Datasets folder: loaded through the real TFDS, equal to records().

Needs the `tfds` extra (scripts/test.sh installs it); skipped where it is not installed.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from PIL import Image

import readers
from converter.testing import synth
from converter.convert import convert
from converter.options import OutputOptions, RunOptions, SourceSpec
from converter.publish.tfds import (
    DATASET_INFO_NAME,
    FEATURES_NAME,
    LABELS_FILE_NAME,
    TFDS_FILES,
    dataset_info_json,
    features_json,
    shard_lengths,
    tfds_files,
)
from readers.index import shard_keys
from readers.manifest import MANIFEST_NAME, Manifest

tfds = pytest.importorskip("tensorflow_datasets", reason="the `tfds` extra (pip install imgshard[tfds]) is missing")

SMALL_SHARDS = RunOptions(workers=1, shard_size_bytes=4096)  # several shards per split


def _convert(src, out, run=SMALL_SHARDS, **options):
    return convert(SourceSpec(root=str(src)), str(out), OutputOptions(**{"size": (24, 32), **options}), run)


def _in_order(builder, split: str):
    """TFDS examples of `split` in file order (one file at a time, no shuffling)."""
    config = tfds.ReadConfig(interleave_cycle_length=1)
    return list(tfds.as_numpy(builder.as_dataset(split=split, read_config=config)))


def assert_tfds_equals_records(out) -> None:
    builder = tfds.builder_from_directory(str(out))
    ds = readers.open(out)
    assert sorted(builder.info.splits.keys()) == sorted(ds.splits)
    for split, count in ds.splits.items():
        assert builder.info.splits[split].num_examples == count
        records = list(ds.records(split))
        examples = _in_order(builder, split)
        assert [e["key"].decode("utf-8") for e in examples] == [r.key for r in records]
        for e, r in zip(examples, records):
            assert e["image"].dtype == np.uint8
            np.testing.assert_array_equal(e["image"], r.image)
            if r.mask is not None:
                assert e["mask"].dtype == r.mask.dtype
                np.testing.assert_array_equal(e["mask"], r.mask)
            else:
                assert e["label"] == r.label
        # The default read (16 files interleaved) holds the same examples.
        default = tfds.as_numpy(builder.as_dataset(split=split))
        assert sorted(e["key"].decode("utf-8") for e in default) == sorted(r.key for r in records)


def test_segmentation_output_loads_in_tfds_equal_to_records(camvid_src, tmp_path):
    out = tmp_path / "out"
    _convert(camvid_src.root, out)
    assert len(Manifest.load(out).shards("train")) > 1
    assert_tfds_equals_records(out)
    features = tfds.builder_from_directory(str(out)).info.features
    assert features["mask"].shape == (24, 32) and features["image"].shape == (24, 32, 3)


def test_classification_output_loads_in_tfds_with_class_names(classification_src, tmp_path):
    out = tmp_path / "out"
    _convert(classification_src.root, out, task="classification")
    assert_tfds_equals_records(out)
    builder = tfds.builder_from_directory(str(out))
    assert builder.info.features["label"].names == classification_src.classes
    image, label = next(iter(tfds.as_numpy(builder.as_dataset(split="train", as_supervised=True))))
    assert image.shape == (24, 32, 3) and 0 <= label < 3


def _add_pair(src: synth.SynthDataset, name: str, tmp_path) -> None:
    extra = synth.make_camvid(tmp_path / f"extra_{name}", splits={"train": 1}, size=(24, 40), seed=21)
    (sample,) = extra.samples
    shutil.copy(sample.image_path, src.root / "train" / f"{name}.png")
    shutil.copy(sample.mask_path, src.root / "train_labels" / f"{name}_L.png")


def test_tfds_metadata_follows_an_incremental_append_run(camvid_src, tmp_path):
    out = tmp_path / "out"
    _convert(camvid_src.root, out)
    before = json.loads((out / DATASET_INFO_NAME).read_text())
    for i in range(3):
        _add_pair(camvid_src, f"new_{i}", tmp_path)
    result = _convert(camvid_src.root, out)
    assert result.plan.new == 3
    after = json.loads((out / DATASET_INFO_NAME).read_text())
    train_before = next(s for s in before["splits"] if s["name"] == "train")["shardLengths"]
    train_after = next(s for s in after["splits"] if s["name"] == "train")["shardLengths"]
    assert train_after[:len(train_before)] == train_before and len(train_after) > len(train_before)
    assert_tfds_equals_records(out)


def test_rewritten_shard_leaves_a_gap_that_tfds_skips(camvid_src, tmp_path):
    out = tmp_path / "out"
    _convert(camvid_src.root, out)
    manifest = Manifest.load(out)
    first = manifest.shards("train")[0]
    gone = shard_keys(str(out), first)[0]  # train/<name>.png
    os.unlink(camvid_src.root / gone)
    os.unlink(camvid_src.root / "train_labels" / gone.split("/")[1].replace(".png", "_L.png"))
    _convert(camvid_src.root, out, run=RunOptions(workers=1, shard_size_bytes=4096, prune=True))
    manifest = Manifest.load(out)
    assert first.file not in {s.file for s in manifest.shards("train")}
    lengths = shard_lengths(manifest, "train")
    assert lengths[0] == 0 and sum(lengths) == manifest.split("train").num_samples
    assert not (out / first.file).exists()
    assert_tfds_equals_records(out)


def test_hand_written_json_equals_what_tfds_writes(classification_src, camvid_src, tmp_path):
    from tensorflow_datasets.core import dataset_info, file_adapters, utils

    for task, src in (("classification", classification_src.root), ("segmentation", camvid_src.root)):
        out = tmp_path / task
        _convert(src, out, task=task)
        manifest = Manifest.load(out)
        ours = dataset_info_json(manifest)
        features = tfds.features.FeaturesDict.from_json(features_json(manifest))
        if task == "classification":
            features["label"].names = [c.name for c in manifest.classes]
        ref_dir = tmp_path / f"ref_{task}"
        ref_dir.mkdir()
        template = tfds.core.ShardedFileTemplate(data_dir=ref_dir, template="{SPLIT}-{SHARD_INDEX}.tfrecord",
                                                 dataset_name="imgshard", filetype_suffix="tfrecord")
        identity = dataset_info.DatasetIdentity(name="imgshard", version=utils.Version("1.0.0"),
                                                data_dir=str(ref_dir), module_name="")
        target = "label" if task == "classification" else "mask"
        info = dataset_info.DatasetInfo(builder=identity, features=features, description=ours["description"],
                                        supervised_keys=("image", target))
        info.set_file_format(file_adapters.FileFormat.TFRECORD)
        info.set_splits(tfds.core.SplitDict([
            tfds.core.SplitInfo(name=s, shard_lengths=shard_lengths(manifest, s),
                                num_bytes=sum(x.bytes for x in manifest.shards(s)), filename_template=template)
            for s in sorted(manifest.splits)]))
        info.write_to_directory(ref_dir)
        assert json.loads((out / DATASET_INFO_NAME).read_text()) == json.loads((ref_dir / DATASET_INFO_NAME).read_text())
        assert json.loads((out / FEATURES_NAME).read_text()) == json.loads((ref_dir / FEATURES_NAME).read_text())
        if task == "classification":
            assert (out / LABELS_FILE_NAME).read_text() == (ref_dir / LABELS_FILE_NAME).read_text()


def test_onehot_masks_load_in_tfds(camvid_src, tmp_path):
    out = tmp_path / "out"
    _convert(camvid_src.root, out, mask_encoding="onehot")
    assert_tfds_equals_records(out)
    assert tfds.builder_from_directory(str(out)).info.features["mask"].shape == (24, 32, 5)


def test_uint16_class_maps_load_in_tfds(tmp_path):
    from tests._shards import write_many_class_source  # noqa: I001

    src = tmp_path / "src"
    write_many_class_source(src, samples=2, height=24, width=32, seed=3)
    out = tmp_path / "out"
    _convert(src, out)
    assert Manifest.load(out).mask["dtype"] == "uint16"
    assert_tfds_equals_records(out)


@pytest.mark.parametrize("fmt, compression", [("npz", None), ("tfrecord", "gzip")])
def test_no_tfds_files_for_npz_or_gzip(camvid_src, tmp_path, fmt, compression):
    out = tmp_path / "out"
    _convert(camvid_src.root, out, format=fmt, compression=compression)
    assert not any((out / name).exists() for name in TFDS_FILES)


def test_rebuild_as_npz_removes_stale_tfds_files(classification_src, tmp_path):
    out = tmp_path / "out"
    _convert(classification_src.root, out, task="classification")
    assert all((out / name).exists() for name in TFDS_FILES)
    _convert(classification_src.root, out, run=RunOptions(workers=1, rebuild=True), task="classification",
             format="npz")
    assert not any((out / name).exists() for name in TFDS_FILES)


def test_nothing_new_run_leaves_tfds_files_untouched(camvid_src, tmp_path):
    out = tmp_path / "out"
    _convert(camvid_src.root, out)
    stamps = {n: os.stat(out / n).st_mtime_ns for n in (DATASET_INFO_NAME, FEATURES_NAME)}
    result = _convert(camvid_src.root, out)
    assert result.plan.nothing_to_do and not result.published
    assert {n: os.stat(out / n).st_mtime_ns for n in stamps} == stamps


def test_tfds_files_ahead_of_the_manifest_are_put_back_in_step(camvid_src, tmp_path):
    """A run killed between the TFDS files and the manifest: the next run re-syncs them first."""
    out = tmp_path / "out"
    _convert(camvid_src.root, out)
    good = (out / DATASET_INFO_NAME).read_bytes()
    doc = json.loads(good)
    doc["splits"][0]["shardLengths"].append("7")  # names a shard the manifest does not list
    (out / DATASET_INFO_NAME).write_text(json.dumps(doc))
    _convert(camvid_src.root, out)  # nothing new
    assert (out / DATASET_INFO_NAME).read_bytes() == good == tfds_files(Manifest.load(out))[DATASET_INFO_NAME]
    assert_tfds_equals_records(out)


def test_tfds_files_are_published_before_the_manifest(camvid_src, tmp_path):
    out = tmp_path / "out"
    _convert(camvid_src.root, out)
    manifest_time = os.stat(out / MANIFEST_NAME).st_mtime_ns
    assert all(os.stat(out / n).st_mtime_ns <= manifest_time for n in (DATASET_INFO_NAME, FEATURES_NAME))


def test_class_names_tfds_cannot_list_are_left_out(tmp_path):
    src = synth.make_classification(tmp_path / "src", classes=(" padded", "plain"), per_class=2, flat=True, seed=5)
    out = tmp_path / "out"
    _convert(src.root, out, task="classification")
    assert not (out / LABELS_FILE_NAME).exists()
    builder = tfds.builder_from_directory(str(out))
    assert builder.info.features["label"].num_classes == 2
    assert_tfds_equals_records(out)


def test_changed_class_folder_image_replaced_and_tfds_in_step(classification_src, tmp_path):
    out = tmp_path / "out"
    _convert(classification_src.root, out, task="classification")
    (path,) = classification_src.paths_of_kind("bmp")
    key = os.path.relpath(path, classification_src.root).replace(os.sep, "/")
    old_image = next(r.image for s in ("train", "val") for r in readers.open(out).records(s) if r.key == key)
    Image.fromarray(synth.textured_image(30, 30, np.random.default_rng(99))).save(path, "BMP")
    result = _convert(classification_src.root, out, run=RunOptions(workers=1, shard_size_bytes=4096,
                                                                  on_change="replace"), task="classification")
    assert result.plan.replaced == 1
    ds = readers.open(out)
    record = next(r for s in ds.splits for r in ds.records(s) if r.key == key)
    assert not np.array_equal(record.image, old_image)
    assert record.label == classification_src.classes.index(path.parent.name)
    assert_tfds_equals_records(out)
