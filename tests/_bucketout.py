"""Helpers for the bucket-output tests: a dataset in a bucket brought back to compare it."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

import readers
from readers.manifest import MANIFEST_NAME, Manifest
from readers.storage import open_store


def download(url: str, dest: Path) -> Path:
    """Every object under `url` (the lock and reports aside) into the folder `dest`."""
    store = open_store(url)
    dest.mkdir(parents=True, exist_ok=True)
    for info in store.list():
        if info.name.startswith(("reports/", ".imgshard")):
            continue
        target = dest / info.name
        target.parent.mkdir(parents=True, exist_ok=True)
        store.download(info.name, str(target))
    return dest


def records_by_key(folder: Path) -> dict[str, tuple]:
    """key -> (split, image bytes, mask bytes or None, label) of every record, read through `readers`."""
    ds = readers.open(folder)
    out = {}
    for split in ds.splits:
        for r in ds.records(split):
            mask = None if r.mask is None else np.asarray(r.mask).tobytes()
            label = None if getattr(r, "label", None) is None else int(r.label)
            assert r.key not in out, f"key {r.key} twice"
            out[r.key] = (split, np.asarray(r.image).tobytes(), mask, label)
    return out


def manifest_counts(folder: Path) -> dict[str, tuple[int, int]]:
    """split -> (samples, shards) of the manifest in `folder`."""
    m = Manifest.load(os.path.join(folder, MANIFEST_NAME))
    return {name: (e.num_samples, len(e.shards)) for name, e in m.splits.items()}


def versions(url: str) -> dict[str, str]:
    """Object name -> version (ETag/generation) of every object under `url`."""
    return {i.name: i.version for i in open_store(url).list()}
