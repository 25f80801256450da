"""`imgshard convert SRC s3://bucket/out` (and gs://, file://) against a real S3 server (moto on
127.0.0.1) and the GCS emulator: the same records as a local conversion, run-id shard names, the
lock object, the conditional publish, orphans, and append exactly-once over several runs."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest

from _bucketout import download, manifest_counts, records_by_key, versions
from _cron import convert_args, first_samples, run_cli, run_cli_process, source_keys
from _hostile import assert_named_error
from converter.bucket.lock import BucketLock
from converter.bucket.output import PublishRaceError
from converter.convert import convert
from converter.options import OutputOptions, RunOptions, SourceSpec
from converter.run.lock import LOCK_NAME, LockedError
from converter.testing import synth
from readers.manifest import MANIFEST_NAME, Manifest
from readers.storage import open_store

RUN_ID_NAME = re.compile(r"^(train|val)-\d{5}-r[0-9a-f]{8}\.(tfrecord|npz)$")


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> synth.SynthDataset:
    root = tmp_path_factory.mktemp("bucket-src")
    return synth.make_camvid(root / "gen", splits={"train": 18, "val": 6}, size=[(40, 56), (36, 50)], seed=18)



def _args(src, out, *extra, workers=1):
    return convert_args(src, out, "--shard-size", "8KB", *extra, size="32x48", workers=workers)


@pytest.mark.parametrize("fmt", ["tfrecord", "npz"])
def test_local_to_s3_equals_a_local_conversion_record_for_record(full, tmp_path, s3_bucket, fmt):
    src = first_samples(full, tmp_path / "src", 24)
    url = f"{s3_bucket}/ds"
    assert run_cli(_args(src, tmp_path / "local", "--format", fmt, workers=2)) == 0
    assert run_cli(_args(src, url, "--format", fmt, workers=2)) == 0
    names = [i.name for i in open_store(url).list()]
    shards = [n for n in names if n.endswith(f".{fmt}")]
    assert shards and all(RUN_ID_NAME.match(n) for n in shards), shards
    assert LOCK_NAME not in names  # released
    assert any(n.startswith("reports/convert-") for n in names)
    got = download(url, tmp_path / "back")
    local = records_by_key(tmp_path / "local")
    assert records_by_key(got) == local
    assert set(local) == source_keys(src)
    assert manifest_counts(got) == manifest_counts(tmp_path / "local")
    local_names = sorted(p.name for p in (tmp_path / "local").iterdir() if p.suffix == f".{fmt}")
    assert [re.sub(r"-r[0-9a-f]{8}", "", n) for n in shards] == local_names  # same shards, run id added


def test_file_url_output_is_the_local_folder(full, tmp_path):
    src = first_samples(full, tmp_path / "src", 10)
    assert run_cli(_args(src, f"file://{tmp_path}/out")) == 0
    assert run_cli(_args(src, tmp_path / "plain")) == 0
    a = sorted(p.name for p in (tmp_path / "out").iterdir() if p.suffix == ".tfrecord")
    assert a == sorted(p.name for p in (tmp_path / "plain").iterdir() if p.suffix == ".tfrecord")
    assert all("-r" not in n for n in a)  # local output keeps today's names
    assert records_by_key(tmp_path / "out") == records_by_key(tmp_path / "plain")


def test_append_exactly_once_over_several_runs_leaves_untouched_shards_alone(full, tmp_path, s3_bucket):
    """Runs over a growing source (then one changed source with --on-change replace): new keys
    are added once, the changed one replaced, and shards not rewritten keep their object version."""
    url = f"{s3_bucket}/ds"
    src = tmp_path / "src"
    before: dict[str, str] = {}
    for n in (8, 16, 24):
        first_samples(full, src, n)
        assert run_cli(_args(src, url)) == 0
        now = versions(url)
        for name, version in before.items():
            if RUN_ID_NAME.match(name) or name.endswith(".idx.npy"):
                assert now.get(name) == version, f"{name} was rewritten or removed"
        before = now
        got = download(url, tmp_path / f"back{n}")
        assert set(records_by_key(got)) == source_keys(src)  # records_by_key refuses a key twice
    manifest_version = versions(url)[MANIFEST_NAME]
    assert run_cli(_args(src, url)) == 0  # nothing new: nothing published
    assert versions(url)[MANIFEST_NAME] == manifest_version
    # change one source: --on-change replace rewrites its shard only
    image = sorted((src / "train").iterdir())[0]
    changed = synth.make_camvid(tmp_path / "other", splits={"train": 1}, size=[(40, 56)], seed=99)
    image.unlink()
    shutil.copyfile(next((changed.root / "train").iterdir()), image)
    assert run_cli(_args(src, url, "--on-change", "replace")) == 0
    after = versions(url)
    got = download(url, tmp_path / "back-replaced")
    records = records_by_key(got)
    assert set(records) == source_keys(src)
    local = tmp_path / "local"
    assert run_cli(_args(src, local)) == 0
    assert records_by_key(local) == records  # the replaced record equals a fresh conversion of the new image
    shards_before = {n for n in before if RUN_ID_NAME.match(n)}
    shards_after = {n for n in after if RUN_ID_NAME.match(n)}
    assert len(shards_before - shards_after) == 1 and len(shards_after - shards_before) == 1
    assert all(after[n] == before[n] for n in shards_before & shards_after)
    history = Manifest.load(str(got / MANIFEST_NAME)).history
    assert [h["added"] for h in history] == [8, 8, 8, 0] and history[-1]["replaced"] == 1


def test_second_run_exits_75_naming_the_lock_holder(full, tmp_path, s3_bucket):
    src = first_samples(full, tmp_path / "src", 8)
    url = f"{s3_bucket}/ds"
    store = open_store(url)
    with BucketLock(store, "0badf00d", ttl_seconds=60):
        proc = run_cli_process(_args(src, url))
    out = assert_named_error(proc, "0badf00d", LOCK_NAME, "expires at", codes=[75])
    assert len(out.strip().splitlines()) == 1, out
    assert [i.name for i in store.list()] == []  # the refused run changed nothing; the lock was released


def test_expired_lock_is_taken_over_and_released(full, tmp_path, s3_bucket, caplog):
    src = first_samples(full, tmp_path / "src", 8)
    url = f"{s3_bucket}/ds"
    store = open_store(url)
    stale = {"host": "gone-host", "pid": 4242, "run_id": "deadbeef", "created": "2020-01-01T00:00:00Z",
             "expires": "2020-01-01T00:05:00Z", "expires_epoch": 1577837100.0, "command": "imgshard convert"}
    store.create(LOCK_NAME, json.dumps(stale).encode())
    assert run_cli(_args(src, url)) == 0
    assert "took over the expired lock" in caplog.text and "deadbeef" in caplog.text
    assert not store.exists(LOCK_NAME)
    assert set(records_by_key(download(url, tmp_path / "back"))) == source_keys(src)


def test_two_takers_of_an_expired_lock_cannot_both_win(s3_bucket):
    store = open_store(f"{s3_bucket}/ds")
    store.create(LOCK_NAME, json.dumps({"expires_epoch": time.time() - 5, "run_id": "deadbeef"}).encode())
    stale = store.info(LOCK_NAME).version
    a, b = BucketLock(store, "aaaaaaaa", 30), BucketLock(store, "bbbbbbbb", 30)
    assert a._take_over(stale, {}) is True
    assert b._take_over(stale, {}) is False  # the same stale version is gone
    with pytest.raises(LockedError, match="aaaaaaaa"):
        b.__enter__()
    a.__exit__(None, None, None)


def test_lock_is_renewed_by_the_heartbeat_and_a_lost_lock_stops_the_publish(s3_bucket):
    store = open_store(f"{s3_bucket}/ds")
    with BucketLock(store, "cafecafe", ttl_seconds=1.5) as lock:
        first = store.info(LOCK_NAME).version
        time.sleep(1.2)  # two beats
        assert store.info(LOCK_NAME).version != first and lock.lost is None
        lock.check()
        store.put(LOCK_NAME, b'{"run_id": "intruder"}')  # someone else's lock now
        time.sleep(0.8)
        with pytest.raises(LockedError, match="lost the lock"):
            lock.check()
    assert store.read(LOCK_NAME) == b'{"run_id": "intruder"}'  # not deleted: it was not ours any more


def test_racing_publish_is_refused_and_publishes_nothing(full, tmp_path, s3_bucket):
    src = first_samples(full, tmp_path / "src", 16)
    url = f"{s3_bucket}/ds"
    first_samples(full, tmp_path / "first", 8)
    assert run_cli(_args(tmp_path / "first", url)) == 0
    store = open_store(url)
    published = store.read(MANIFEST_NAME)
    racer = published.replace(b'"tool_version"', b'"racer": 1, "tool_version"', 1)

    def another_run_publishes(plan) -> None:  # between this run's read of the manifest and its publish
        store.put(MANIFEST_NAME, racer)

    options = OutputOptions(size=(32, 48))
    with pytest.raises(PublishRaceError, match="Another run published"):
        convert(SourceSpec(root=str(src)), url, options, RunOptions(workers=1, shard_size_bytes=8192),
                on_plan=another_run_publishes)
    assert store.read(MANIFEST_NAME) == racer
    listed = {s.file for _, s in Manifest.load(str(download(url, tmp_path / "b") / MANIFEST_NAME)).iter_shards()}
    shards = {i.name for i in store.list() if RUN_ID_NAME.match(i.name)}
    assert shards == listed  # this run's uploads were removed
    assert not store.exists(LOCK_NAME)


def test_orphans_of_failed_runs_are_removed_and_reported(full, tmp_path, s3_bucket):
    src = first_samples(full, tmp_path / "src", 8)
    url = f"{s3_bucket}/ds"
    assert run_cli(_args(src, url)) == 0
    store = open_store(url)
    orphans = ["train-00007-r0123abcd.tfrecord", "train-00007-r0123abcd.tfrecord.0123456789abcdef.idx.npy"]
    for name in orphans:
        store.put(name, b"late PUT of a killed run")
    store.put("notes.txt", b"not ours")
    first_samples(full, src, 16)
    assert run_cli(_args(src, url)) == 0
    names = {i.name for i in store.list()}
    assert not names & set(orphans) and "notes.txt" in names
    reports = sorted(n for n in names if n.startswith("reports/"))
    assert json.loads(store.read(reports[-1]))["orphans_removed"] == orphans
    assert set(records_by_key(download(url, tmp_path / "back"))) == source_keys(src)


def test_gcs_output_through_the_same_code_path(full, tmp_path, gcs_bucket):
    """The emulator does not enforce preconditions: this covers the non-racing path only."""
    src = first_samples(full, tmp_path / "src", 12)
    url = f"{gcs_bucket}/ds"
    assert run_cli(_args(src, url)) == 0
    first_samples(full, src, 20)
    assert run_cli(_args(src, url)) == 0
    assert run_cli(_args(src, tmp_path / "local")) == 0
    got = download(url, tmp_path / "back")
    assert records_by_key(got) == records_by_key(tmp_path / "local")
    assert not open_store(url).exists(LOCK_NAME)


def test_missing_bucket_is_one_named_line_exit_74(full, tmp_path, s3_server):
    src = first_samples(full, tmp_path / "src", 4)
    proc = run_cli_process(_args(src, "s3://imgshard-no-such-bucket/ds"))
    out = assert_named_error(proc, "s3://imgshard-no-such-bucket/ds", "Nothing was published", codes=[74])
    assert len(out.strip().splitlines()) == 1, out


def test_bad_storage_option_and_lock_ttl_are_named_errors(full, tmp_path, s3_bucket):
    src = first_samples(full, tmp_path / "src", 4)
    proc = run_cli_process(_args(src, f"{s3_bucket}/ds", "--storage-option", "novalue"))
    assert_named_error(proc, "--storage-option", "KEY=VALUE")
    proc = run_cli_process(_args(src, f"{s3_bucket}/ds", "--lock-ttl", "0"))
    assert_named_error(proc, "--lock-ttl")


def test_index_files_are_downloaded_once_into_the_staging_cache(full, tmp_path, s3_bucket, monkeypatch):
    from readers.storage.store import ObjectStore

    src = tmp_path / "src"
    url = f"{s3_bucket}/ds"
    staging = tmp_path / "staging"
    downloads: list[str] = []
    real = ObjectStore.download
    monkeypatch.setattr(ObjectStore, "download", lambda self, name, local: (downloads.append(name),
                                                                             real(self, name, local))[1])
    run = RunOptions(workers=1, shard_size_bytes=8192, staging_dir=str(staging))
    options = OutputOptions(size=(32, 48))
    for n in (8, 16, 24):
        first_samples(full, src, n)
        convert(SourceSpec(root=str(src)), url, options, run)
    fetched = [d for d in downloads if d.endswith(".idx.npy")]
    m = Manifest.load(str(download(url, tmp_path / "back") / MANIFEST_NAME))
    indexes = [s.index.file for _, s in m.iter_shards()]
    assert len(fetched) == len(set(fetched))  # each index file downloaded once over the three runs
    assert set(fetched) < set(indexes)  # the last run's own index files were never downloaded
    cached = {p.name for p in staging.glob("imgshard-index-cache-*/*/*")}
    assert cached and cached <= set(indexes)
    assert not list(staging.glob("imgshard-run-*"))  # per-run staging folders removed


def test_a_paused_holder_whose_lock_was_taken_over_cannot_publish(full, tmp_path, s3_bucket, caplog):
    """The zombie reads the manifest, stops renewing (paused), its lock expires; the next run takes
    over, fences the manifest (a new version) and removes the zombie's shard as an orphan; the
    zombie's compare-and-swap then fails instead of listing a removed shard."""
    from converter.bucket.output import BucketOutput

    src = first_samples(full, tmp_path / "src", 8)
    url = f"{s3_bucket}/ds"
    assert run_cli(_args(src, url)) == 0
    store = open_store(url)
    zombie = BucketOutput(url, lock_ttl_seconds=1).__enter__()
    old = zombie.prepare(False, lambda m: None)
    zombie.lock._stop.set()  # paused: no more renewals
    zombie.lock._thread.join()
    late = f"train-00042-r{zombie.run_id}.tfrecord"
    store.put(late, b"the zombie's shard")
    time.sleep(1.2)
    assert run_cli(_args(src, url)) == 0  # nothing new, but it took over the lock and removed the orphan
    assert "took over the expired lock" in caplog.text
    assert not store.exists(late)
    document = store.read(MANIFEST_NAME)
    with pytest.raises(PublishRaceError):
        zombie._publish_manifest(old)
    assert store.read(MANIFEST_NAME) == document
    with pytest.raises(LockedError, match="lost the lock"):
        zombie.lock.check()
    zombie.__exit__(PublishRaceError, None, None)
    assert set(records_by_key(download(url, tmp_path / "back"))) == source_keys(src)


