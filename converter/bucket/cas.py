"""Conditional writes whose answer may be lost.

A conditional PUT can take effect on the store while its answer never arrives (a read
timeout, a reset connection). s3fs then retries it, and the retry meets the object the
first attempt wrote: ``412 Precondition Failed``, as if another run had won. Taken at its
word, a run would remove the shards its own, published manifest lists. `write_if` reads
the object back after any failed conditional write: holding exactly the bytes this run
sent (the bodies imgshard writes are unique to a run: a manifest's history line, a lock's
run id and expiry), the write took effect and its version is returned. When the object
cannot be read back either, `OutcomeUnknown` says that the write may or may not have
taken effect.
"""

from __future__ import annotations

import logging

from readers.storage import ObjectStore, StorageError

log = logging.getLogger(__name__)


class OutcomeUnknown(StorageError):
    """A conditional write failed without an answer, and reading the object back failed too."""


def current(store: ObjectStore, name: str) -> tuple[str, bytes] | None:
    """(version, bytes) of `name`, read consistently (None: no such object); `StorageError` if unreadable."""
    for _ in range(3):
        try:
            before = store.info(name).version
            data = store.read(name)
            if store.info(name).version == before:
                return before, data
        except FileNotFoundError:
            return None
    raise StorageError(f"{store.url_of(name)}: it kept changing while it was read; check that no other tool "
                       "writes it")


def write_if(store: ObjectStore, name: str, data: bytes, if_version: str | None) -> str:
    """`store.create` (`if_version` None) or `store.replace`; returns the new version (see the module
    docstring). Raises the write's own error when the object holds other bytes (or none)."""
    try:
        return store.create(name, data) if if_version is None else store.replace(name, data, if_version)
    except StorageError as e:
        try:
            now = current(store, name)
        except StorageError as again:
            raise OutcomeUnknown(f"{store.url_of(name)}: the write failed without an answer ({e}) and the object "
                                 f"cannot be read back ({again}); it may or may not hold this run's write") from e
        if now is None or now[1] != data:
            raise
        log.info("%s: the write took effect although its answer was lost (%s)", store.url_of(name), e)
        return now[0]
