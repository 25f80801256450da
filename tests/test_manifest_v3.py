"""Manifest version 3: shard lists in imgshard.json, per-sample data in one index file per shard.

Index files are checked against an independent reading (`numpy.load`, `os.stat` of the
sources, the records' keys); readers open without them; no-op runs leave them alone;
version-2 datasets are read and migrated in place, also when killed mid-migration;
`verify` names a damaged index file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import readers
import readers.index
from converter.testing import synth
from converter.inspect.describe import describe
from converter.inspect.verify import verify
from readers.index import CLASSES_FIELD, FIELDS, IndexFileError, encode_table, shard_keys
from readers.manifest import MANIFEST_NAME, Manifest
from tests._cron import (
    ROOT,
    all_pairs,
    as_version_2,
    assert_whole,
    child_env,
    convert_args,
    link_samples,
    manifest_bytes,
    record_keys,
    run_cli,
    shard_hashes,
    source_keys,
)
from tests.test_crash_safety import KILL_AT_RENAME

SMALL = ("--shard-size", "8KB")  # several shards per split


@pytest.fixture
def full(tmp_path: Path) -> synth.SynthDataset:
    return synth.make_camvid(tmp_path / "full", splits={"train": 10, "val": 4}, size=[(40, 56), (36, 48)], seed=17)


def _index_tables(out: Path, latest_only: bool = False) -> dict[str, np.ndarray]:
    """Shard file -> its index table (read with NumPy); `latest_only`: the index files the
    manifest lists (leftovers of an earlier run aside)."""
    listed = {sh["index"]["file"] for sp in json.loads((out / MANIFEST_NAME).read_text())["splits"].values()
              for sh in sp["shards"]} if latest_only else None
    return {p.name.split(".idx.npy")[0].rsplit(".", 1)[0]: np.load(p, allow_pickle=False)
            for p in out.iterdir() if p.name.endswith(".idx.npy") and (listed is None or p.name in listed)}


def _index_files(out: Path) -> dict[str, tuple[int, int]]:
    """Index file name -> (inode, mtime_ns)."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.iterdir() if p.name.endswith(".idx.npy")}


def test_manifest_lists_shards_and_each_index_file_describes_its_records(full, tmp_path):
    src, out = link_samples(full, tmp_path / "src", all_pairs(full)), tmp_path / "out"
    assert run_cli(convert_args(src, out, *SMALL)) == 0
    doc = json.loads((out / MANIFEST_NAME).read_text())
    assert doc["imgshard_manifest"] == 3
    shards = [sh for sp in doc["splits"].values() for sh in sp["shards"]]
    assert len(shards) > 2 and all("samples" not in sh and "index" in sh for sh in shards)
    ds = readers.open(out)
    for split in ds.splits:
        for ref in ds.shards(split):
            table = np.load(out / ref.entry.index.file, allow_pickle=False)  # no imgshard code
            assert table.dtype.names == FIELDS + (CLASSES_FIELD,) and len(table) == ref.records
            assert list(table["record"]) == list(range(ref.records))
            keys = [r.key for r in ds._iter_records([ref])]
            assert [k.decode() for k in table["key"]] == keys
            for row in table:
                image = src / row["image_path"].decode()
                mask = src / row["mask_path"].decode()
                assert (int(row["image_size"]), int(row["image_mtime_ns"])) == (image.stat().st_size,
                                                                                image.stat().st_mtime_ns)
                assert (int(row["mask_size"]), int(row["mask_mtime_ns"])) == (mask.stat().st_size,
                                                                              mask.stat().st_mtime_ns)
                assert row["image_digest"].startswith(b"xxh3_128:") and int(row["label"]) == -1
            assert ref.entry.source_bytes == int(table["image_size"].sum() + table["mask_size"].sum())
    assert verify(out, deep=True).ok


def test_readers_open_and_read_records_without_any_index_file(full, tmp_path):
    src, out = link_samples(full, tmp_path / "src", all_pairs(full)), tmp_path / "out"
    assert run_cli(convert_args(src, out, *SMALL)) == 0
    expected = {split: [r.key for r in readers.open(out).records(split)] for split in ("train", "val")}
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    for name in _index_files(out):
        os.rename(out / name, hidden / name)
    ds = readers.open(out)  # the manifest alone
    assert ds.splits == {"train": 10, "val": 4}
    described = describe(out)  # inspect reads no index file either
    assert described["totals"]["samples"] == 14
    assert described["totals"]["source_bytes"] == sum(p.stat().st_size for p in src.rglob("*.png"))
    assert {split: [r.key for r in ds.records(split)] for split in ds.splits} == expected
    with pytest.raises(IndexFileError, match=r"\.idx\.npy of shard train-\d{5}\.tfrecord is missing"):
        ds.keys("train")
    for name in os.listdir(hidden):
        os.rename(hidden / name, out / name)
    assert ds.keys("train") == expected["train"] and ds.keys("val") == expected["val"]
    key = expected["val"][-1]
    loc = ds.find(key)
    assert loc.split == "val" and shard_keys(str(out), Manifest.load(out).shards("val")[
        [s.file for s in Manifest.load(out).shards("val")].index(loc.file)])[loc.record] == key
    with pytest.raises(KeyError, match="No sample with key 'train/nope.png'"):
        ds.find("train/nope.png")


