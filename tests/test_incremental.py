"""Incremental, idempotent runs: append, nothing new, option changes, changed and deleted sources."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import readers
from converter.testing import synth
from converter.convert import convert
from converter.options import OutputOptions, RunOptions, SourceSpec
from readers.index import shard_keys, shard_samples
from readers.manifest import Manifest
from tests._cron import (
    as_version_2,
    assert_whole,
    convert_args,
    link_samples,
    manifest_bytes,
    run_cli,
    shard_hashes,
    source_keys,
)

FORMATS = ["tfrecord", "npz"]


@pytest.fixture
def full(tmp_path: Path) -> synth.SynthDataset:
    """12 pairs (train 8 / val 4) to grow a source folder from."""
    return synth.make_camvid(tmp_path / "full", splits={"train": 8, "val": 4}, size=[(40, 56), (36, 48)], seed=11)


def _grow(full: synth.SynthDataset, src: Path, per_split: int) -> Path:
    pairs = [p for split in sorted(full.pairs) for p in full.pairs[split][:per_split]]
    return link_samples(full, src, pairs)


@pytest.mark.parametrize("fmt", FORMATS)
def test_append_new_sources_keeps_old_shards_byte_identical(full, tmp_path, fmt, capsys):
    src, out = tmp_path / "src", tmp_path / "out"
    _grow(full, src, 2)
    assert run_cli(convert_args(src, out, "--format", fmt)) == 0
    before = shard_hashes(out)
    first = Manifest.load(out)

    _grow(full, src, 5)
    assert run_cli(convert_args(src, out, "--format", fmt)) == 0
    after = shard_hashes(out)
    for name, digest in before.items():
        assert after[name] == digest, f"{name} was rewritten by an append"
    assert set(after) > set(before), "the new samples must go to new shards"
    assert_whole(out, source_keys(src))
    second = Manifest.load(out)
    assert second.history[-1]["added"] == 5  # 3 train + 2 val (val has 4 in all)
    assert second.history[-1]["replaced"] == 0 and second.history[-1]["pruned"] == 0
    assert len(second.history) == len(first.history) + 1
    # readers see old and new samples once each
    ds = readers.open(out)
    assert ds.splits == {"train": 5, "val": 4}


@pytest.mark.parametrize("fmt", FORMATS)
def test_rerun_on_unchanged_sources_says_nothing_new_and_changes_nothing(full, tmp_path, fmt, capsys):
    src, out = tmp_path / "src", tmp_path / "out"
    _grow(full, src, 3)
    assert run_cli(convert_args(src, out, "--format", fmt)) == 0
    hashes, manifest = shard_hashes(out), manifest_bytes(out)
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.is_file() and not p.name.startswith(".")}
    capsys.readouterr()

    assert run_cli([a for a in convert_args(src, out, "--format", fmt) if a != "-q"]) == 0
    err = capsys.readouterr().err
    assert "Nothing new" in err
    assert shard_hashes(out) == hashes
    assert manifest_bytes(out) == manifest
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.is_file() and p.name in mtimes} == mtimes


def test_touched_source_with_same_content_writes_no_shard(full, tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    _grow(full, src, 3)
    assert run_cli(convert_args(src, out)) == 0
    hashes = shard_hashes(out)
    image = next((src / "train").iterdir())
    os.utime(image, ns=(image.stat().st_atime_ns, image.stat().st_mtime_ns + 10**9))
    assert run_cli(convert_args(src, out)) == 0
    assert shard_hashes(out) == hashes
    entry = next(s for _, sh in Manifest.load(out).iter_shards() for s in shard_samples(str(out), sh) if s.key == f"train/{image.name}")
    assert entry.image.mtime_ns == image.stat().st_mtime_ns  # fingerprint refreshed, so no re-hash next time
    assert Manifest.load(out).history[-1]["added"] == 0


@pytest.mark.parametrize("flag,value", [("--size", "24x24"), ("--fit", "cover"), ("--image-filter", "nearest"),
                                        ("--format", "npz"), ("--seed", "3")])
def test_options_differing_from_the_manifest_are_refused_without_rebuild(full, tmp_path, flag, value, capsys):
    src, out = tmp_path / "src", tmp_path / "out"
    _grow(full, src, 2)
    assert run_cli(convert_args(src, out)) == 0
    manifest = manifest_bytes(out)
    args = convert_args(src, out)
    if flag == "--size":
        args[args.index("--size") + 1] = value
    else:
        args += [flag, value]
    capsys.readouterr()
    assert run_cli(args) == 1
    err = capsys.readouterr().err
    assert "other options" in err and "--rebuild" in err
    assert manifest_bytes(out) == manifest

    assert run_cli(args + ["--rebuild"]) == 0
    assert Manifest.load(out).options != json.loads(manifest)["options"]
    assert Manifest.load(out).history[-1].get("rebuild") is True
    assert_whole(out, source_keys(src))


def test_changed_class_table_is_refused_without_rebuild(full, tmp_path, capsys):
    src, out = tmp_path / "src", tmp_path / "out"
    _grow(full, src, 2)
    assert run_cli(convert_args(src, out)) == 0
    csv = src / "class_dict.csv"
    csv.unlink()  # a hard link into `full`: replace, never edit in place
    csv.write_text(full.class_dict_path.read_text().replace("Sky", "Heaven"))
    capsys.readouterr()
    assert run_cli(convert_args(src, out)) == 1
    assert "class table" in capsys.readouterr().err


def _change_image(src: Path, rel: str, seed: int) -> None:
    """Replace an image with other (valid) content of the same size."""
    from PIL import Image
    import numpy as np

    path = src / rel
    with Image.open(path) as im:
        size = im.size
    rgb = synth.textured_image(size[1], size[0], np.random.default_rng(seed))
    path.unlink()  # break the hard link: `full` stays as it was
    Image.fromarray(rgb).save(path)


def _record(out: Path, key: str):
    ds = readers.open(out)
    return next(r for split in ds.splits for r in ds.records(split) if r.key == key)


def test_changed_source_is_kept_by_default_with_a_warning(full, tmp_path, capsys):
    src, out = tmp_path / "src", tmp_path / "out"
    _grow(full, src, 3)
    assert run_cli(convert_args(src, out)) == 0
    key = sorted(source_keys(src))[0]
    old_image = _record(out, key).image.copy()
    hashes = shard_hashes(out)
    _change_image(src, key, 99)
    capsys.readouterr()
    assert run_cli([a for a in convert_args(src, out) if a != "-q"]) == 0
    err = capsys.readouterr().err
    assert key in err and "--on-change replace" in err
    assert shard_hashes(out) == hashes
    assert (_record(out, key).image == old_image).all()


def test_changed_source_with_on_change_replace_rewrites_only_its_shard(full, tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    _grow(full, src, 4)
    assert run_cli(convert_args(src, out)) == 0
    key = sorted(k for k in source_keys(src) if k.startswith("train/"))[0]
    old_image = _record(out, key).image.copy()
    before = Manifest.load(out)
    owner = next(sh.file for _, sh in before.iter_shards() if key in shard_keys(str(out), sh))
    hashes = shard_hashes(out)
    old_keys = shard_keys(str(out), next(sh for _, sh in before.iter_shards() if sh.file == owner))
    _change_image(src, key, 99)
    assert run_cli(convert_args(src, out, "--on-change", "replace")) == 0
    after_hashes = shard_hashes(out)
    assert owner not in after_hashes  # dropped after publishing
    for name, digest in hashes.items():
        if name != owner:
            assert after_hashes[name] == digest
    assert not (_record(out, key).image == old_image).all()
    after = Manifest.load(out)
    assert after.history[-1]["replaced"] == 1 and after.history[-1]["added"] == 0
    # record order inside the rewritten shard is the old one
    new_owner = next(sh for _, sh in after.iter_shards() if key in shard_keys(str(out), sh))
    assert shard_keys(str(out), new_owner) == old_keys
    assert_whole(out, source_keys(src))


def test_changed_source_with_on_change_fail_stops_and_publishes_nothing(full, tmp_path, capsys):
    src, out = tmp_path / "src", tmp_path / "out"
    _grow(full, src, 2)
    assert run_cli(convert_args(src, out)) == 0
    manifest = manifest_bytes(out)
    key = sorted(source_keys(src))[0]
    _change_image(src, key, 5)
    _grow(full, src, 3)  # new samples too: they must not be published either
    capsys.readouterr()
    assert run_cli(convert_args(src, out, "--on-change", "fail")) == 1
    err = capsys.readouterr().err
    assert "changed since it was converted" in err and key in err
    assert manifest_bytes(out) == manifest


def test_deleted_source_is_kept_without_prune_and_dropped_with_it(full, tmp_path, capsys):
    src, out = tmp_path / "src", tmp_path / "out"
    _grow(full, src, 3)
    assert run_cli(convert_args(src, out)) == 0
    keys = source_keys(src)
    gone = sorted(k for k in keys if k.startswith("val/"))[0]
    (src / gone).unlink()
    mask = next((src / "val_labels").glob(Path(gone).stem + "*"))
    mask.unlink()
    hashes = shard_hashes(out)
    capsys.readouterr()
    assert run_cli([a for a in convert_args(src, out) if a != "-q"]) == 0
    err = capsys.readouterr().err
    assert "deleted" in err and "--prune" in err
    assert shard_hashes(out) == hashes
    assert_whole(out, keys)

    assert run_cli(convert_args(src, out, "--prune")) == 0
    assert_whole(out, keys - {gone})
    last = Manifest.load(out).history[-1]
    assert last["pruned"] == 1 and last["added"] == 0


def test_history_counts_exactly_what_was_added_when_some_sources_are_bad(full, tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    _grow(full, src, 2)
    (src / "train" / "extra_no_mask.png").write_bytes((src / sorted(source_keys(src))[0]).read_bytes())
    (src / "train" / "broken.png").write_bytes(b"not a png at all")
    (src / "train_labels" / "broken_L.png").write_bytes(b"nor this")
    assert run_cli(convert_args(src, out, "--max-bad", "3")) == 0  # lonely image, broken image and its mask
    last = Manifest.load(out).history[-1]
    assert last["added"] == 4 and last["samples"] == 4


def test_python_api_returns_the_published_manifest(full, tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    _grow(full, src, 2)
    result = convert(SourceSpec(root=str(src)), str(out), OutputOptions(size=(16, 16)), RunOptions(workers=1))
    assert result.published and result.manifest == Manifest.load(out)
    again = convert(SourceSpec(root=str(src)), str(out), OutputOptions(size=(16, 16)), RunOptions(workers=1))
    assert not again.published and again.plan.unchanged == 4


def _as_version_1(out: Path) -> None:
    """Rewrite a manifest as imgshard 0.1.0 wrote it: version 1, sha256 source fingerprints."""
    import hashlib

    from readers.manifest import MANIFEST_NAME

    path = out / MANIFEST_NAME
    doc = as_version_2(out) if json.loads(path.read_text())["imgshard_manifest"] == 3 else json.loads(path.read_text())
    doc["imgshard_manifest"] = 1
    base = out.parent / "src"
    for split in doc["splits"].values():
        for shard in split["shards"]:
            del shard["digest"]
            shard["sha256"] = hashlib.sha256((out / shard["file"]).read_bytes()).hexdigest()
            for sample in shard["samples"]:
                for side in ("image", "mask"):
                    fp = sample[side]
                    if fp:
                        del fp["digest"]
                        fp["sha256"] = hashlib.sha256((base / fp["path"]).read_bytes()).hexdigest()
    path.write_text(json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n")


def test_version_1_manifests_are_read_compared_with_sha256_and_migrated_to_version_3(full, tmp_path, capsys):
    src, out = tmp_path / "src", tmp_path / "out"
    _grow(full, src, 3)
    assert run_cli(convert_args(src, out)) == 0
    _as_version_1(out)
    hashes = shard_hashes(out)
    old = Manifest.load(out)
    assert old.version == 1
    assert {s.image.algorithm for _, sh in old.iter_shards() for s in sh.samples} == {"sha256"}
    assert {sh.digest.split(":")[0] for _, sh in old.iter_shards()} == {"sha256"}
    assert readers.open(out).splits == {"train": 3, "val": 3}
    from converter.inspect.verify import verify

    assert verify(out, deep=True).ok  # shard digests checked with sha256

    # a touched file is recognised as unchanged through its sha256
    key = sorted(k for k in source_keys(src) if k.startswith("train/"))[0]
    image = src / key
    os.utime(image, ns=(image.stat().st_atime_ns, image.stat().st_mtime_ns + 10**9))
    capsys.readouterr()
    assert run_cli([a for a in convert_args(src, out) if a != "-q"]) == 0
    assert "Nothing new" in capsys.readouterr().err
    assert shard_hashes(out) == hashes

    # a changed file is replaced; the rewritten samples get xxh3 digests, the rest keep sha256
    _change_image(src, key, 98)
    assert run_cli(convert_args(src, out, "--on-change", "replace")) == 0
    new = Manifest.load(out)
    doc = json.loads((out / "imgshard.json").read_text())
    assert doc["imgshard_manifest"] == 3 and not any("samples" in sh for sp in doc["splits"].values()
                                                     for sh in sp["shards"])
    assert new.history[-1]["replaced"] == 1 and new.history[-1]["added"] == 0
    by_key = {s.key: s for _, sh in new.iter_shards() for s in shard_samples(str(out), sh)}
    assert by_key[key].image.algorithm == "xxh3_128"
    owner = next(sh for _, sh in new.iter_shards() if key in shard_keys(str(out), sh))
    assert owner.digest.startswith("xxh3_128:")  # the rewritten shard
    assert {sh.digest.split(":")[0] for _, sh in new.iter_shards()} == {"sha256", "xxh3_128"}
    assert "sha256" in {s.image.algorithm for s in by_key.values()}
    assert_whole(out, source_keys(src))

    # --rebuild over a version-1 manifest counts replaced samples exactly (none changed)
    _as_version_1(out)
    assert run_cli(convert_args(src, out, "--rebuild")) == 0
    last = Manifest.load(out).history[-1]
    assert last["replaced"] == 0 and last["added"] == 0 and last.get("rebuild") is True


def test_manifest_versions_other_than_1_2_and_3_are_refused_with_the_fix(full, tmp_path):
    from readers.manifest import MANIFEST_NAME, ManifestError

    src, out = tmp_path / "src", tmp_path / "out"
    _grow(full, src, 1)
    assert run_cli(convert_args(src, out)) == 0
    doc = json.loads((out / MANIFEST_NAME).read_text())
    doc["imgshard_manifest"] = 4
    (out / MANIFEST_NAME).write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match=r"version 4.*reads versions 1, 2, 3.*Upgrade imgshard"):
        Manifest.load(out)
