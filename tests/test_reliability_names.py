"""Issue 25, item 1: one damaged number in the manifest never makes a run write over (and then
delete) a published shard. Shard and index names are checked against the manifest and the disk."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from converter.plan.names import NameCollisionError, refuse_taken_names
from converter.testing import synth
from readers.index import shard_keys
from readers.manifest import MANIFEST_NAME, Manifest, ManifestError
from tests._cron import all_pairs, convert_args, link_samples, run_cli


@pytest.fixture
def grown(tmp_path: Path) -> tuple[synth.SynthDataset, Path, Path]:
    """A dataset grown by 3 runs of 2 pairs each (3 small train shards), and 2 pairs left to add."""
    full = synth.make_camvid(tmp_path / "full", splits={"train": 8}, size=[(40, 56), (36, 48)], seed=31)
    src, out = tmp_path / "src", tmp_path / "out"
    for night in range(3):
        link_samples(full, src, all_pairs(full)[: 2 * (night + 1)])
        assert run_cli(convert_args(src, out)) == 0
    return full, src, out


def _damage(out: Path, change) -> None:
    path = out / MANIFEST_NAME
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def _digests(out: Path) -> dict[str, str]:
    """Shard and index files (the lock file holds the last run's pid; the manifest was damaged on purpose)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.iterdir()) if p.is_file()
            and p.name != MANIFEST_NAME and not p.name.startswith(".")}


def _lower_next_index(doc: dict) -> None:
    split = doc["splits"]["train"]
    assert split["next_shard_index"] == 3 and len(split["shards"]) == 3
    split["next_shard_index"] = 1  # one damaged digit: 3 -> 1


def test_lowered_next_shard_index_is_refused_by_verify_convert_and_compact(grown, capsys):
    full, src, out = grown
    _damage(out, _lower_next_index)
    before = _digests(out)
    capsys.readouterr()
    assert run_cli(["verify", str(out)]) != 0
    assert "next_shard_index" in capsys.readouterr().err
    link_samples(full, src, all_pairs(full))  # two new samples: the next run would write train-00001
    assert run_cli(convert_args(src, out)) == 1
    err = capsys.readouterr().err
    assert "splits.train.next_shard_index" in err and "Received: 1" in err and "Traceback" not in err
    assert run_cli(["compact", str(out), "--target-shard-size", "1MB"]) == 1
    assert "splits.train.next_shard_index" in capsys.readouterr().err
    assert _digests(out) == before  # nothing written, nothing deleted


def test_manifest_listing_a_shard_twice_is_refused_by_compact_and_verify(grown, capsys):
    _, _, out = grown

    def twice(doc: dict) -> None:
        shards = doc["splits"]["train"]["shards"]
        shards.append(dict(shards[0]))

    _damage(out, twice)
    before = _digests(out)
    capsys.readouterr()
    assert run_cli(["compact", str(out), "--target-shard-size", "1MB"]) == 1
    err = capsys.readouterr().err
    assert "splits.train.shards[3].file" in err and "listed once" in err and "train-00000" in err
    assert run_cli(["verify", str(out)]) != 0
    assert _digests(out) == before


def test_validate_accepts_number_zero_and_reads_a_missing_next_index_past_every_listed_shard(grown):
    _, _, out = grown
    doc = json.loads((out / MANIFEST_NAME).read_text())
    del doc["splits"]["train"]["next_shard_index"]
    manifest = Manifest.from_json(doc)
    assert manifest.splits["train"].next_shard_index == 3  # never a listed number
    doc["splits"]["train"]["next_shard_index"] = 0
    with pytest.raises(ManifestError, match=r"highest is 2\)\. Received: 0"):
        Manifest.from_json(doc)


def test_new_shard_name_taken_by_a_listed_or_present_file_is_refused(grown):
    _, _, out = grown
    manifest = Manifest.load(out)
    listed = manifest.shards("train")[1]
    with pytest.raises(NameCollisionError, match="the manifest lists it"):
        refuse_taken_names(str(out), manifest, [listed.file])
    (out / "train-00007.tfrecord").write_bytes(b"not listed, not ours")
    with pytest.raises(NameCollisionError, match="a file of that name is in the output folder"):
        refuse_taken_names(str(out), manifest, ["train-00007.tfrecord"])
    refuse_taken_names(str(out), manifest, ["train-00008.tfrecord"])  # free: no error


def test_version_2_dataset_with_a_flipped_inline_key_is_not_migrated(grown, capsys):
    """Issue 25, item 6: a v2 manifest whose inline key disagrees with its record (one flipped bit)
    is refused by the migration, naming the shard, the record and both keys; nothing is written."""
    from tests._cron import as_version_2_with_a_flipped_key

    full, src, out = grown
    shard, good, flipped = as_version_2_with_a_flipped_key(out, 1)
    before = _digests(out)
    manifest_before = (out / MANIFEST_NAME).read_bytes()
    capsys.readouterr()
    link_samples(full, src, all_pairs(full))
    for args in (convert_args(src, out), ["compact", str(out), "--target-shard-size", "1MB"]):
        assert run_cli(args) == 1
        err = capsys.readouterr().err
        assert shard["file"] in err and f"record 1 has key {good!r}" in err and repr(flipped) in err, err
        assert "Nothing was written" in err
        assert _digests(out) == before  # no index file, no shard
        assert (out / MANIFEST_NAME).read_bytes() == manifest_before


def test_compact_names_the_shard_record_and_key_of_a_bad_mask(grown, capsys):
    """A record whose class map holds a value that is neither a class nor the ignore index (beside
    ignored pixels, so the largest value is not the odd one): `compact` stops naming the shard, the
    record and its key, and publishes nothing."""
    import xxhash

    import readers
    from tests._shards import Sample, write_tfrecord_shard

    _, _, out = grown
    manifest = Manifest.load(out)
    num_classes, ignore = manifest.num_classes, manifest.mask["ignore_index"]
    shard = manifest.shards("train")[1]
    path = out / shard.file
    records = [r for r in readers.open(out).records("train") if r.key in set(shard_keys(str(out), shard))]
    order = shard_keys(str(out), shard)
    samples = [Sample(r.key, r.image.copy(), r.mask.copy()) for r in sorted(records, key=lambda r: order.index(r.key))]
    bad = samples[1]
    bad.mask[:3, :] = ignore
    bad.mask[5, 5] = num_classes + 2
    write_tfrecord_shard(str(path), samples)
    doc = json.loads((out / MANIFEST_NAME).read_text())
    entry = doc["splits"]["train"]["shards"][1]
    entry["bytes"], entry["digest"] = path.stat().st_size, "xxh3_128:" + xxhash.xxh3_128_hexdigest(path.read_bytes())
    (out / MANIFEST_NAME).write_text(json.dumps(doc))
    before = _digests(out)
    capsys.readouterr()
    assert run_cli(["compact", str(out), "--target-shard-size", "1MB"]) == 1
    err = capsys.readouterr().err
    assert f"{path}: record 1 (key {bad.key!r})" in err and f"mask value {num_classes + 2} (1 pixels)" in err, err
    assert "Traceback" not in err
    assert _digests(out) == before
