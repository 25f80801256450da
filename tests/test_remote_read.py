"""Reading datasets that live in buckets (`readers.open("s3://...")`, `gs://`) against real
servers on 127.0.0.1 (moto's S3 server, the GCS emulator): every reading path gives what
the local copy gives, with and without the local cache; the cache is verified, bounded
and replaces damaged copies; damaged objects are named errors naming the URL; GET counts
back the claims about requests."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import readers  # noqa: E402
from converter import cli  # noqa: E402
from converter.testing import synth  # noqa: E402
from readers.errors import ShardError  # noqa: E402
from readers.storage import ObjectStore, open_store  # noqa: E402

tf = pytest.importorskip("tensorflow")

#: name -> extra `imgshard convert` flags of the local datasets uploaded to the buckets.
FLAVOURS = {
    "tfrecord": ["--format", "tfrecord"],
    "tfrecord-gzip": ["--format", "tfrecord", "--compression", "gzip"],
    "npz-deflate": ["--format", "npz", "--compression", "deflate"],
    "npz-stored": ["--format", "npz", "--compression", "none"],
    "tfrecord-png": ["--format", "tfrecord", "--image-encoding", "png"],
}


@pytest.fixture(scope="module")
def local_sets(tmp_path_factory) -> dict[str, str]:
    """Each flavour converted locally once (textured synthetic CamVid, 32x48, several shards per split)."""
    root = tmp_path_factory.mktemp("remote_src")
    src = synth.make_camvid(root / "camvid", splits={"train": 9, "val": 3}, size=[(32, 48), (40, 40)], seed=7)
    out = {}
    for name, flags in FLAVOURS.items():
        target = root / name
        assert cli.main(["convert", str(src.root), str(target), "--size", "32x48", "--workers", "1",
                         "--shard-size", "12KB", *flags]) == 0
        out[name] = str(target)
    return out


def upload(local: str, url: str) -> ObjectStore:
    """Upload the dataset folder `local` under `url` (its layout kept); returns the store."""
    store = open_store(url)
    for folder, _, files in os.walk(local):
        for f in files:
            path = os.path.join(folder, f)
            store.put_file(os.path.relpath(path, local).replace(os.sep, "/"), path)
    return store


class GetCounter:
    """Counts the GETs the readers make through `ObjectStore` (whole, ranged, downloads)."""

    def __init__(self, monkeypatch) -> None:
        self.calls: list[tuple[str, str]] = []
        for method in ("read", "read_range", "download"):
            real = getattr(ObjectStore, method)

            def wrapped(store, name, *args, _real=real, _method=method, **kwargs):
                self.calls.append((_method, name))
                return _real(store, name, *args, **kwargs)

            monkeypatch.setattr(ObjectStore, method, wrapped)

    def shard_gets(self) -> list[tuple[str, str]]:
        return [c for c in self.calls if not c[1].endswith((".json", ".npy"))]


def _batches(ds) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(x.numpy(), y.numpy()) for x, y in ds]


def _assert_same_batches(a, b) -> None:
    assert len(a) == len(b) > 0
    for (xa, ya), (xb, yb) in zip(a, b):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)


def _assert_same_readers(local, remote, same_manifest: bool = True) -> None:
    """Every reading path of `remote` equals `local`'s (`same_manifest`: an uploaded copy,
    not a separate conversion with its own shard names and history)."""
    assert remote.splits == local.splits
    assert remote.manifest == local.manifest or not same_manifest
    for split in local.splits:
        assert [s.records for s in remote.shards(split)] == [s.records for s in local.shards(split)]
    for split in local.splits:
        got, want = list(remote.records(split)), list(local.records(split))
        assert [r.key for r in got] == [r.key for r in want]
        for r, w in zip(got, want):
            np.testing.assert_array_equal(r.image, w.image)
            np.testing.assert_array_equal(r.mask, w.mask)
        assert remote.keys(split) == local.keys(split)
    key = local.keys("val")[-1]
    found, want = remote.find(key), local.find(key)
    assert (found.split, found.record) == (want.split, want.record)
    assert found.file == want.file or (not same_manifest and found.file.split("-r")[0] == want.file.split(".")[0])
    aug = readers.augment.Augment(hflip=0.5, scale=(0.8, 1.2), crop=(28, 40))
    for kwargs in ({"shuffle": False}, {"seed": 3}, {"seed": 3, "normalize": False, "one_hot": False},
                   {"seed": 5, "augment": aug}):
        _assert_same_batches(_batches(remote.tf_dataset("train", 4, **kwargs)),
                             _batches(local.tf_dataset("train", 4, **kwargs)))
    kr, kl = remote.keras_dataset("train", 4, seed=2), local.keras_dataset("train", 4, seed=2)
    assert len(kr) == len(kl)
    for i in (len(kl) - 1, 0, 1):
        for a, b in zip(kr[i], kl[i]):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("flavour", list(FLAVOURS))
@pytest.mark.parametrize("cached", [False, True], ids=["no-cache", "cache"])
def test_s3_readers_equal_local_copy(flavour, cached, local_sets, s3_bucket, tmp_path):
    upload(local_sets[flavour], s3_bucket + "/out")
    remote = readers.open(s3_bucket + "/out", cache_dir=str(tmp_path / "cache") if cached else None)
    assert remote.path == s3_bucket + "/out"
    _assert_same_readers(readers.open(local_sets[flavour]), remote)
    if cached:
        assert any(n.endswith(".tfrecord") or n.endswith(".npz") for n in os.listdir(tmp_path / "cache"))


def test_gcs_readers_equal_local_copy(local_sets, gcs_bucket, tmp_path):
    upload(local_sets["tfrecord"], gcs_bucket + "/data/out")
    _assert_same_readers(readers.open(local_sets["tfrecord"]), readers.open(gcs_bucket + "/data/out"))
    cached = readers.open(gcs_bucket + "/data/out", cache_dir=str(tmp_path / "c"))
    _assert_same_batches(_batches(cached.tf_dataset("train", 4, seed=1)),
                         _batches(readers.open(local_sets["tfrecord"]).tf_dataset("train", 4, seed=1)))


def test_file_url_is_the_local_dataset(local_sets):
    ds = readers.open("file://" + local_sets["tfrecord"])
    assert ds.path == local_sets["tfrecord"] and ds.splits == readers.open(local_sets["tfrecord"]).splits


def test_second_epoch_with_cache_makes_no_shard_gets(local_sets, s3_bucket, tmp_path, monkeypatch):
    upload(local_sets["tfrecord"], s3_bucket + "/out")
    counter = GetCounter(monkeypatch)
    ds = readers.open(s3_bucket + "/out", cache_dir=str(tmp_path / "cache"))
    shards = len(ds.shards("train"))
    first = _batches(ds.tf_dataset("train", 4, seed=0))
    assert sorted(m for m, _ in counter.shard_gets()) == ["download"] * shards  # one whole GET per shard
    counter.calls.clear()
    again = _batches(ds.tf_dataset("train", 4, seed=0))
    keras = ds.keras_dataset("train", 4, seed=0)
    _ = [keras[i] for i in range(len(keras))]
    assert counter.shard_gets() == []
    _assert_same_batches(first, again)
    # A second process (a new Dataset, same cache folder) reuses the verified copies too.
    counter.calls.clear()
    _batches(readers.open(s3_bucket + "/out", cache_dir=str(tmp_path / "cache")).tf_dataset("train", 4, seed=0))
    assert counter.shard_gets() == []


def test_without_cache_tf_dataset_reads_each_shard_whole_once_per_epoch(local_sets, s3_bucket, monkeypatch):
    upload(local_sets["npz-deflate"], s3_bucket + "/out")
    ds = readers.open(s3_bucket + "/out")
    counter = GetCounter(monkeypatch)
    _batches(ds.tf_dataset("train", 4, seed=0))
    names = [n for m, n in counter.shard_gets()]
    assert [m for m, _ in counter.shard_gets()] == ["read"] * len(ds.shards("train"))
    assert sorted(names) == sorted(s.entry.file for s in ds.shards("train"))


@pytest.mark.parametrize("flavour", ["tfrecord", "npz-stored"])
def test_keras_dataset_without_cache_uses_ranged_gets(flavour, local_sets, s3_bucket, monkeypatch):
    upload(local_sets[flavour], s3_bucket + "/out")
    ds = readers.open(s3_bucket + "/out")
    counter = GetCounter(monkeypatch)
    seq = ds.keras_dataset("train", 2, shuffle=False)
    x, _ = seq[1]
    gets = counter.shard_gets()
    assert gets and {m for m, _ in gets} == {"read_range"}  # no whole-object read
    assert x.shape == (2, 32, 48, 3)


def test_cache_evicts_least_recently_used_under_small_bound(local_sets, s3_bucket, tmp_path):
    upload(local_sets["tfrecord"], s3_bucket + "/out")
    sizes = sorted(s.entry.bytes for s in readers.open(local_sets["tfrecord"]).shards("train"))
    bound = sizes[-1] + sizes[-2]  # room for two shards at most
    cache = tmp_path / "cache"
    ds = readers.open(s3_bucket + "/out", cache_dir=str(cache), cache_max_bytes=bound)
    want = _batches(readers.open(local_sets["tfrecord"]).tf_dataset("train", 4, shuffle=False))
    for _ in range(2):
        _assert_same_batches(_batches(ds.tf_dataset("train", 4, shuffle=False)), want)
        held = [f for f in os.listdir(cache) if not f.startswith(".")]
        assert sum(os.path.getsize(cache / f) for f in held) <= bound
        assert 1 <= len(held) <= 2
    last = ds.shards("train")[-1].entry.file
    assert any(f.endswith(last) for f in os.listdir(cache))  # the most recently used stays


def test_corrupted_cache_file_is_detected_and_replaced(local_sets, s3_bucket, tmp_path, monkeypatch):
    upload(local_sets["tfrecord"], s3_bucket + "/out")
    cache = tmp_path / "cache"
    ds = readers.open(s3_bucket + "/out", cache_dir=str(cache))
    want = _batches(ds.tf_dataset("train", 4, shuffle=False))
    copies = sorted(cache / f for f in os.listdir(cache) if f.endswith(".tfrecord"))
    data = bytearray(copies[0].read_bytes())
    data[len(data) // 2] ^= 0x10  # one flipped bit, same size
    copies[0].write_bytes(bytes(data))
    copies[1].write_bytes(copies[1].read_bytes()[:-7])  # truncated
    counter = GetCounter(monkeypatch)
    again = readers.open(s3_bucket + "/out", cache_dir=str(cache))
    _assert_same_batches(_batches(again.tf_dataset("train", 4, shuffle=False)), want)
    assert len([m for m, _ in counter.shard_gets() if m == "download"]) == 2  # exactly the two damaged copies
    assert copies[0].read_bytes() != bytes(data)


def _damage(store: ObjectStore, name: str, how: str) -> None:
    data = bytearray(store.read(name))
    if how == "truncated":
        data = data[:-10]
    else:
        data[len(data) // 3] ^= 0x04
    store.put(name, bytes(data))


@pytest.mark.parametrize("flavour", ["tfrecord", "npz-deflate"])
def test_bit_flip_in_bucket_is_a_named_error(flavour, local_sets, s3_bucket, tmp_path, monkeypatch):
    store = upload(local_sets[flavour], s3_bucket + "/out")
    name = readers.open(local_sets[flavour]).shards("train")[0].entry.file
    _damage(store, name, "flip")
    url = store.url_of(name)
    for cache in (None, str(tmp_path / "cache")):
        ds = readers.open(s3_bucket + "/out", cache_dir=cache)
        with pytest.raises(ShardError, match=f"{url}.*digest") as info:
            list(ds.records("train"))
        assert info.value.path == url
        with pytest.raises(Exception, match=url):
            _batches(ds.tf_dataset("train", 4, shuffle=False))
    if flavour == "tfrecord":  # ranged reads: the streamed offset index checks the digest ...
        seq = readers.open(s3_bucket + "/out").keras_dataset("train", 1, shuffle=False)
        with pytest.raises(ShardError, match=f"{url}.*digest"):
            _ = [seq[i] for i in range(len(seq))]
        from readers.formats.tfrecord import reader as tfr

        monkeypatch.setattr(tfr, "HEADER_SCAN_RECORD_BYTES", 0)  # ... header GETs: the record's own CRC
        seq = readers.open(s3_bucket + "/out").keras_dataset("train", 1, shuffle=False)
        with pytest.raises(ShardError, match=f"{url}, record \\d+.*CRC"):
            _ = [seq[i] for i in range(len(seq))]


def test_truncated_object_in_bucket_is_refused_at_open(local_sets, s3_bucket):
    store = upload(local_sets["npz-stored"], s3_bucket + "/out")
    name = readers.open(local_sets["npz-stored"]).shards("val")[0].entry.file
    _damage(store, name, "truncated")
    with pytest.raises(ShardError, match=f"{store.url_of(name)} has the wrong size"):
        readers.open(s3_bucket + "/out")
    store.delete(name)
    with pytest.raises(FileNotFoundError, match=f"{store.url_of(name)} is missing"):
        readers.open(s3_bucket + "/out")


def test_damaged_index_object_is_named(local_sets, s3_bucket):
    store = upload(local_sets["tfrecord"], s3_bucket + "/out")
    entry = readers.open(local_sets["tfrecord"]).shards("train")[1].entry
    _damage(store, entry.index.file, "flip")
    ds = readers.open(s3_bucket + "/out")
    from readers.index import IndexFileError

    with pytest.raises(IndexFileError, match=f"{store.url_of(entry.index.file)}.*digest"):
        ds.keys("train")


def test_hostile_zip_claims_in_bucket_are_named(s3_bucket, tmp_path):
    """A stored NPZ whose zip directory claims more bytes than the object holds, listed with
    matching size and digest (so only the zip checks can catch it): named with the URL."""
    import json
    import struct

    import xxhash

    import _shards

    local = tmp_path / "hostile"
    _shards.write_dataset(local, "npz", splits={"train": 4}, compression="none")
    manifest = json.loads((local / "imgshard.json").read_text())
    shard = manifest["splits"]["train"]["shards"][0]
    path = local / shard["file"]
    data = bytearray(path.read_bytes())
    central = data.rfind(b"PK\x01\x02")  # first member's central directory entry: claim 2 GB
    data[central + 20:central + 28] = struct.pack("<II", 1 << 31, 1 << 31)
    path.write_bytes(bytes(data))
    shard["digest"] = "xxh3_128:" + xxhash.xxh3_128(bytes(data)).hexdigest()
    (local / "imgshard.json").write_text(json.dumps(manifest))
    store = upload(str(local), s3_bucket + "/h")
    ds = readers.open(s3_bucket + "/h")
    with pytest.raises(ShardError, match=f"{store.url_of(shard['file'])}.*(claims|zip)"):
        list(ds.records("train"))
    seq = ds.keras_dataset("train", 1, shuffle=False)
    with pytest.raises(ShardError, match=f"{store.url_of(shard['file'])}"):
        seq[0]


def test_keras_model_fit_from_s3(local_sets, s3_bucket, tmp_path):
    import keras

    upload(local_sets["tfrecord"], s3_bucket + "/out")
    ds = readers.open(s3_bucket + "/out", cache_dir=str(tmp_path / "cache"))
    model = keras.Sequential([keras.Input((32, 48, 3)), keras.layers.Conv2D(ds.num_classes, 3, padding="same",
                                                                           activation="softmax")])
    model.compile("adam", "categorical_crossentropy")
    history = model.fit(ds.tf_dataset("train", 4, seed=0), validation_data=ds.tf_dataset("val", 4, shuffle=False),
                        epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2 and np.isfinite(history.history["loss"]).all()
    history = model.fit(ds.keras_dataset("train", 4, seed=0), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()


def test_remote_dataset_pickles_for_worker_processes(local_sets, s3_bucket):
    import pickle

    upload(local_sets["tfrecord"], s3_bucket + "/out")
    ds = readers.open(s3_bucket + "/out")
    seq = ds.keras_dataset("train", 2, shuffle=False)
    again = pickle.loads(pickle.dumps(seq))
    for a, b in zip(seq[0], again[0]):
        np.testing.assert_array_equal(a, b)


def test_bad_arguments_are_named(s3_bucket, tmp_path):
    with pytest.raises(ValueError, match="unknown URL scheme 'ftp'"):
        readers.open("ftp://host/out")
    with pytest.raises(FileNotFoundError, match=f"No imgshard dataset at '{s3_bucket}/nothing'"):
        readers.open(s3_bucket + "/nothing")
    with pytest.raises(ValueError, match="cache_max_bytes"):
        readers.open(s3_bucket + "/nothing", cache_dir=str(tmp_path), cache_max_bytes=0)
    with pytest.raises(TypeError, match="storage_options"):
        readers.open(s3_bucket + "/nothing", storage_options=["anon=true"])


def test_cache_copy_names_carry_the_digest(local_sets, s3_bucket, tmp_path):
    """Content-addressed: a republished shard with other bytes gets another cache file."""
    upload(local_sets["tfrecord"], s3_bucket + "/out")
    ds = readers.open(s3_bucket + "/out", cache_dir=str(tmp_path / "c"))
    list(ds.records("val"))
    names = sorted(os.listdir(tmp_path / "c"))
    digests = {s.entry.digest.split(":")[1][:32] for s in ds.shards("val")}
    assert {n.split("-")[1] for n in names if n.endswith(".tfrecord")} == digests
    assert not [n for n in names if n.startswith(".")]  # no temporary file left


# -- verify, inspect, preview on URLs ---------------------------------------------------------


def test_verify_url_checks_every_object_and_names_damage(local_sets, s3_bucket, capsys):
    store = upload(local_sets["npz-deflate"], s3_bucket + "/out")
    assert cli.main(["verify", s3_bucket + "/out", "--deep"]) == 0
    assert f"in {s3_bucket}/out" in capsys.readouterr().out
    entries = readers.open(local_sets["npz-deflate"]).shards("train")
    _damage(store, entries[0].entry.file, "flip")
    _damage(store, entries[1].entry.file, "truncated")
    store.delete(entries[2].entry.index.file)
    store.put("train-09999.npz", b"left by a crashed run")
    assert cli.main(["verify", s3_bucket + "/out", "--json"]) == 1
    import json

    report = json.loads(capsys.readouterr().out)
    assert report["out_dir"] == s3_bucket + "/out"
    problems = {(e["file"], e["problem"].split(" ")[0]) for e in report["errors"]}
    assert (entries[0].entry.file, "digest") in problems
    assert (entries[1].entry.file, "size") in problems
    assert (entries[2].entry.index.file, "missing:") in problems
    assert [w["file"] for w in report["warnings"]] == ["train-09999.npz"]


def test_verify_url_honours_storage_option_endpoint(local_sets, s3_bucket, s3_server, monkeypatch, capsys):
    upload(local_sets["tfrecord"], s3_bucket + "/out")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens: only the option can work
    code = cli.main(["verify", s3_bucket + "/out", "--storage-option", f"endpoint_url={s3_server}"])
    assert code == 0, capsys.readouterr()
    code = cli.main(["verify", s3_bucket + "/out", "--storage-option", "config_kwargs.retries.max_attempts=1",
                     "--storage-option", "config_kwargs.connect_timeout=1"])
    err = capsys.readouterr().err
    assert code == 1 and "endpoint" in err and "Traceback" not in err


def test_inspect_url_reads_sizes_from_the_listing(local_sets, s3_bucket, capsys):
    import json

    store = upload(local_sets["tfrecord"], s3_bucket + "/out")
    assert cli.main(["inspect", s3_bucket + "/out", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert cli.main(["inspect", local_sets["tfrecord"], "--json"]) == 0
    want = json.loads(capsys.readouterr().out)
    assert got["manifest"] == s3_bucket + "/out/imgshard.json" and got["path"] == s3_bucket + "/out"
    assert got["totals"] == want["totals"] and got["classes"] == want["classes"]
    name = readers.open(local_sets["tfrecord"]).shards("val")[0].entry.file
    store.delete(name)
    assert cli.main(["inspect", s3_bucket + "/out", "--json"]) == 0
    assert f"{name}: missing" in json.loads(capsys.readouterr().out)["splits"]["val"]["problems"]


def test_preview_url_draws_the_same_sheet_as_the_local_copy(local_sets, s3_bucket, tmp_path):
    from PIL import Image

    upload(local_sets["tfrecord-png"], s3_bucket + "/out")
    assert cli.main(["preview", s3_bucket + "/out", "-o", str(tmp_path / "r.png"), "-n", "3", "--seed", "1"]) == 0
    assert cli.main(["preview", local_sets["tfrecord-png"], "-o", str(tmp_path / "l.png"), "-n", "3",
                     "--seed", "1"]) == 0
    remote = np.asarray(Image.open(tmp_path / "r.png"))
    local = np.asarray(Image.open(tmp_path / "l.png"))
    assert remote.shape == local.shape
    body = slice(40, None)  # below the title line (which names the path or URL)
    assert np.mean(remote[body] != local[body]) < 0.02


@pytest.mark.parametrize("argv,code,needle", [
    (["verify", "ftp://host/out"], 2, "unknown URL scheme 'ftp'"),
    (["inspect", "s3:///nobucket"], 2, "names no bucket"),
])
def test_cli_bad_urls_are_named_errors(argv, code, needle, capsys):
    assert cli.main(argv) == code
    err = capsys.readouterr()
    assert needle in err.out + err.err and "Traceback" not in err.err


def test_cli_missing_dataset_in_bucket_is_named(s3_bucket, capsys):
    assert cli.main(["inspect", s3_bucket + "/none"]) == 1
    assert f"No imgshard dataset at '{s3_bucket}/none'" in capsys.readouterr().err
    assert cli.main(["verify", s3_bucket + "/none"]) == 1
    assert "imgshard.json not found" in capsys.readouterr().err


def test_cache_shared_by_concurrent_processes(local_sets, s3_bucket, tmp_path):
    """Two processes filling one cache folder at once: both read the right records, the
    folder ends with whole, verified copies and no temporary file."""
    import subprocess

    upload(local_sets["npz-stored"], s3_bucket + "/out")
    cache = tmp_path / "cache"
    code = ("import sys, hashlib, readers\n"
            f"ds = readers.open({s3_bucket + '/out'!r}, cache_dir={str(cache)!r})\n"
            "h = hashlib.sha256()\n"
            "for split in sorted(ds.splits):\n"
            "    for r in ds.records(split):\n"
            "        h.update(r.key.encode()); h.update(r.image.tobytes()); h.update(r.mask.tobytes())\n"
            "print(h.hexdigest())\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(os.path.dirname(__file__)),
                                                         os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    import hashlib

    local = readers.open(local_sets["npz-stored"])
    h = hashlib.sha256()
    for split in sorted(local.splits):
        for r in local.records(split):
            h.update(r.key.encode()), h.update(r.image.tobytes()), h.update(r.mask.tobytes())
    assert [o[0].strip() for o in outs] == [h.hexdigest()] * 2
    names = os.listdir(cache)
    assert not [n for n in names if n.startswith(".")]
    from readers.cache import file_digest

    by_name = {s.entry.file: s.entry for split in local.splits for s in local.shards(split)}
    for n in names:
        entry = by_name.get(n.split("-", 2)[2])
        if entry is not None:
            assert file_digest(str(cache / n), entry.digest) == entry.digest
    assert sum(n.split("-", 2)[2] in by_name for n in names) == len(by_name)


@pytest.mark.parametrize("compression", ["none", "deflate"])
def test_classification_npz_from_s3_equals_local(compression, classification_src, s3_bucket, tmp_path):
    """Labels instead of masks: the ranged reader reads the labels member whole once."""
    out = tmp_path / "cls"
    assert cli.main(["convert", str(classification_src.root), str(out), "--size", "16x16", "--workers", "1",
                     "--format", "npz", "--compression", compression, "--shard-size", "2KB"]) == 0
    upload(str(out), s3_bucket + "/cls")
    local, remote = readers.open(str(out)), readers.open(s3_bucket + "/cls")
    assert len(remote.shards("train")) > 1
    got = [(r.key, r.label, r.image.tobytes()) for r in remote.records("train")]
    assert got == [(r.key, r.label, r.image.tobytes()) for r in local.records("train")]
    kr, kl = remote.keras_dataset("train", 3, seed=1), local.keras_dataset("train", 3, seed=1)
    for i in range(len(kl)):
        for a, b in zip(kr[i], kl[i]):
            np.testing.assert_array_equal(a, b)


def test_tfrecord_offset_index_streams_small_record_shards(local_sets, s3_bucket, monkeypatch):
    """Records of a few KB: the offset index comes from one large ranged GET per shard (not
    one GET per header), checked against the digest; then one GET per record."""
    from readers.formats.tfrecord import reader as tfr

    monkeypatch.setattr(tfr, "SCAN_CHUNK_BYTES", 5000)  # several chunks per shard: headers cut by chunk ends
    store = upload(local_sets["tfrecord"], s3_bucket + "/out")
    ds = readers.open(s3_bucket + "/out")
    shard = ds.shards("train")[0]
    counter = GetCounter(monkeypatch)
    reader = ds._adapter.random_access(shard, ds._spec)
    want = readers.open(local_sets["tfrecord"])._adapter.random_access(
        readers.open(local_sets["tfrecord"]).shards("train")[0], ds._spec)
    for i in reversed(range(shard.records)):
        for a, b in zip(reader.read(i), want.read(i)):
            np.testing.assert_array_equal(a, b)
    chunks = -(-shard.entry.bytes // 5000)
    assert len(counter.shard_gets()) == chunks + shard.records
    _damage(store, shard.entry.file, "flip")
    fresh = readers.open(s3_bucket + "/out")
    with pytest.raises(ShardError, match=f"{store.url_of(shard.entry.file)}.*digest"):
        fresh._adapter.random_access(fresh.shards("train")[0], fresh._spec).read(0)


def test_tf_dataset_from_bucket_holds_few_shards_in_memory(local_sets, s3_bucket, tmp_path, monkeypatch):
    """Whole-object reads stream: at most the loader's read-ahead of shards is alive at once."""
    import gc
    import weakref

    from readers.formats import batching
    from readers.remote import RemoteFile

    src = synth.make_camvid(tmp_path / "src", splits={"train": 12}, size=[(32, 48)], seed=3)
    out = tmp_path / "one-per-shard"
    assert cli.main(["convert", str(src.root), str(out), "--size", "32x48", "--workers", "1",
                     "--shard-size", "1KB"]) == 0
    upload(str(out), s3_bucket + "/o")

    class Tracked(bytearray):
        pass

    live, peak = [0], [0]
    real = RemoteFile.read_whole

    def tracked(self):
        data = Tracked(real(self))
        live[0] += 1
        peak[0] = max(peak[0], live[0])
        weakref.finalize(data, lambda: live.__setitem__(0, live[0] - 1))
        return data

    monkeypatch.setattr(RemoteFile, "read_whole", tracked)
    ds = readers.open(s3_bucket + "/o")
    assert len(ds.shards("train")) == 12
    for _ in ds.tf_dataset("train", 1, shuffle=False):
        gc.collect()
    assert peak[0] <= batching.SHARDS_AHEAD + 3 < 12


