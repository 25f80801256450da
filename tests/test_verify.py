"""`imgshard verify`: damage is caught and named (file and record); hostile files refused."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest

import readers
from converter.cli import main as cli_main
from converter.inspect.verify import verify
from converter.write.base import ShardWriter
from readers.formats.encoder import SampleArrays
from readers.formats.registry import encoder_for
from readers.errors import ShardError
from readers.formats.tfrecord.wire import iter_records
from readers.manifest import MANIFEST_NAME, Manifest, ManifestError
from tests._cron import convert_args, run_cli

FORMATS = ["tfrecord", "npz"]


@pytest.fixture(params=FORMATS)
def dataset(request, camvid_src, tmp_path) -> Path:
    """A converted copy of the tiny CamVid fixture, stored uncompressed (offsets are plain)."""
    out = tmp_path / f"out-{request.param}"
    compression = "none"
    assert run_cli(convert_args(camvid_src.root, out, "--format", request.param, "--compression", compression)) == 0
    return out


def _train_shard(out: Path) -> tuple[Path, int]:
    entry = Manifest.load(out).shards("train")[0]
    return out / entry.file, entry.records


def _record_ends(path: Path) -> list[int]:
    """Byte offset after each record of an uncompressed TFRecord file."""
    ends, pos = [], 0
    for payload in iter_records(str(path)):
        pos += 16 + len(payload)
        ends.append(pos)
    return ends


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


def test_a_whole_dataset_verifies_with_exit_0(dataset, capsys):
    assert cli_main(["verify", str(dataset), "--deep"]) == 0
    assert "OK:" in capsys.readouterr().out
    assert cli_main(["verify", str(dataset), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["errors"] == [] and report["records"] == 10


def test_flipped_byte_is_caught_and_the_shard_named(dataset, capsys):
    path, _ = _train_shard(dataset)
    _flip(path, path.stat().st_size // 2)
    assert cli_main(["verify", str(dataset)]) == 1
    err = capsys.readouterr().err
    assert path.name in err and "digest is xxh3_128:" in err
    report = verify(dataset, deep=True)
    assert report.bad_files == [path.name]
    if path.suffix == ".tfrecord":  # the CRC walk names the record
        assert any(p.record is not None and "CRC" in p.problem for p in report.errors)
    else:
        assert any("CRC" in p.problem or "inflate" in p.problem for p in report.errors)


def test_tfrecord_cut_mid_record_is_caught_with_its_record(camvid_src, tmp_path):
    out = tmp_path / "out"
    assert run_cli(convert_args(camvid_src.root, out)) == 0
    path, records = _train_shard(out)
    ends = _record_ends(path)
    path.write_bytes(path.read_bytes()[: ends[1] + 20])  # inside record 2
    report = verify(out)
    assert not report.ok
    assert any(p.record == 2 and "truncated" in p.problem for p in report.errors)
    assert any("size is" in p.problem for p in report.errors)
    with pytest.raises(ShardError, match=path.name):
        readers.open(out)


def test_tfrecord_cut_exactly_at_a_record_boundary_is_caught_by_count_and_size(camvid_src, tmp_path, capsys):
    out = tmp_path / "out"
    assert run_cli(convert_args(camvid_src.root, out)) == 0
    path, records = _train_shard(out)
    ends = _record_ends(path)
    path.write_bytes(path.read_bytes()[: ends[2]])  # three whole records left
    assert len(list(iter_records(str(path)))) == 3  # a valid, shorter TFRecord file
    assert cli_main(["verify", str(out), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    problems = [e["problem"] for e in report["errors"] if e["file"] == path.name]
    assert any(f"holds 3 records, the manifest says {records}" in p for p in problems)
    assert any("truncated" in p for p in problems)


def test_missing_shard_is_an_error_naming_it(dataset):
    path, _ = _train_shard(dataset)
    path.unlink()
    report = verify(dataset)
    assert report.bad_files == [path.name] and "missing" in report.errors[0].problem


def test_leftover_temp_and_unlisted_shard_files_are_warnings(dataset, capsys):
    path, _ = _train_shard(dataset)
    (dataset / f".tmp-{path.name}-12345").write_bytes(b"partial")
    (dataset / path.name.replace("00000", "00042")).write_bytes(path.read_bytes())
    assert cli_main(["verify", str(dataset)]) == 0
    out = capsys.readouterr().out
    assert "warning: .tmp-" in out and "00042" in out and "not listed" in out


def _rewrite_train_shard(out: Path, mutate) -> Path:
    """Rewrite the first train shard through the real writer with `mutate`d records and
    update its manifest entry (size, digest), so only --deep can see the damage."""
    manifest = Manifest.load(out)
    entry = manifest.shards("train")[0]
    records = list(readers.open(out).records("train"))[: entry.records]
    records = mutate([dataclasses.replace(r, image=r.image.copy(), mask=r.mask.copy()) for r in records])
    encoder = encoder_for(manifest.format)
    tmp_dir = out / "rewrite"
    tmp_dir.mkdir()
    with ShardWriter(str(tmp_dir), entry.file, encoder, compression=manifest.compression,
                     capacity=len(records)) as w:
        for r in records:
            w.add(SampleArrays(r.key, r.image, r.mask, r.label))
    os.replace(tmp_dir / entry.file, out / entry.file)
    new_entry = dataclasses.replace(entry, bytes=w.result.bytes, digest=w.result.digest)
    split = manifest.splits["train"]
    shards = (new_entry,) + split.shards[1:]
    manifest = manifest.replace(splits={**manifest.splits, "train": dataclasses.replace(split, shards=shards)})
    (out / MANIFEST_NAME).write_text(manifest.dumps())
    return out / entry.file


def test_deep_finds_a_class_index_out_of_range_and_names_the_record(dataset):
    def plant(records):
        records[1].mask[0, 0] = 7  # 5 classes, ignore index 255: 7 is neither
        return records

    path = _rewrite_train_shard(dataset, plant)
    assert verify(dataset).ok  # sizes, hashes and counts agree
    report = verify(dataset, deep=True)
    assert [(p.file, p.record) for p in report.errors if "class indices [7]" in p.problem] == [(path.name, 1)]


def test_deep_finds_keys_out_of_manifest_order(dataset):
    path = _rewrite_train_shard(dataset, lambda records: records[::-1])
    report = verify(dataset, deep=True)
    assert any(p.file == path.name and p.record == 0 and "differs from the manifest" in p.problem
               for p in report.errors)


def test_reader_errors_name_the_shard_file_and_record(camvid_src, tmp_path):
    out = tmp_path / "out"
    assert run_cli(convert_args(camvid_src.root, out)) == 0
    path, _ = _train_shard(out)
    ends = _record_ends(path)
    _flip(path, ends[0] + 30)  # inside record 1
    ds = readers.open(out)  # sizes still agree: open succeeds
    with pytest.raises(ShardError, match=f"{path.name}, record 1"):
        list(ds.records("train"))
    batch = ds.keras_dataset("train", 2, shuffle=False)
    with pytest.raises(ShardError, match=f"{path.name}, record 1"):
        batch[0]


def test_hostile_manifest_paths_outside_the_folder_are_refused(dataset, tmp_path, capsys):
    data = json.loads((dataset / MANIFEST_NAME).read_text())
    for hostile in ("../escape.tfrecord", "/etc/passwd", "sub/../../x.npz"):
        data["splits"]["train"]["shards"][0]["file"] = hostile
        (dataset / MANIFEST_NAME).write_text(json.dumps(data))
        with pytest.raises(ManifestError, match="outside the dataset folder"):
            readers.open(dataset)
        report = verify(dataset)
        assert report.bad_files == [MANIFEST_NAME] and "outside" in report.errors[0].problem
        assert cli_main(["verify", str(dataset)]) == 1
    capsys.readouterr()


class _Payload:
    """Unpickling this would create a file: proof that nothing was unpickled."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_npz_with_pickled_objects_is_refused_and_never_unpickled(camvid_src, tmp_path):
    out = tmp_path / "out"
    assert run_cli(convert_args(camvid_src.root, out, "--format", "npz")) == 0
    path, records = _train_shard(out)
    marker = tmp_path / "unpickled"
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    keys = np.empty(records, dtype=object)
    keys[:] = [_Payload(str(marker)) for _ in range(records)]
    arrays["keys"] = keys
    np.savez(path, **arrays)  # np.savez pickles object arrays
    # make size and digest agree (a version-1 style sha256 one), so only the pickle check stands in the way
    manifest = Manifest.load(out)
    entry = manifest.shards("train")[0]
    import hashlib

    new_entry = dataclasses.replace(entry, bytes=path.stat().st_size,
                                    digest="sha256:" + hashlib.sha256(path.read_bytes()).hexdigest())
    split = manifest.splits["train"]
    manifest = manifest.replace(splits={**manifest.splits, "train": dataclasses.replace(
        split, shards=(new_entry,) + split.shards[1:])})
    (out / MANIFEST_NAME).write_text(manifest.dumps())

    report = verify(out, deep=True)
    assert [p.file for p in report.errors if "pickled data is never loaded" in p.problem] == [path.name]
    with pytest.raises(ShardError, match=f"{path.name}.*pickled data is never loaded"):
        list(readers.open(out).records("train"))
    assert not marker.exists()


def test_verify_without_a_manifest_fails_clearly(tmp_path, capsys):
    assert cli_main(["verify", str(tmp_path)]) == 1
    assert "imgshard.json not found" in capsys.readouterr().err


def test_gzip_tfrecord_damage_is_named_with_its_record(camvid_src, tmp_path):
    out = tmp_path / "out"
    assert run_cli(convert_args(camvid_src.root, out, "--compression", "gzip")) == 0
    assert verify(out, deep=True).ok
    path, _ = _train_shard(out)
    _flip(path, path.stat().st_size // 2)
    report = verify(out)
    assert report.bad_files == [path.name]
    assert any(p.record is not None for p in report.errors) or any("cannot count" in p.problem
                                                                  for p in report.errors)
