"""Errors raised by the readers.

Every error that comes from a shard names the shard file (and the record index when
one is known) and says how to fix it, so a failure at epoch 37 of a long run points at
the file instead of at a TensorFlow kernel.
"""

from __future__ import annotations

import os

from readers.manifest import Manifest, ManifestError

#: What to do about a damaged or stale shard; appended to every `ShardError`.
FIX_HINT = (
    "Check the dataset with `imgshard verify OUT`, and rewrite it with "
    "`imgshard convert SRC OUT --rebuild` (same options)."
)


class ShardError(ValueError):
    """A shard file is missing, has the wrong size, or holds a record that cannot be read.

    Attributes:
        path: the shard file.
        record: index of the record inside the shard, or None when not known.
    """

    def __init__(self, message: str, *, path: str | os.PathLike | None = None, record: int | None = None):
        super().__init__(message)
        self.path = os.fspath(path) if path is not None else None
        self.record = record


def shard_error(path: str | os.PathLike, problem: str, *, record: int | None = None,
                offset: int | None = None) -> ShardError:
    """Build a `ShardError` whose message names the file, the record and the fix."""
    where = f"shard {os.fspath(path)}"
    if record is not None:
        where += f", record {record}"
    if offset is not None:
        where += f" (byte offset {offset})"
    return ShardError(f"{where}: {problem}. {FIX_HINT}", path=path, record=record)


class CacheFault(OSError):
    """The local cache folder cannot hold or give back an object (full, read-only, failing
    disk): the object is read into memory instead (`readers.remote.RemoteFile.open`)."""


class DatasetChangedError(ShardError):
    """A shard this `Dataset` listed is gone because a newer manifest no longer lists it:
    `compact`, `convert --prune` or `--on-change replace` rewrote the dataset after it was
    opened. The readers do not switch to the new manifest on their own (its records,
    count and order may differ from what the pipeline was built on): open it again."""


#: What to do when a shard is gone because the dataset was rewritten (docs/READERS.md).
REOPEN_HINT = (
    "The dataset was rewritten after it was opened: `imgshard compact`, `convert --prune` or "
    "`--on-change replace` published a new manifest and removed the old shards. Open it again "
    "(`readers.open(OUT)`) and build a new pipeline (a `model.fit` in progress: restart it from its "
    "last checkpoint with the new pipeline)."
)


def missing_shard_error(path: str | os.PathLike, *, record: int | None = None) -> ShardError:
    """The error for a listed shard that is no longer on disk: `DatasetChangedError` when the
    dataset's current manifest no longer lists it (rewritten since it was opened), else a
    `ShardError` saying the dataset is damaged."""
    path = os.fspath(path)
    root, name = os.path.split(path)
    try:
        listed = any(s.file == name for _, s in Manifest.load(root).iter_shards())
    except FileNotFoundError:  # the whole folder, or its manifest, was removed
        return shard_error(path, "is gone, and so is the dataset's manifest", record=record)
    except (OSError, ValueError) as e:
        return shard_error(path, f"is gone, and the dataset's manifest cannot be read ({describe(e)})", record=record)
    if listed:
        return shard_error(path, "is missing, though the dataset's manifest lists it (deleted by hand, or the "
                                 "dataset is damaged)", record=record)
    where = f"shard {path}" + (f", record {record}" if record is not None else "")
    return DatasetChangedError(f"{where} is gone and the dataset's current manifest no longer lists it. {REOPEN_HINT}",
                               path=path, record=record)


def describe(e: BaseException) -> str:
    """One line about an exception: its type and message, without dumping data."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


__all__ = ["FIX_HINT", "REOPEN_HINT", "CacheFault", "DatasetChangedError", "ManifestError", "ShardError", "describe",
           "missing_shard_error", "shard_error"]
