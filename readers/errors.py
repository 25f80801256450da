"""Errors raised by the readers.

Every error that comes from a shard names the shard file (and the record index when
one is known) and says how to fix it, so a failure at epoch 37 of a long run points at
the file instead of at a TensorFlow kernel.
"""

from __future__ import annotations

import os

from readers.manifest import ManifestError

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


def describe(e: BaseException) -> str:
    """One line about an exception: its type and message, without dumping data."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


__all__ = ["FIX_HINT", "ManifestError", "ShardError", "describe", "shard_error"]
