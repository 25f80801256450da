"""Issue 25, item 11: a full or failing cache disk never kills a bucket reader.

The cache folder is a real tmpfs mounted small (`mount -t tmpfs -o size=...`), so the
kernel itself answers ENOSPC part way through a download (and one mounted read-only:
EROFS): the reader must read that
object into memory instead, give exactly one warning naming the cache folder (not "check
the endpoint and the network"), leave no partial download behind, and hand out exactly
the records of the local copy. Skipped, saying why, only where a tmpfs cannot be mounted
(not root, or no mount permission in a container).
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import readers  # noqa: E402
from converter import cli  # noqa: E402
from converter.testing import synth  # noqa: E402
from readers import remote as remote_module  # noqa: E402
from readers.cache import TMP_PREFIX  # noqa: E402
from test_remote_read import upload  # noqa: E402

tf = pytest.importorskip("tensorflow")


#: mount options -> the reason the kernel gives: a 24 KiB tmpfs (room for one or two shards
#: of the dataset below, not all of them), and a read-only one.
MOUNTS = {"size=24k": "No space left on device", "ro,size=1m": "Read-only file system"}


@pytest.fixture(params=list(MOUNTS))
def small_tmpfs(tmp_path, request):
    mount = tmp_path / "cache"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", request.param, "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root and mount permission): {done.stderr.strip()}")
    try:
        yield mount, MOUNTS[request.param]
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


@pytest.fixture(scope="module")
def local_dataset(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("cache_faults")
    src = synth.make_camvid(root / "src", splits={"train": 10}, size=[(40, 56)], seed=17)
    out = root / "out"
    assert cli.main(["convert", str(src.root), str(out), "--size", "32x48", "--workers", "1", "-q",
                     "--shard-size", "12KB"]) == 0
    return str(out)


def test_full_or_read_only_tmpfs_cache_falls_back_to_memory_with_one_warning(local_dataset, small_tmpfs, s3_bucket,
                                                                 monkeypatch):
    small_tmpfs, reason = small_tmpfs
    monkeypatch.setattr(remote_module, "_warned_caches", set())
    upload(local_dataset, s3_bucket + "/out")
    local = readers.open(local_dataset)
    sizes = [s.entry.bytes for s in local.shards("train")]
    assert sum(sizes) > 24 << 10 > max(sizes)  # some shards fit, not all of them
    want = {r.key: (r.image, r.mask) for r in local.records("train")}
    ds = readers.open(s3_bucket + "/out", cache_dir=str(small_tmpfs))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):  # two epochs: the disk stays full, still one warning
            got = {r.key: (r.image, r.mask) for r in ds.records("train")}
            batches = list(ds.tf_dataset("train", 4, shuffle=False))
    faults = [w for w in caught if "cache folder" in str(w.message)]
    assert len(faults) == 1, [str(w.message) for w in caught]
    text = str(faults[0].message)
    assert str(small_tmpfs) in text and reason in text and "into memory" in text
    assert "network" not in text and "endpoint" not in text
    assert got.keys() == want.keys()
    for key, (image, mask) in want.items():
        np.testing.assert_array_equal(got[key][0], image)
        np.testing.assert_array_equal(got[key][1], mask)
    x = np.concatenate([b[0].numpy() for b in batches])
    images = np.stack([want[k][0] for k in local.keys("train")])
    np.testing.assert_array_equal(x, images.astype(np.float32) * np.float32(1 / 255))
    held = os.listdir(small_tmpfs)
    assert not [f for f in held if f.startswith(TMP_PREFIX)]  # no partial download left
    assert bool(held) == (reason == MOUNTS["size=24k"])  # the full disk still caches what fits
    assert sum(os.path.getsize(small_tmpfs / f) for f in held) <= 24 << 10