def test_keras_dataset_from_bucket_reads_in_a_forked_worker(local_sets, s3_bucket):
    """Keras `use_multiprocessing` forks workers that inherit the readers: the object store
    reconnects in the child (fsspec clients are not fork-safe)."""
    import hashlib

    upload(local_sets["tfrecord"], s3_bucket + "/out")
    seq = readers.open(s3_bucket + "/out").keras_dataset("train", 2, shuffle=False)
    x, y = seq[0]  # the parent has used its connection before the fork
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        code = 1
        try:
            cx, cy = seq[len(seq) - 1]
            os.write(w, hashlib.sha256(cx.tobytes() + cy.tobytes()).hexdigest().encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    got = os.read(r, 100).decode()
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert status == 0
    lx, ly = readers.open(local_sets["tfrecord"]).keras_dataset("train", 2, shuffle=False)[len(seq) - 1]
    assert got == hashlib.sha256(lx.tobytes() + ly.tobytes()).hexdigest()


@pytest.mark.parametrize("fmt", ["tfrecord", "npz"])
def test_dataset_converted_into_the_bucket_reads_like_the_local_conversion(fmt, tmp_path, s3_bucket, capsys):
    """`imgshard convert SRC s3://...` (run-id shard names, lock object) then every reader and
    `verify` on the URL: the same records and batches as a local conversion."""
    src = synth.make_camvid(tmp_path / "src", splits={"train": 6, "val": 2}, size=[(32, 48)], seed=11)
    flags = ["--size", "32x48", "--workers", "1", "--format", fmt, "--shard-size", "12KB"]
    assert cli.main(["convert", str(src.root), str(tmp_path / "local"), *flags]) == 0
    assert cli.main(["convert", str(src.root), s3_bucket + "/out", *flags]) == 0
    remote = readers.open(s3_bucket + "/out", cache_dir=str(tmp_path / "cache"))
    assert all("-r" in s.entry.file for s in remote.shards("train"))  # run-id names
    _assert_same_readers(readers.open(str(tmp_path / "local")), remote, same_manifest=False)
    capsys.readouterr()
    assert cli.main(["verify", s3_bucket + "/out", "--json"]) == 0
    import json

    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["warnings"] == [] and report["records"] == 8
