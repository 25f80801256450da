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
from _cron import all_pairs, convert_args, link_samples, run_cli, run_cli_process, source_keys
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


def _grow(full: synth.SynthDataset, dest: Path, n: int) -> Path:
    return link_samples(full, dest, all_pairs(full)[:n])


def _args(src, out, *extra, workers=1):
    return convert_args(src, out, "--shard-size", "8KB", *extra, size="32x48", workers=workers)


@pytest.mark.parametrize("fmt", ["tfrecord", "npz"])
def test_local_to_s3_equals_a_local_conversion_record_for_record(full, tmp_path, s3_bucket, fmt):
    src = _grow(full, tmp_path / "src", 24)
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
    src = _grow(full, tmp_path / "src", 10)
    assert run_cli(_args(src, f"file://{tmp_path}/out")) == 0
    assert run_cli(_args(src, tmp_path / "plain")) == 0
    a = sorted(p.name for p in (tmp_path / "out").iterdir() if p.suffix == ".tfrecord")
    assert a == sorted(p.name for p in (tmp_path / "plain").iterdir() if p.suffix == ".tfrecord")
    assert all("-r" not in n for n in a)  # local output keeps today's names
    assert records_by_key(tmp_path / "out") == records_by_key(tmp_path / "plain")
