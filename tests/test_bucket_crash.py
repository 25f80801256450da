"""kill -9 of a run into a bucket (moto S3 on 127.0.0.1) at random moments and at chosen ones
(while shards upload, right before the manifest's PUT, right after it): the published dataset
is always whole (read back through `readers`, counts as the manifest says) and is the previous
or the new one; the next run takes over the dead run's lock once it expired, removes its
orphans, and ends equal to a clean conversion."""

from __future__ import annotations

import random
import subprocess
import time
from pathlib import Path

import pytest

from _bucketout import download, records_by_key
from _cron import (ROOT, all_pairs, child_env, cli_command, convert_args, kill_session, link_samples, run_cli,
                   source_keys, start_cli_session)
from converter.inspect.verify import verify
from converter.run.lock import LOCK_NAME
from converter.testing import synth
from readers.manifest import MANIFEST_NAME, Manifest
from readers.storage import open_store

LOCK_TTL = "4"  # a killed run's lock is taken over 4 s after its last renewal (renewed every 1.3 s: a 2 s TTL was lost once in CI on a slow, loaded machine)


@pytest.fixture(scope="module")
def srcs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bucket-crash")
    full = synth.make_camvid(root / "gen", splits={"train": 60, "val": 12}, size=[(240, 320), (200, 300)], seed=7)
    pairs = all_pairs(full)
    return {"half": link_samples(full, root / "half", pairs[::2]), "full": link_samples(full, root / "full", pairs)}


def _args(src: Path, out: str) -> list[str]:
    return convert_args(src, out, "--shard-size", "512KB", "--lock-ttl", LOCK_TTL, size="256x256", workers=2)


def _kill(proc: subprocess.Popen) -> None:
    kill_session(proc)
    proc.wait(timeout=60)


def _published(url: str, dest: Path) -> set[str] | None:
    """The keys of the published dataset, after checking it is whole; None when there is none."""
    if not open_store(url).exists(MANIFEST_NAME):
        return None
    folder = download(url, dest)
    report = verify(folder, deep=True)
    assert report.ok, [str(p) for p in report.errors]
    records = records_by_key(folder)
    manifest = Manifest.load(str(folder / MANIFEST_NAME))
    assert len(records) == sum(e.num_samples for e in manifest.splits.values())
    return set(records)


def _rerun_and_check(url: str, src: Path, reference: dict, tmp_path: Path, tag: str) -> None:
    store = open_store(url)
    deadline = time.monotonic() + 30
    while True:  # the dead run's lock expires LOCK_TTL s after its last renewal
        again = subprocess.run(cli_command(_args(src, url)), cwd=ROOT, env=child_env(), capture_output=True,
                               text=True, timeout=300)
        if again.returncode != 75 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert again.returncode == 0, again.stderr
    got = download(url, tmp_path / f"final-{tag}")
    assert records_by_key(got) == reference
    listed = {f for _, s in Manifest.load(str(got / MANIFEST_NAME)).iter_shards()
              for f in (s.file, s.index.file)}
    leftovers = {i.name for i in store.list() if not i.name.startswith("reports/") and i.name != MANIFEST_NAME}
    assert leftovers == listed, sorted(leftovers ^ listed)  # orphans removed, lock released


def _wait_for(predicate, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the moment never came"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def reference(srcs, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bucket-crash-ref") / "local"
    assert run_cli(convert_args(srcs["full"], out, "--shard-size", "512KB", size="256x256", workers=1)) == 0
    return records_by_key(out)


@pytest.mark.slow
def test_kill_9_at_random_moments_leaves_the_bucket_dataset_whole(srcs, reference, tmp_path, s3_bucket):
    t0 = time.monotonic()
    assert run_cli(_args(srcs["full"], f"{s3_bucket}/timing")) == 0
    duration = time.monotonic() - t0
    rng = random.Random(18)
    n = 6
    for i in range(n):
        url = f"{s3_bucket}/rand-{i}"
        before = None
        if i % 2:  # an incremental run: the half dataset is published first
            assert run_cli(_args(srcs["half"], url)) == 0
            before = source_keys(srcs["half"])
        proc = start_cli_session(stderr=subprocess.DEVNULL, args=_args(srcs["full"], url))
        moment = duration * (i + rng.random()) / n
        time.sleep(moment)
        _kill(proc)
        published = _published(url, tmp_path / f"after-kill-{i}")
        assert published in (before, source_keys(srcs["full"])), (i, moment)
        _rerun_and_check(url, srcs["full"], reference, tmp_path, f"rand-{i}")


def _new_shards(store, manifest_names: set[str]) -> int:
    return sum(1 for i in store.list() if i.name.endswith(".tfrecord") and i.name not in manifest_names)


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["during-uploads", "before-publish", "after-publish"])
def test_kill_9_at_chosen_moments_of_an_incremental_run(srcs, reference, tmp_path, s3_bucket, moment):
    url = f"{s3_bucket}/ds"
    store = open_store(url)
    assert run_cli(_args(srcs["half"], url)) == 0
    old_version = store.info(MANIFEST_NAME).version
    listed = {s.file for _, s in Manifest.load(str(download(url, tmp_path / "half") / MANIFEST_NAME)).iter_shards()}
    # how many shards the increment writes (a clean run elsewhere)
    assert run_cli(_args(srcs["half"], f"{url}-probe")) == 0
    assert run_cli(_args(srcs["full"], f"{url}-probe")) == 0
    probe = Manifest.load(str(download(f"{url}-probe", tmp_path / "probe") / MANIFEST_NAME))
    added = sum(1 for _, s in probe.iter_shards()) - len(listed)
    proc = start_cli_session(stderr=subprocess.DEVNULL, args=_args(srcs["full"], url))
    if moment == "during-uploads":
        _wait_for(lambda: _new_shards(store, listed) >= 1)
    elif moment == "before-publish":
        _wait_for(lambda: _new_shards(store, listed) >= added)
    else:
        _wait_for(lambda: store.info(MANIFEST_NAME).version != old_version)
    _kill(proc)
    published = _published(url, tmp_path / "after-kill")
    assert published in (source_keys(srcs["half"]), source_keys(srcs["full"]))
    if moment == "after-publish":
        assert published == source_keys(srcs["full"])
    # a SIGKILL leaves the lock to expire, unless the run had already published and released it (the
    # "before-publish" moment races with the publish that follows the last upload within milliseconds)
    assert store.exists(LOCK_NAME) or published == source_keys(srcs["full"])
    _rerun_and_check(url, srcs["full"], reference, tmp_path, moment)
