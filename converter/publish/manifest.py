"""Stage 5: publish. The manifest is replaced atomically, last; leftovers are swept.

Order of a publish: every new shard was already fsynced and renamed by its writer;
fsync the folder (the renames become durable), write the manifest to a temporary
file, fsync it, rename it over `imgshard.json`, fsync the folder again. A reader sees
the old manifest or the new one, and either lists only complete shards. Shards the
new manifest no longer lists are deleted only after that.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from typing import Any

from converter.fsutil import TMP_PREFIX, fsync_dir, write_atomic
from readers.formats import SUFFIXES
from readers.index import is_index_name
from readers.manifest import MANIFEST_NAME, REPORTS_DIR, Manifest

log = logging.getLogger(__name__)

#: ``split-00003.tfrecord``, or with a run id (in a bucket) ``split-00003-r1a2b3c4d.tfrecord``.
_SHARD_RE = re.compile(r"^[A-Za-z0-9_.]+-\d{5,}(?:-r[0-9a-f]{8})?(" + "|".join(re.escape(s) for s in SUFFIXES.values()) + r")$")


def utc_now() -> str:
    """Run time for the history; honours SOURCE_DATE_EPOCH for reproducible builds."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    t = time.gmtime(int(epoch)) if epoch and epoch.isdigit() else time.gmtime()
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", t)


def publish_manifest(out_dir: str, manifest: Manifest) -> None:
    fsync_dir(out_dir)  # the shard renames first
    write_atomic(os.path.join(out_dir, MANIFEST_NAME), manifest.dumps().encode("utf-8"))


def is_shard_name(name: str) -> bool:
    return bool(_SHARD_RE.match(name))


def listed_files(manifest: Manifest | None) -> set[str]:
    """Shard and index files the manifest lists."""
    if manifest is None:
        return set()
    return {f for _, s in manifest.iter_shards() for f in (s.file, s.index.file if s.index else None) if f}


def sweep_leftovers(out_dir: str, manifest: Manifest | None) -> list[str]:
    """Remove temporary files, and shard and index files the manifest does not list (crashed runs)."""
    temps, unlisted = find_leftovers(out_dir, manifest)
    removed = temps + unlisted
    for name in removed:
        os.unlink(os.path.join(out_dir, name))
    reports = os.path.join(out_dir, REPORTS_DIR)
    if os.path.isdir(reports):
        for name in sorted(os.listdir(reports)):
            if name.startswith(TMP_PREFIX):
                os.unlink(os.path.join(reports, name))
                removed.append(f"{REPORTS_DIR}/{name}")
    if removed:
        log.info("removed %d leftover file(s) of an earlier run: %s", len(removed), ", ".join(removed[:5]))
    return removed


def find_leftovers(out_dir: str, manifest: Manifest | None) -> tuple[list[str], list[str]]:
    """(temporary files, unlisted shard and index files) in `out_dir`: what `sweep_leftovers` removes."""
    listed = listed_files(manifest)
    temps, unlisted = [], []
    for name in sorted(os.listdir(out_dir)):
        if name.startswith(TMP_PREFIX):
            temps.append(name)
        elif (is_shard_name(name) or is_index_name(name)) and name not in listed:
            unlisted.append(name)
    return temps, unlisted


def write_report(out_dir: str, report: dict[str, Any]) -> str:
    """A JSON report of the run under OUT/reports/ (also on failure). Returns its path."""
    folder = os.path.join(out_dir, REPORTS_DIR)
    os.makedirs(folder, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = os.path.join(folder, f"convert-{stamp}-{os.getpid()}.json")
    write_atomic(path, (json.dumps(report, indent=1, sort_keys=True, default=str) + "\n").encode("utf-8"))
    return path
