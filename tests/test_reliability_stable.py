"""Issue 25, item 2: a source rewritten in place while it is read (``rsync --inplace``, sync
clients) is never published torn, and its fingerprint never pairs one version's stamp with
another version's digest.

A writer thread rewrites files in place at the same length, half at a time with a pause
in between (so a reader that looks at the wrong moment sees half the old bytes and half the
new). The expected pixels of each version are decoded by Pillow, the expected digests
computed with `xxhash` directly.
"""

from __future__ import annotations

import io
import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import xxhash
from PIL import Image

import readers
from converter.discover.stable import SourceChangedError, read_stable
from converter.testing import synth
from readers.index import shard_samples
from readers.manifest import MANIFEST_NAME, Manifest
from tests._cron import convert_args, run_cli

SIZE = 256  # square sources converted at their own size: the record is the decoded source


def _versions(seed: int, fmt: str = "JPEG", n: int = 2) -> list[bytes]:
    """`n` files of different pictures, padded to one length (a decoder ignores the bytes after
    the picture). BMP has no checksum and no code that a torn read could break: only the reading
    itself can catch a tear."""
    out = []
    for i in range(n):
        buf = io.BytesIO()
        Image.fromarray(synth.textured_image(SIZE, SIZE, np.random.default_rng(seed * 10 + i))).save(buf, fmt)
        out.append(buf.getvalue())
    length = max(map(len, out))
    return [v + bytes(length - len(v)) for v in out]


class InPlaceWriter(threading.Thread):
    """Rewrites each file in place with its next version, again and again: first half, a pause
    (`pause_s`: the file is torn meanwhile), second half; then it rests `rest_s`."""

    def __init__(self, files: dict[Path, list[bytes]], pause_s: float = 0.03, rest_s: float = 0.12) -> None:
        super().__init__(daemon=True)
        self.files, self.pause_s, self.rest_s = files, pause_s, rest_s
        self.stop = threading.Event()
        self.started_writing = threading.Event()
        self.current = {path: 0 for path in files}
        self.stamps: dict[Path, list[tuple[int, int]]] = {path: [] for path in files}  # (mtime_ns, version) written

    def run(self) -> None:
        turn = 0
        while not self.stop.is_set():
            turn += 1
            for path, versions in self.files.items():
                data = versions[turn % len(versions)]
                half = len(data) // 2
                with open(path, "r+b") as f:  # in place: same inode, same length
                    f.write(data[:half])
                    f.flush()
                    self.started_writing.set()
                    time.sleep(self.pause_s)
                    f.write(data[half:])
                self.current[path] = turn % len(versions)
                self.stamps[path].append((os.stat(path).st_mtime_ns, turn % len(versions)))
            self.stop.wait(self.rest_s)


def test_stable_read_gives_one_whole_version_or_a_named_change(tmp_path):
    versions = _versions(1)
    path = tmp_path / "photo.jpg"
    path.write_bytes(versions[0])
    writer = InPlaceWriter({path: versions})
    writer.start()
    writer.started_writing.wait(5)
    whole = changed = torn_plain = 0
    deadline = time.monotonic() + 3
    try:
        while time.monotonic() < deadline:
            for _ in range(20):
                with open(path, "rb") as f:  # what the converter did before: stat, then read
                    torn_plain += f.read() not in versions
                time.sleep(0.002)
            try:
                data, stamp = read_stable(str(path))
            except SourceChangedError as e:
                assert "kept changing while it was read" in str(e)
                changed += 1
                continue
            assert data in versions, "a torn read was returned"
            assert stamp > 0
            whole += 1
    finally:
        writer.stop.set()
        writer.join(5)
    assert torn_plain > 0, "the race never happened: the test proves nothing"
    assert whole > 0


def _record_version(out: Path, decoded: dict[str, list[np.ndarray]], digests: dict[str, list[str]]) -> dict[str, int]:
    """key -> which version its record holds; asserts its pixels and its fingerprint agree on one."""
    ds = readers.open(out)
    manifest = Manifest.load(out)
    fingerprints = {s.key: s.image.digest for _, sh in manifest.iter_shards() for s in shard_samples(str(out), sh)}
    found = {}
    for r in ds.records("train"):
        name = r.key.split("/")[-1]
        matches = [i for i, pixels in enumerate(decoded[name]) if np.array_equal(r.image, pixels)]
        assert matches, f"{r.key}: the record is no whole version of its source (torn)"
        assert fingerprints[r.key] == digests[name][matches[0]], f"{r.key}: fingerprint of another version"
        found[r.key] = matches[0]
    return found


def test_convert_while_sources_are_rewritten_in_place_publishes_no_torn_record(tmp_path):
    ds = synth.make_camvid(tmp_path / "src", splits={"train": 8}, size=(SIZE, SIZE), seed=7, quirks=False)
    files, decoded, digests = {}, {}, {}
    for i, (png_image, _) in enumerate(ds.pairs["train"]):
        image = png_image.with_suffix(".bmp")
        png_image.unlink()
        versions = _versions(100 + i, "BMP")
        image.write_bytes(versions[0])
        files[image] = versions
        decoded[image.name] = [np.asarray(Image.open(io.BytesIO(v)).convert("RGB")) for v in versions]
        digests[image.name] = ["xxh3_128:" + xxhash.xxh3_128_hexdigest(v) for v in versions]
    out = tmp_path / "out"
    writer = InPlaceWriter(files, pause_s=0.05, rest_s=0.05)
    writer.start()
    writer.started_writing.wait(5)
    try:
        code = run_cli(convert_args(ds.root, out, "--max-bad", "8", size=f"{SIZE}x{SIZE}", workers=1))
    finally:
        writer.stop.set()
        writer.join(10)
    assert code in (0, 65)  # 65: every sample changed during its reads (nothing published)
    if code == 0:
        _record_version(out, decoded, digests)
    # the writer has stopped: the next run converts what is missing, from whole files
    assert run_cli(convert_args(ds.root, out, "--on-change", "replace", size=f"{SIZE}x{SIZE}", workers=1)) == 0
    final = _record_version(out, decoded, digests)
    assert sorted(final) == sorted(f"train/{p.name}" for p in files)
    assert all(final[f"train/{p.name}"] == writer.current[p] for p in files)