def test_bad_input_publishes_nothing_and_removes_its_uploads(full, tmp_path, s3_bucket):
    src = first_samples(full, tmp_path / "src", 16)
    victim = sorted((src / "train").iterdir())[3]
    data = victim.read_bytes()
    victim.unlink()  # a hard link into the generated set: replace it, do not write through it
    victim.write_bytes(data[: len(data) // 2])  # truncated PNG
    url = f"{s3_bucket}/ds"
    proc = run_cli_process(_args(src, url, workers=2))
    assert_named_error(proc, victim.name, "nothing was published", codes=[65])
    names = [i.name for i in open_store(url).list()]
    assert names and all(n.startswith("reports/") for n in names), names  # a report, no shard, no lock
    report = json.loads(open_store(url).read(names[0]))
    assert report["published"] is False and report["counts"]["bad"] == 1


def test_a_local_dataset_copied_into_a_bucket_grows_there(full, tmp_path, s3_bucket):
    """A version-2 dataset with local shard names (an `aws s3 sync` of an old folder): the first
    bucket run migrates it to version 3 (index files, a compare-and-swap), then adds to it."""
    from _cron import as_version_2

    src = first_samples(full, tmp_path / "src", 12)
    local = tmp_path / "local"
    assert run_cli(_args(src, local)) == 0
    as_version_2(local)
    url = f"{s3_bucket}/ds"
    store = open_store(url)
    for p in sorted(local.iterdir()):
        if p.is_file() and not p.name.startswith("."):
            store.put_file(p.name, str(p))
    first_samples(full, src, 20)
    assert run_cli(_args(src, url)) == 0
    got = download(url, tmp_path / "back")
    m = Manifest.load(str(got / MANIFEST_NAME))
    assert m.version == 3 and m.indexed
    names = [s.file for _, s in m.iter_shards()]
    assert any("-r" not in n for n in names) and any(RUN_ID_NAME.match(n) for n in names)
    assert set(records_by_key(got)) == source_keys(src)
    assert [h.get("migrated_to") for h in m.history][-2:] == [3, None]


def test_a_version_2_dataset_in_a_bucket_with_a_flipped_inline_key_is_not_migrated(full, tmp_path, s3_bucket,
                                                                                       capsys):
    """Issue 25, item 6, in a bucket: the shard objects are read (downloaded one at a time) and
    their keys compared with the v2 manifest's inline samples before any index file is written; a
    flipped bit in one key stops the run naming the shard object, the record and both keys, and
    the bucket keeps exactly the objects it had."""
    from _cron import as_version_2_with_a_flipped_key

    src = first_samples(full, tmp_path / "src", 12)
    local = tmp_path / "local"
    assert run_cli(_args(src, local)) == 0
    shard, good, flipped = as_version_2_with_a_flipped_key(local, 0)
    url = f"{s3_bucket}/ds"
    store = open_store(url)
    for p in sorted(local.iterdir()):
        if p.is_file() and not p.name.startswith("."):
            store.put_file(p.name, str(p))
    before = {i.name: store.read(i.name) for i in store.list()}
    capsys.readouterr()
    first_samples(full, src, 16)
    for _ in range(2):  # and again: the next run is refused the same way
        assert run_cli(_args(src, url)) == 1
        err = capsys.readouterr().err
        assert store.url_of(shard["file"]) in err and f"record 1 has key {good!r}" in err and repr(flipped) in err, err
        assert "Nothing was written" in err and "Traceback" not in err
        after = {i.name: store.read(i.name) for i in store.list() if not i.name.startswith("reports/")}
        assert after == {n: b for n, b in before.items() if not n.startswith("reports/")}  # no index, no shard


def test_rebuild_in_a_bucket_replaces_every_shard_with_exact_counts(full, tmp_path, s3_bucket):
    src = first_samples(full, tmp_path / "src", 12)
    url = f"{s3_bucket}/ds"
    assert run_cli(_args(src, url)) == 0
    first = {n for n in versions(url) if RUN_ID_NAME.match(n)}
    first_samples(full, src, 16)
    assert run_cli(convert_args(src, url, "--shard-size", "8KB", "--rebuild", size="24x40")) == 0
    now = {n for n in versions(url) if RUN_ID_NAME.match(n)}
    assert now and not now & first  # the old shards were removed after the publish
    got = download(url, tmp_path / "back")
    last = Manifest.load(str(got / MANIFEST_NAME)).history[-1]
    assert (last["added"], last["pruned"], last.get("approximate")) == (4, 0, None)
    assert set(records_by_key(got)) == source_keys(src)


def test_compact_refuses_a_bucket_with_a_named_error(s3_bucket, tmp_path):
    proc = run_cli_process(["compact", f"{s3_bucket}/ds"])
    assert_named_error(proc, f"{s3_bucket}/ds", "local folders only", codes=[1])
    assert not (Path.cwd() / "s3:").exists()


def test_an_empty_first_run_into_a_bucket_names_the_url_and_publishes_nothing(tmp_path, s3_bucket):
    src = tmp_path / "src"
    (src / "train").mkdir(parents=True)
    (src / "train_labels").mkdir()
    (src / "class_dict.csv").write_text("name,r,g,b\nSky,128,128,128\nRoad,128,64,128\n")
    proc = run_cli_process(_args(src, f"{s3_bucket}/ds"))
    out = assert_named_error(proc, f"{s3_bucket}/ds holds no dataset yet", codes=[65])
    assert "imgshard-run-" not in out  # the staging folder is not what the user named
    assert not open_store(f"{s3_bucket}/ds").exists(MANIFEST_NAME)


def test_uploads_overlap_the_conversion_of_the_next_shards(full, tmp_path, s3_bucket, monkeypatch):
    from readers.storage.store import ObjectStore

    src = first_samples(full, tmp_path / "src", 24)
    puts: list[tuple[float, float]] = []
    real = ObjectStore.put_file

    def slow_put(self, name, local):
        t0 = time.monotonic()
        time.sleep(0.2)  # a slow network
        real(self, name, local)
        if name.endswith(".tfrecord"):
            puts.append((t0, time.monotonic()))

    samples: list[float] = []
    monkeypatch.setattr(ObjectStore, "put_file", slow_put)
    result = convert(SourceSpec(root=str(src)), f"{s3_bucket}/ds", OutputOptions(size=(32, 48)),
                     RunOptions(workers=1, shard_size_bytes=8192), on_progress=lambda n: samples.append(time.monotonic()))
    assert result.published and len(puts) == len(result.written) >= 4
    during = [t for t in samples if any(a < t < b for a, b in puts)]
    assert during, "no sample was converted while a shard was uploading"
    assert records_by_key(download(f"{s3_bucket}/ds", tmp_path / "back")).keys() == source_keys(src)


def test_a_failed_upload_publishes_nothing_and_removes_the_others(full, tmp_path, s3_bucket, monkeypatch):
    from readers.storage import StorageError
    from readers.storage.store import ObjectStore

    src = first_samples(full, tmp_path / "src", 24)
    url = f"{s3_bucket}/ds"
    real = ObjectStore.put_file
    calls = []

    def failing_put(self, name, local):
        calls.append(name)
        if len(calls) == 3:
            raise StorageError(f"{self.url_of(name)}: uploading failed: connection reset; check the network")
        real(self, name, local)

    monkeypatch.setattr(ObjectStore, "put_file", failing_put)
    from converter.convert import OutputWriteError

    with pytest.raises(OutputWriteError, match="connection reset.*Nothing was published"):
        convert(SourceSpec(root=str(src)), url, OutputOptions(size=(32, 48)), RunOptions(workers=1, shard_size_bytes=8192))
    names = [i.name for i in open_store(url).list()]
    assert not any(RUN_ID_NAME.match(n) or n.endswith(".idx.npy") or n == MANIFEST_NAME for n in names), names


def test_an_unwritable_staging_dir_is_one_named_line_exit_74(full, tmp_path, s3_bucket):
    src = first_samples(full, tmp_path / "src", 4)
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    proc = run_cli_process(_args(src, f"{s3_bucket}/ds", "--staging-dir", str(blocker / "staging")))
    out = assert_named_error(proc, "staging folder", "--staging-dir", codes=[74])
    assert len(out.strip().splitlines()) == 1, out
    assert open_store(f"{s3_bucket}/ds").list() == []  # not even a lock was taken


def test_the_bucket_root_is_a_dataset_location_too(full, tmp_path, s3_bucket):
    src = first_samples(full, tmp_path / "src", 8)
    assert run_cli(_args(src, s3_bucket)) == 0
    first_samples(full, src, 12)
    assert run_cli(_args(src, s3_bucket + "/")) == 0  # a trailing slash names the same place
    assert set(records_by_key(download(s3_bucket, tmp_path / "back"))) == source_keys(src)


def test_a_run_that_loses_its_lock_stops_and_publishes_nothing(full, tmp_path, s3_bucket):
    from converter.bucket.lock import LockLostError

    src = first_samples(full, tmp_path / "src", 16)
    url = f"{s3_bucket}/ds"
    store = open_store(url)

    def someone_takes_the_lock(plan) -> None:
        store.put(LOCK_NAME, b'{"run_id": "intruder"}')
        time.sleep(0.8)  # two heartbeats: the renewal is refused

    with pytest.raises(LockLostError, match="lost the lock"):
        convert(SourceSpec(root=str(src)), url, OutputOptions(size=(32, 48)),
                RunOptions(workers=1, shard_size_bytes=8192, lock_ttl_seconds=1), on_plan=someone_takes_the_lock)
    names = [i.name for i in store.list()]
    assert names == [LOCK_NAME] and store.read(LOCK_NAME) == b'{"run_id": "intruder"}'


def test_storage_option_endpoint_reaches_the_server_without_the_environment(full, tmp_path, s3_bucket, s3_server):
    import os
    import subprocess

    from _cron import ROOT, child_env, cli_command

    src = first_samples(full, tmp_path / "src", 8)
    env = child_env()
    env.pop("AWS_ENDPOINT_URL")
    args = _args(src, f"{s3_bucket}/ds")
    ok = subprocess.run(cli_command(args + ["--storage-option", f"endpoint_url={s3_server}"]), cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert set(records_by_key(download(f"{s3_bucket}/ds", tmp_path / "back"))) == source_keys(src)
    assert "AWS_ENDPOINT_URL" in os.environ  # the test's own environment is untouched
