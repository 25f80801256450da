"""Dask without a shared filesystem: OUT is a bucket (moto S3 on 127.0.0.1); two local worker
processes write shards into their own scratch folders and upload them; the driver only plans
and publishes. The output equals a local conversion record for record, also after a rewrite
(--prune: the workers download the old shards they copy records from)."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from _bucketout import download, records_by_key
from _cron import all_pairs, link_samples, source_keys
from converter.convert import convert
from converter.options import OutputOptions, RunOptions, SourceSpec
from converter.testing import synth
from readers.storage import open_store

pytest.importorskip("distributed")

OPTIONS = OutputOptions(size=(32, 48))


def _run(**kw) -> RunOptions:
    return RunOptions(shard_size_bytes=6 * 32 * 48 * 4, **kw)


@pytest.mark.slow
def test_dask_two_workers_upload_to_a_bucket_without_a_shared_output_folder(tmp_path, s3_bucket):
    full = synth.make_camvid(tmp_path / "gen", splits={"train": 20, "val": 6}, size=[(40, 56), (36, 50)], seed=5)
    src = link_samples(full, tmp_path / "src", all_pairs(full))
    url = f"{s3_bucket}/ds"
    result = convert(SourceSpec(root=str(src)), url, OPTIONS, _run(backend="dask", workers=2,
                                                                     staging_dir=str(tmp_path / "staging")))
    assert result.published and result.out_dir == url
    store = open_store(url)
    report = json.loads(store.read(result.report_path.split(url + "/", 1)[1]))
    assert report["workers"]["backend"] == "dask"
    assert report["uploads"]["uploaded_objects"] == 0  # the driver uploaded no shard: the workers did
    shards = [i.name for i in store.list() if i.name.endswith(".tfrecord")]
    assert len(shards) >= 4 and all(re.search(r"-r[0-9a-f]{8}\.tfrecord$", n) for n in shards)
    assert list((tmp_path / "staging").glob("imgshard-run-*")) == []  # staging removed
    local = tmp_path / "local"
    convert(SourceSpec(root=str(src)), str(local), OPTIONS, _run(workers=1))
    assert records_by_key(download(url, tmp_path / "back")) == records_by_key(local)

    # a rewrite on the workers: 3 samples leave SRC (the same folders: the same prune scope), --prune drops
    # them, their shards are rewritten from the old ones
    shutil.rmtree(src)
    pruned = link_samples(full, src, [p for i, p in enumerate(all_pairs(full)) if i % 9 != 2])
    result = convert(SourceSpec(root=str(pruned)), url, OPTIONS, _run(backend="dask", workers=2, prune=True))
    assert result.plan.pruned == 3 and result.published
    local2 = tmp_path / "local2"
    convert(SourceSpec(root=str(pruned)), str(local2), OPTIONS, _run(workers=1))
    got = records_by_key(download(url, tmp_path / "back2"))
    assert set(got) == source_keys(pruned)
    assert got == records_by_key(local2)



@pytest.mark.slow
def test_workers_that_cannot_reach_the_output_bucket_are_named_before_any_task(tmp_path, s3_bucket):
    import distributed

    from converter.bucket.worker import BucketTarget
    from converter.run.dask_runner import DaskBackendError, _check_shared_storage
    from converter.run.task import WorkerContext

    ctx = WorkerContext(str(tmp_path / "staging"), OPTIONS, (), str(tmp_path), 1 << 20)
    good = BucketTarget(open_store(f"{s3_bucket}/ds"))
    bad = BucketTarget(open_store(f"{s3_bucket}/ds", {"endpoint_url": "http://127.0.0.1:9"}))  # nothing listens
    with distributed.LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        _check_shared_storage(client, ctx, "t", None, good)  # no output folder needed on the workers
        with pytest.raises(DaskBackendError, match=r"(?s)cannot reach the output bucket .*127\.0\.0\.1:9"):
            _check_shared_storage(client, ctx, "t", None, bad)
        missing = WorkerContext(str(tmp_path), OPTIONS, (), str(tmp_path / "no-such-sources"), 1 << 20)
        with pytest.raises(DaskBackendError, match="no-such-sources"):
            _check_shared_storage(client, missing, "t", None, good)


@pytest.mark.slow
def test_dask_bucket_to_bucket_no_shared_folder_at_all(tmp_path, s3_bucket):
    """Sources and OUT both in the bucket: the workers read sources by URL and upload shards; no
    folder is shared with the driver. Equal to a local conversion of the same files.
    Runs once sources in buckets (converter.discover.files) are on the branch; passed on a trial merge."""
    pytest.importorskip("converter.discover.files", reason="sources in buckets are not merged yet")
    full = synth.make_camvid(tmp_path / "gen", splits={"train": 14, "val": 4}, size=[(40, 56), (36, 50)], seed=8)
    store = open_store(f"{s3_bucket}/raw")
    for path in sorted(full.root.rglob("*")):
        if path.is_file():
            store.put(path.relative_to(full.root).as_posix(), path.read_bytes())
    url = f"{s3_bucket}/out"
    result = convert(SourceSpec(root=f"{s3_bucket}/raw"), url, OPTIONS, _run(backend="dask", workers=2))
    assert result.published
    local = tmp_path / "local"
    convert(SourceSpec(root=str(full.root)), str(local), OPTIONS, _run(workers=1))
    got = records_by_key(download(url, tmp_path / "back"))
    assert got == records_by_key(local) and len(got) == 18