def test_a_run_with_nothing_new_touches_no_index_file_and_a_touched_source_only_its_shards(full, tmp_path, capsys):
    src, out = link_samples(full, tmp_path / "src", all_pairs(full)), tmp_path / "out"
    assert run_cli(convert_args(src, out, *SMALL)) == 0
    indexes, manifest, hashes = _index_files(out), manifest_bytes(out), shard_hashes(out)
    capsys.readouterr()
    assert run_cli([a for a in convert_args(src, out, *SMALL) if a != "-q"]) == 0
    assert "Nothing new" in capsys.readouterr().err
    assert _index_files(out) == indexes and manifest_bytes(out) == manifest and shard_hashes(out) == hashes

    key = sorted(source_keys(src))[3]
    image = src / key
    os.utime(image, ns=(image.stat().st_atime_ns, image.stat().st_mtime_ns + 10**9))
    assert run_cli(convert_args(src, out, *SMALL)) == 0
    owner = readers.open(out).find(key).file
    after = _index_files(out)
    changed = set(indexes) ^ set(after)
    assert len(changed) == 2 and all(name.startswith(owner + ".") for name in changed)  # old out, new in
    assert shard_hashes(out) == hashes
    row = next(s for s in readers.index.shard_samples(str(out), next(
        sh for _, sh in Manifest.load(out).iter_shards() if sh.file == owner)) if s.key == key)
    assert row.image.mtime_ns == image.stat().st_mtime_ns
    assert_whole(out, source_keys(src))


def test_a_touched_source_in_a_rewritten_shard_keeps_its_new_mtime(full, tmp_path):
    """--on-change replace rewrites a shard; another source of that shard was only touched:
    the rewritten shard's index holds the touched file's new mtime (and the replaced one's new digest)."""
    from PIL import Image

    src, out = link_samples(full, tmp_path / "src", all_pairs(full)), tmp_path / "out"
    assert run_cli(convert_args(src, out)) == 0  # one shard per split
    changed, touched = sorted(k for k in source_keys(src) if k.startswith("train/"))[:2]
    for key in (changed, touched):  # hard links into `full`: make them files of their own first
        data = (src / key).read_bytes()
        (src / key).unlink()
        (src / key).write_bytes(data)
    with Image.open(src / changed) as im:
        Image.fromarray(255 - np.asarray(im.convert("RGB"))).save(src / changed)
    image = src / touched
    os.utime(image, ns=(image.stat().st_atime_ns, image.stat().st_mtime_ns + 10**9))
    assert run_cli(convert_args(src, out, "--on-change", "replace")) == 0
    m = Manifest.load(out)
    assert m.history[-1]["replaced"] == 1 and m.history[-1]["added"] == 0
    rows = {s.key: s for _, sh in m.iter_shards() for s in readers.index.shard_samples(str(out), sh)}
    assert rows[touched].image.mtime_ns == image.stat().st_mtime_ns
    assert rows[changed].image.size == (src / changed).stat().st_size
    assert rows[changed].image.mtime_ns == (src / changed).stat().st_mtime_ns
    assert run_cli(convert_args(src, out)) == 0  # and the next run finds nothing new
    assert Manifest.load(out).history == m.history
    assert_whole(out, source_keys(src))