def _mask_versions(mask: Path, h: int, w: int, seed: int) -> tuple[list[bytes], list[np.ndarray]]:
    """Two PNGs of one instance (its own disc, then another), padded to one length; their `> 0` pixels."""
    rng = np.random.default_rng(seed)
    out, pixels = [mask.read_bytes()], [np.asarray(Image.open(mask)) > 0]
    m = np.zeros((h, w), np.uint8)
    yy, xx = np.mgrid[:h, :w]
    m[np.hypot(yy - rng.uniform(0, h), xx - rng.uniform(0, w)) < rng.uniform(4, 9)] = 255
    buf = io.BytesIO()
    Image.fromarray(m).save(buf, "PNG")
    out.append(buf.getvalue())
    pixels.append(m > 0)
    length = max(map(len, out))
    return [v + bytes(length - len(v)) for v in out], pixels


def _instance_records(out: Path, root: Path, churned: dict, stamps: dict) -> dict[str, int]:
    """key -> the version of its churned mask its record holds; asserts pixels and fingerprint agree on one:
    the fingerprint is the annotation with that mask's size and stamp as one whole write of that version left."""
    from converter.discover.annotations.base import canonical
    from converter.discover.annotations.instances import InstanceMasks
    from converter.options import AnnotationOptions

    listed = {s.key: s.annotation for s in InstanceMasks().read(str(root), AnnotationOptions()).samples}
    digests = {s.key: s.mask.digest for _, sh in Manifest.load(out).iter_shards() for s in shard_samples(str(out), sh)}
    found = {}
    for r in readers.open(out).records("train"):
        mask_path, refs, size = churned[r.key]
        matches = [i for i, ref in enumerate(refs) if np.array_equal(r.mask, ref)]
        assert matches, f"{r.key}: the record is no whole version of its instance masks (torn)"
        doc = json.loads(listed[r.key].payload)
        shape = next(s for s in doc["shapes"] if s["file"] == mask_path.name)
        expected = set()
        for stamp, version in [(0, 0)] + stamps.get(mask_path, []):  # (0, 0): never rewritten, as listed
            if version == matches[0]:
                shape["size"], shape["stamp"] = size, stamp or mask_path.stat().st_mtime_ns
                expected.add(listed[r.key]._replace(payload=canonical(doc)).digest)
        assert digests[r.key] in expected, f"{r.key}: fingerprint of another version of {mask_path.name}"
        found[r.key] = matches[0]
    return found


def test_instance_masks_rewritten_in_place_are_never_published_torn_nor_fingerprinted_across_versions(tmp_path):
    """DSB instance-mask folders: each sample's first mask PNG is rewritten in place (half at a time)
    during a real convert. A record holds one whole version with the fingerprint of that very read (not
    the stamp discovery listed); a mask still moving is a `changed_during_read` bad input; the writer
    stopped, a clean re-run converts every sample, and the run after it has nothing to do."""
    from converter.convert import BadInputError, convert
    from converter.options import OnChange, OutputOptions, RunOptions, SourceSpec
    from tests import _annotations as A

    exp = A.make_instances(tmp_path / "dsb")
    files, churned = {}, {}
    for n, (key, image) in enumerate(sorted(exp.images.items())):
        masks = sorted((image.parent.parent / "masks").glob("*.png"))
        h, w = exp.expected[key].shape
        versions, pixels = _mask_versions(masks[0], h, w, 50 + n)
        masks[0].write_bytes(versions[0])
        files[masks[0]] = versions
        others = np.zeros((h, w), bool)
        for m in masks[1:]:
            others |= np.asarray(Image.open(m)) > 0
        refs = [A.reference(image, (others | p).astype(np.int64), (SIZE // 8, SIZE // 8))[1] for p in pixels]
        churned[key] = (masks[0], refs, len(versions[0]))
    out, spec = tmp_path / "out", SourceSpec(root=str(exp.root))
    options = OutputOptions(size=(SIZE // 8, SIZE // 8))
    writer = InPlaceWriter(files, pause_s=0.05, rest_s=0.05)
    writer.start()
    writer.started_writing.wait(5)
    try:
        first = convert(spec, str(out), options, RunOptions(workers=1, max_bad=3))
        bad = first.bad
    except BadInputError as e:  # every sample changed during its reads: nothing published
        bad = e.bad
    finally:
        writer.stop.set()
        writer.join(10)
    assert {b.kind for b in bad} <= {"changed_during_read"}, [(b.kind, b.path, b.reason) for b in bad]
    if (out / MANIFEST_NAME).exists():
        _instance_records(out, exp.root, churned, writer.stamps)
    # the writer has stopped: the next run converts what is missing or moved, from whole files
    again = convert(spec, str(out), options, RunOptions(workers=1, on_change=OnChange.REPLACE))
    assert not again.bad
    final = _instance_records(out, exp.root, churned, writer.stamps)
    assert final == {key: writer.current[churned[key][0]] for key in churned}
    assert convert(spec, str(out), options, RunOptions(workers=1)).plan.unchanged == 3
