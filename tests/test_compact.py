"""`imgshard compact`: small shards of nightly runs merged by copying records, exactly once, crash-safe."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import readers
from converter.testing import synth
from converter.run.compact import plan_groups
from readers.manifest import Manifest, ShardEntry
from tests._cron import (
    ROOT,
    all_pairs,
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

PER_SAMPLE = 32 * 32 * 4  # 32x32 RGB + uint8 class map


@pytest.fixture
def nightly(tmp_path: Path) -> tuple[Path, Path]:
    """A dataset grown by 5 runs of 3 pairs (train) each: many small shards."""
    full = synth.make_camvid(tmp_path / "full", splits={"train": 15, "val": 3}, size=[(40, 56), (36, 48)], seed=23)
    pairs = all_pairs(full)
    src, out = tmp_path / "src", tmp_path / "out"
    for night in range(5):
        link_samples(full, src, pairs[: 3 * (night + 1) + (3 if night == 4 else 0)])
        assert run_cli(convert_args(src, out)) == 0
    return src, out


def _records(out: Path) -> dict[str, tuple[bytes, bytes]]:
    ds = readers.open(out)
    return {r.key: (r.image.tobytes(), r.mask.tobytes()) for split in ds.splits for r in ds.records(split)}


def test_plan_groups_packs_consecutive_small_shards_up_to_the_target():
    def shard(i: int, records: int) -> ShardEntry:
        return ShardEntry(f"train-{i:05d}.tfrecord", records, records, "xxh3_128:0")

    shards = (shard(0, 100), shard(1, 10), shard(2, 20), shard(3, 30), shard(4, 90), shard(5, 5), shard(6, 6))
    groups = plan_groups(shards, 1, 100)  # small: under 50
    assert [[s.file[-14:-9] for s in g] for g in groups] == [["00001", "00002", "00003"], ["00005", "00006"]]
    assert plan_groups(shards[:2], 1, 100) == []  # a lone small shard is left alone


def test_compact_merges_small_shards_and_keeps_every_record_exactly_once(nightly, capsys):
    src, out = nightly
    before = Manifest.load(out)
    records = _records(out)
    old_train = [s.file for s in before.shards("train")]
    assert len(old_train) >= 5
    capsys.readouterr()
    assert run_cli(["compact", str(out), "--target-shard-size", str(64 * PER_SAMPLE), "--workers", "2"]) == 0
    assert "Compacted" in capsys.readouterr().err
    after = Manifest.load(out)
    new_train = [s.file for s in after.shards("train")]
    assert len(new_train) < len(old_train)
    assert not set(new_train) & set(old_train)
    assert min(int(f[6:11]) for f in new_train) >= before.splits["train"].next_shard_index  # names never reused
    assert not any((out / f).exists() for f in old_train)
    assert _records(out) == records  # same keys, same pixels, each once
    assert after.splits["train"].num_samples == before.splits["train"].num_samples
    assert after.history[-1]["compacted"] == len(old_train) and after.history[-1]["samples"] == len(records)
    assert_whole(out, source_keys(src))
    # class counts carried over
    assert (readers.open(out).class_pixel_counts("train") == np.asarray(
        before.splits["train"].class_pixels(before.num_classes))).all()
    # nothing more to do; and the next nightly run finds nothing new in the compacted shards
    hashes, manifest = shard_hashes(out), manifest_bytes(out)
    assert run_cli(["compact", str(out), "--target-shard-size", str(64 * PER_SAMPLE), "-q"]) == 0
    assert run_cli(convert_args(src, out)) == 0
    assert shard_hashes(out) == hashes and manifest_bytes(out) == manifest


@pytest.mark.parametrize("fmt", ["tfrecord", "npz"])
def test_compact_copies_encoded_records_as_stored(tmp_path, fmt):
    """PNG-encoded images are copied as stored (not re-encoded): same pixels and bytes per key."""
    full = synth.make_camvid(tmp_path / "full", splits={"train": 8}, size=(40, 56), seed=29)
    pairs = all_pairs(full)
    src, out = tmp_path / "src", tmp_path / "out"
    for night in range(4):
        link_samples(full, src, pairs[: 2 * (night + 1)])
        assert run_cli(convert_args(src, out, "--format", fmt, "--image-encoding", "png")) == 0
    records = _records(out)
    assert len(Manifest.load(out).shards("train")) == 4
    assert run_cli(["compact", str(out), "--target-shard-size", str(64 * PER_SAMPLE), "-q"]) == 0
    assert len(Manifest.load(out).shards("train")) == 1
    assert _records(out) == records
    assert_whole(out, source_keys(src))


@pytest.mark.parametrize("target,nth,when", [
    (".tfrecord", 1, "before"),    # the merged shard not yet renamed
    (".tfrecord", 1, "after"),
    ("imgshard.json", 1, "before"),  # merged shards renamed, manifest not yet
    ("imgshard.json", 1, "after"),   # published, the old shards not yet deleted
])
def test_compact_survives_kill_9(nightly, target, nth, when):
    src, out = nightly
    records = _records(out)
    before = manifest_bytes(out)
    args = ["compact", str(out), "--target-shard-size", str(64 * PER_SAMPLE), "--workers", "1"]
    crashed = subprocess.run([sys.executable, "-c", KILL_AT_RENAME, target, str(nth), when, *args], cwd=ROOT,
                             env=child_env(), capture_output=True, text=True, timeout=120)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert _records(out) == records
    counts = record_keys(out)
    assert max(counts.values()) == 1
    if target == "imgshard.json" and when == "after":
        assert manifest_bytes(out) != before
    else:
        assert manifest_bytes(out) == before
    assert run_cli(args) == 0
    assert_whole(out, source_keys(src))
    assert _records(out) == records