def test_version_2_dataset_is_read_and_migrated_in_place_by_the_next_run(full, tmp_path):
    src, out = link_samples(full, tmp_path / "src", all_pairs(full)), tmp_path / "out"
    assert run_cli(convert_args(src, out, *SMALL)) == 0
    keys = {split: readers.open(out).keys(split) for split in ("train", "val")}
    tables = _index_tables(out)
    as_version_2(out)
    hashes = shard_hashes(out)
    ds = readers.open(out)  # version 2 is still read
    assert ds.manifest.version == 2 and {s: ds.keys(s) for s in ds.splits} == keys
    assert verify(out, deep=True).ok
    assert run_cli(convert_args(src, out, *SMALL)) == 0  # nothing new, but migrates
    m = Manifest.load(out)
    assert m.version == 3 and m.indexed and m.history[-1]["migrated_from"] == 2
    assert shard_hashes(out) == hashes  # no shard rewritten
    # the same rows as a version-3 conversion writes, without the class presence that
    # version 2 never recorded (re-convert with --rebuild for repeat-factor sampling)
    migrated = _index_tables(out, latest_only=True)
    assert migrated.keys() == tables.keys()
    for shard, table in migrated.items():
        assert table.dtype.names == FIELDS and all(np.array_equal(table[f], tables[shard][f]) for f in FIELDS)
        assert tables[shard].dtype.names == FIELDS + (CLASSES_FIELD,)
    assert {s: readers.open(out).keys(s) for s in ("train", "val")} == keys
    assert_whole(out, source_keys(src))


@pytest.mark.parametrize("target,nth,when", [
    (".idx.npy", 2, "before"),    # between two index renames
    (".idx.npy", 3, "after"),
    (MANIFEST_NAME, 1, "before"),  # every index renamed, the version-3 manifest not yet
    (MANIFEST_NAME, 1, "after"),   # migrated; the run itself not yet done
])
def test_kill_9_during_migration_leaves_a_readable_dataset(full, tmp_path, target, nth, when):
    pairs = all_pairs(full)
    src = link_samples(full, tmp_path / "src", pairs[::2])
    out = tmp_path / "out"
    assert run_cli(convert_args(src, out, *SMALL)) == 0
    as_version_2(out)
    before_manifest, before_keys = manifest_bytes(out), record_keys(out)
    link_samples(full, src, pairs)  # the run also has new samples to add after migrating
    args = convert_args(src, out, *SMALL)
    crashed = subprocess.run([sys.executable, "-c", KILL_AT_RENAME, target, str(nth), when, *args], cwd=ROOT,
                             env=child_env(), capture_output=True, text=True, timeout=120)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    ds = readers.open(out)  # readable, whatever the moment
    report = verify(out, deep=True)
    assert report.ok, [str(p) for p in report.errors]
    if target == MANIFEST_NAME and when == "after":
        assert ds.manifest.version == 3
    else:
        assert ds.manifest.version == 2 and manifest_bytes(out) == before_manifest
    assert record_keys(out) == before_keys  # nothing added, lost or duplicated yet
    assert run_cli(args) == 0
    assert_whole(out, source_keys(src))
    assert Manifest.load(out).version == 3


def _damage_cases():
    def truncate(path: Path, out: Path) -> None:
        path.write_bytes(path.read_bytes()[:-7])

    def flip(path: Path, out: Path) -> None:
        data = bytearray(path.read_bytes())
        data[-3] ^= 0x40
        path.write_bytes(bytes(data))

    def delete(path: Path, out: Path) -> None:
        path.unlink()

    def duplicate_key(path: Path, out: Path) -> None:
        """Consistent digest, wrong content: a key twice (the manifest updated to match)."""
        table = np.load(path, allow_pickle=False)
        table["key"][1] = table["key"][0]
        data = encode_table(table)
        path.write_bytes(data)
        import xxhash

        doc = json.loads((out / MANIFEST_NAME).read_text())
        for sp in doc["splits"].values():
            for sh in sp["shards"]:
                if sh["index"]["file"] == path.name:
                    sh["index"]["bytes"] = len(data)
                    sh["index"]["digest"] = "xxh3_128:" + xxhash.xxh3_128(data).hexdigest()
        (out / MANIFEST_NAME).write_text(json.dumps(doc))

    return [("truncated", truncate, "size is"), ("bit flip", flip, "digest is"),
            ("deleted", delete, "missing"), ("duplicate key", duplicate_key, "lists a key twice")]


@pytest.mark.parametrize("case,damage,message", _damage_cases(), ids=[c[0] for c in _damage_cases()])
def test_verify_names_a_damaged_index_file(camvid_src, tmp_path, case, damage, message):
    out = tmp_path / "out"
    assert run_cli(convert_args(camvid_src.root, out, *SMALL)) == 0
    entry = Manifest.load(out).shards("train")[0]
    assert entry.records >= 2
    damage(out / entry.index.file, out)
    report = verify(out)
    assert not report.ok
    assert entry.index.file in report.bad_files, [str(p) for p in report.errors]
    assert any(message in p.problem and p.file == entry.index.file for p in report.errors), \
        [str(p) for p in report.errors]
    assert run_cli(convert_args(camvid_src.root, out, *SMALL)) == 1 or case == "duplicate key"


