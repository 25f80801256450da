"""Discovery's compact sample list: the same samples, order, stats and problems as a
reference computed here from the folders (names paired by hand, `os.stat` per file)."""

from __future__ import annotations

import os
import random

import numpy as np
from PIL import Image

from converter.discover.layouts import discover
from converter.discover.samplelist import SampleList
from converter.options import SourceSpec


def _png(path, rng: np.random.Generator) -> None:
    Image.fromarray(rng.integers(0, 256, (8, 12, 3), np.uint8)).save(path)


def test_discovered_samples_match_the_folders_with_stats_and_problems(tmp_path):
    rng, r = np.random.default_rng(7), random.Random(7)
    src = tmp_path / "src"
    expected = {}
    for split, n in (("train", r.randint(20, 40)), ("val", r.randint(3, 9))):
        (src / split / "sub").mkdir(parents=True)
        (src / f"{split}_labels" / "sub").mkdir(parents=True)
        for i in range(n):
            rel = f"{'sub/' if i % 3 == 0 else ''}f{r.randrange(10**6):06d}_{i}.png"
            _png(src / split / rel, rng)
            mask = src / f"{split}_labels" / rel.replace(".png", "_L.png")
            _png(mask, rng)
            expected[f"{split}/{rel}"] = (str(src / split / rel), str(mask))
    (src / "train" / "empty.png").write_bytes(b"")  # a zero-byte image: a problem, not a sample
    _png(src / "train_labels" / "empty_L.png", rng)
    _png(src / "val_labels" / "orphan_L.png", rng)  # a mask without image
    found = discover(SourceSpec(root=str(src)))

    assert isinstance(found.samples, SampleList)
    samples = list(found.samples)
    want = sorted(expected, key=lambda k: (k.split("/")[0] != "train", k))  # split order, then names
    assert [s.key for s in samples] == want and len(found.samples) == len(want)
    for s in samples:
        image, mask = expected[s.key]
        assert (s.split, s.image, s.mask) == (s.key.split("/")[0], image, mask)
        st_i, st_m = os.stat(image), os.stat(mask)
        assert s.image_stat == (st_i.st_size, st_i.st_mtime_ns) and s.mask_stat == (st_m.st_size, st_m.st_mtime_ns)
    for i in (0, len(samples) - 1, -1, r.randrange(len(samples))):
        assert found.samples[i] == samples[i]
    assert found.samples[2:5] == samples[2:5] and found.samples == tuple(samples)
    kinds = sorted((os.path.basename(b.path), b.kind) for b in found.bad)
    assert kinds == [("empty.png", "empty_file"), ("orphan_L.png", "missing_image")]



def test_pairing_precedence_and_orphan_masks_with_l_suffixed_names(tmp_path):
    """`<stem>_L` wins over `<stem>`; an image named `b_L` takes `b_L_L`; each unused mask is
    named once, in name order (the reference worked out by hand from the rules)."""
    from converter.discover.pairing import pair_by_name

    rng = np.random.default_rng(3)
    images, masks = tmp_path / "img", tmp_path / "msk"
    images.mkdir(), masks.mkdir()
    for name in ("a", "b_L"):
        _png(images / f"{name}.png", rng)
    for name in ("a", "a_L", "b_L", "b_L_L", "c", "c_L", "d_L"):
        _png(masks / f"{name}.png", rng)
    p = pair_by_name(str(images), str(masks), "train", "train/")
    p.samples.check([])
    assert [(s.key, os.path.basename(s.mask)) for s in p.samples] == [("train/a.png", "a_L.png"),
                                                                       ("train/b_L.png", "b_L_L.png")]
    assert [(os.path.basename(b.path), b.reason) for b in p.bad] == [
        ("b_L.png", "mask without image"), ("c_L.png", "mask without image"), ("d_L.png", "mask without image")]