def test_verify_finds_a_key_listed_in_two_shards(camvid_src, tmp_path):
    out = tmp_path / "out"
    assert run_cli(convert_args(camvid_src.root, out, *SMALL)) == 0
    a, b = Manifest.load(out).shards("train")[:2]
    # shard b's index claims shard a's first key (digest kept consistent): a duplicated sample
    table = np.load(out / b.index.file, allow_pickle=False)
    other = np.load(out / a.index.file, allow_pickle=False)
    table = table.astype([(n, other.dtype[n] if n == "key" and other.dtype[n].itemsize > table.dtype[n].itemsize
                           else table.dtype[n]) for n in table.dtype.names])
    table["key"][0] = other["key"][0]
    data = encode_table(table)
    (out / b.index.file).write_bytes(data)
    import xxhash

    doc = json.loads((out / MANIFEST_NAME).read_text())
    for sh in doc["splits"]["train"]["shards"]:
        if sh["file"] == b.file:
            sh["index"].update(bytes=len(data), digest="xxh3_128:" + xxhash.xxh3_128(data).hexdigest())
    (out / MANIFEST_NAME).write_text(json.dumps(doc))
    report = verify(out)
    assert any("duplicated sample" in p.problem and p.file == b.file for p in report.errors), \
        [str(p) for p in report.errors]


@pytest.mark.slow
def test_a_no_op_run_on_200k_samples_stays_in_bounded_memory(tmp_path):
    """The driver of a run that finds nothing new holds a compact table, not the samples."""
    from tests._many import make_many

    n = 200_000
    src, out = make_many(tmp_path, n)
    indexes, manifest = _index_files(out), manifest_bytes(out)
    # The peak is read by the child itself (VmHWM, reset at exec): a fork of a large pytest
    # process would otherwise count the parent's pages in ru_maxrss before the exec.
    code = ("import sys\n"
            "from converter import cli\n"
            "rc = cli.main(sys.argv[1:])\n"
            "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]\n"
            "sys.stderr.write(f'\\nPEAK_KB {hwm}\\n')\n"
            "sys.exit(rc)\n")
    cmd = [sys.executable, "-c", code, "convert", str(src), str(out), "--size", "8x8", "--workers", "1"]
    proc = subprocess.run(cmd, cwd=ROOT, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, timeout=600)
    err = proc.stderr
    assert proc.returncode == 0, err
    assert f"Nothing new: {n} sample(s) already converted" in err
    peak_mb = int(err.rsplit("PEAK_KB", 1)[1].split()[0]) / 1024
    assert peak_mb < 220, f"no-op run peaked at {peak_mb:.0f} MB for {n} samples"
    assert _index_files(out) == indexes and manifest_bytes(out) == manifest
    print(f"\nno-op run over {n} samples: peak RSS {peak_mb:.0f} MB")


@pytest.mark.parametrize("case,edit,message", [
    ("index escapes the folder", lambda sh: sh["index"].update(file="../elsewhere.idx.npy"), "outside the dataset"),
    ("no index", lambda sh: sh.pop("index"), "lacks 'index'"),
    ("index bytes a string", lambda sh: sh["index"].update(bytes="4242"), r"index\.bytes must be an integer"),
    ("digest without algorithm", lambda sh: sh["index"].update(digest="abc"), r"index\.digest must be 'ALGORITHM:HEX'"),
    ("samples inline", lambda sh: sh.update(samples=[]), r"samples must be absent in a version-3 manifest"),
    ("negative source bytes", lambda sh: sh.update(source_bytes=-1), r"source_bytes must be an integer"),
])
def test_hostile_version_3_shard_entries_are_refused_naming_the_field(camvid_src, tmp_path, case, edit, message):
    from readers.manifest import ManifestError

    out = tmp_path / "out"
    assert run_cli(convert_args(camvid_src.root, out)) == 0
    doc = json.loads((out / MANIFEST_NAME).read_text())
    edit(doc["splits"]["train"]["shards"][0])
    (out / MANIFEST_NAME).write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match=message):
        readers.open(out)
    report = verify(out)
    assert not report.ok and report.errors[0].file == MANIFEST_NAME


def test_an_index_file_that_is_a_fifo_is_refused_not_waited_on(camvid_src, tmp_path):
    out = tmp_path / "out"
    assert run_cli(convert_args(camvid_src.root, out)) == 0
    entry = Manifest.load(out).shards("train")[0]
    (out / entry.index.file).unlink()
    os.mkfifo(out / entry.index.file)
    with pytest.raises(IndexFileError, match="FIFO"):
        readers.open(out).keys("train")
    report = verify(out)
    assert any(p.file == entry.index.file and "FIFO" in p.problem for p in report.errors), \
        [str(p) for p in report.errors]
