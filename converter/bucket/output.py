"""A run's output in a bucket: staging folder, downloads, uploads, orphans, publish.

`BucketOutput` is what `converter.convert` asks instead of the local folder when OUT is
an ``s3://`` or ``gs://`` URL. The run works in a local staging folder, which looks like
the dataset folder without its shards:

1. ``__enter__``: the lock object (`converter.bucket.lock`), then a fresh staging folder;
2. `prepare`: the published manifest is read and its version remembered, orphans
   (shard and index objects the manifest does not list: failed or killed runs) are
   removed, every listed shard is checked to exist with its size, and the index files
   are copied into staging from a local cache (downloaded once: their names hold their
   digest, so a name never changes content);
3. the shard tasks write into staging as for a local run; `fetch_copy_sources` downloads
   only the old shards a rewrite copies records from; each finished shard is handed to
   the `Uploader` (`shard_done`), which puts it while the next ones are converted;
4. `publish`: every upload done (else nothing is published), the lock still held, then
   the manifest is written last with a compare-and-swap on the version read in step 2
   (``create`` on a first run). `PublishRaceError` when another run published meanwhile;
5. ``__exit__``: on failure the objects this run uploaded are removed (best effort: the
   next run removes what is left as orphans); the lock is released and staging removed.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import secrets
import shutil
import tempfile
import time
from typing import Callable, Sequence

from converter.bucket.cas import current, write_if
from converter.bucket.lock import BucketLock
from converter.bucket.uploads import Uploader
from converter.plan.shards import CopyRecord, ReplaceRecord, ShardTask, refuse_damaged
from converter.publish.manifest import is_shard_name, listed_files
from converter.publish.migrate import check_inline_samples, migrated
from converter.run.lock import EX_TEMPFAIL
from readers.index import index_ref, is_index_name
from readers.manifest import MANIFEST_NAME, REPORTS_DIR, Manifest
from readers.storage import ObjectStore, PreconditionFailed, StorageError, open_store

log = logging.getLogger(__name__)

INDEX_CACHE_DIR = "imgshard-index-cache"
STAGING_PREFIX = "imgshard-run-"
#: held (flock) by the run that owns a staging folder, for as long as it runs
STAGING_LOCK = ".imgshard-staging.lock"
#: a folder this young without its lock file may be a run between mkdtemp and flock
_STAGING_GRACE_SECONDS = 60.0


def _hold_staging(staging: str) -> int:
    """Lock the run's own staging folder (the kernel drops it when the run dies, however it dies)."""
    fd = os.open(os.path.join(staging, STAGING_LOCK), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _staging_dead(path: str, pid: int) -> bool:
    """True when no run owns the staging folder `path`: nobody holds its lock file. Without a lock
    file (a run between mkdtemp and flock), dead when old and its pid is gone. The pid alone is not
    enough: a run in another PID namespace (a container sharing --staging-dir) is invisible here."""
    try:
        fd = os.open(os.path.join(path, STAGING_LOCK), os.O_RDONLY)
    except FileNotFoundError:
        try:
            young = os.stat(path).st_mtime > time.time() - _STAGING_GRACE_SECONDS
            os.kill(pid, 0)
            return False  # alive (or reused: left alone)
        except ProcessLookupError:
            return not young
        except OSError:  # another user's process, or the folder went away
            return False
    except OSError:  # another user's folder
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return True
    except OSError:  # held: its run is alive
        return False
    finally:
        os.close(fd)


def _sweep_dead_staging(root: str) -> None:
    """Remove staging folders of killed runs on this machine (named imgshard-run-<pid>-<run id>-...)."""
    for name in os.listdir(root):
        if not name.startswith(STAGING_PREFIX):
            continue
        pid = name[len(STAGING_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or not _staging_dead(os.path.join(root, name), int(pid)):
            continue
        log.info("removing the staging folder of a dead run: %s", os.path.join(root, name))
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _cached_intact(path: str, shard) -> bool:
    """The cached index file is there with the manifest's size and digest."""
    try:
        with open(path, "rb") as f:
            data = f.read(shard.index.bytes + 1)
    except FileNotFoundError:
        return False
    return len(data) == shard.index.bytes and index_ref(shard.file, data).digest == shard.index.digest


class PublishRaceError(RuntimeError):
    """Another run published the dataset between this run's start and its publish; nothing of ours was published."""

    exit_code = EX_TEMPFAIL


class PublishUnknownError(RuntimeError):
    """The manifest's write failed without a clear answer (not a refused precondition): this run's
    manifest may have been published, or may still be by a request in flight, so its shards are kept
    (the next run removes them if they are not listed)."""

    exit_code = os.EX_IOERR


def copy_sources(tasks: Sequence[ShardTask]) -> list[str]:
    """Old shard files the tasks copy records from (rewrites: --on-change replace, --prune)."""
    names = set()
    for task in tasks:
        for item in task.items:
            if isinstance(item, CopyRecord):
                names.add(item.shard)
            elif isinstance(item, ReplaceRecord):
                names.add(item.old.shard)
    return sorted(names)


def shard_files(entry) -> list[str]:
    """A shard entry's file and its index file: what one shard task puts into the bucket."""
    return [entry.file, *((entry.index.file,) if entry.index is not None else ())]


def download_missing(store: ObjectStore, names: Sequence[str], folder: str) -> None:
    """Download each object of `names` into `folder` unless a file of that name is already there."""
    for name in names:
        path = os.path.join(folder, name)
        if not os.path.exists(path):
            store.download(name, path)


class BucketOutput:
    """The dataset under an ``s3://``/``gs://`` URL, for the length of one run (see the module docstring)."""

    def __init__(self, url: str, storage_options: dict | None = None, *, staging_dir: str | None = None,
                 lock_ttl_seconds: float = 300.0) -> None:
        self.store: ObjectStore = open_store(url, storage_options)
        self.url = self.store.url
        self.run_id = secrets.token_hex(4)
        self.root = os.path.abspath(staging_dir or tempfile.gettempdir())
        self.lock = BucketLock(self.store, self.run_id, lock_ttl_seconds)
        self.staging = ""
        self._staging_fd: int | None = None
        self.uploader: Uploader | None = None
        self.manifest_version: str | None = None  # the published manifest's version at the start (None: none)
        self.orphans: list[str] = []
        self._deferred_orphans: list[str] = []
        self._manifest_bytes = b""
        self.published = False
        self.maybe_published = False  # the manifest's write had no answer: keep the uploads

    # -- the run's frame ---------------------------------------------------------------------
    def __enter__(self) -> "BucketOutput":
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as e:
            raise OSError(e.errno, f"cannot create the staging folder {self.root} ({e.strerror or e}); give a "
                          "writable --staging-dir") from e
        self.lock.__enter__()
        try:
            _sweep_dead_staging(self.root)
            self.staging = tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-{self.run_id}-", dir=self.root)
            self._staging_fd = _hold_staging(self.staging)
            self.uploader = Uploader(self.store, self.staging)
        except BaseException:
            self.lock.__exit__(None, None, None)
            self._drop_staging()
            raise
        return self

    def _drop_staging(self) -> None:
        if self.staging:
            shutil.rmtree(self.staging, ignore_errors=True)
        if self._staging_fd is not None:
            os.close(self._staging_fd)
            self._staging_fd = None

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            if self.uploader is not None:
                self.uploader.close(cancel=exc_type is not None)
                if exc_type is not None and not (self.published or self.maybe_published):
                    self._remove_quietly(self.uploader.uploaded, "uploaded by this failed run")
        finally:
            self.lock.__exit__(exc_type, exc, tb)
            self._drop_staging()

    def _remove_quietly(self, names: Sequence[str], why: str) -> None:
        for name in names:
            try:
                self.store.delete(name)
            except OSError as e:  # an orphan the next run removes
                log.warning("could not remove %s (%s): %s; the next run removes it", self.store.url_of(name), why, e)

    # -- before planning ---------------------------------------------------------------------
    def prepare(self, rebuild: bool, check: Callable[[Manifest], None]) -> Manifest | None:
        """The published manifest (None: no dataset yet), checked by `check`, with its index files in
        staging; orphans removed first. A version-1/2 manifest is migrated (index files, then a CAS publish)."""
        old = self._read_manifest()
        if old is not None and not rebuild:
            check(old)
        if old is not None and self.lock.took_over is not None:
            self._fence()
        listing = {i.name: i.size for i in self.store.list()}
        self.orphans = sorted(n for n in listing if (is_shard_name(n) or is_index_name(n))
                              and n not in listed_files(old))
        if self.orphans and old is None and self.lock.took_over is not None:
            self._deferred_orphans = self.orphans  # removed once this run's `create` made a zombie's fail
        elif self.orphans:
            log.warning("removing %d orphan object(s) of failed runs from %s: %s", len(self.orphans), self.url,
                        ", ".join(self.orphans[:5]))
            self._remove_quietly(self.orphans, "an orphan")
        if old is None:
            return None
        if not rebuild:
            refuse_damaged(self.url, old, listing.get)
        self._fetch_indexes(old, listing)
        if not old.indexed and not rebuild:
            old = self._migrate(old)
        return old

    def _fence(self) -> None:
        """After taking over an expired lock: rewrite the manifest (one newline more at its end: a
        new ETag/generation, the same document), so that the dead holder's run, should it
        only have been paused, fails its compare-and-swap instead of publishing a manifest that
        lists shards this run is about to remove as orphans."""
        data = self._manifest_bytes + b"\n"  # one more each time: never bytes (an S3 ETag) seen before
        try:
            self.manifest_version = write_if(self.store, MANIFEST_NAME, data, self.manifest_version)
        except PreconditionFailed as e:
            raise PublishRaceError(f"{self.store.url_of(MANIFEST_NAME)} changed while this run took over the "
                                   "expired lock (its previous holder published); nothing was done. Re-run.") from e

    def _read_manifest(self) -> Manifest | None:
        now = current(self.store, MANIFEST_NAME)
        if now is None:
            return None
        path = os.path.join(self.staging, MANIFEST_NAME)
        with open(path, "wb") as f:
            f.write(now[1])
        manifest = Manifest.load(path)
        self.manifest_version, self._manifest_bytes = now
        return manifest

    def _fetch_indexes(self, old: Manifest, listing: dict[str, int]) -> None:
        """Every index file the manifest lists, into staging (hard-linked from the local cache, whose
        files are checked against the manifest's digests). One missing from the bucket (`listing`) is
        left out: the planner names it, and a --rebuild does without it."""
        cache = os.path.join(self.root, f"{INDEX_CACHE_DIR}-{os.getuid()}",
                             hashlib.sha256(self.url.encode()).hexdigest()[:16])
        os.makedirs(cache, mode=0o700, exist_ok=True)
        listed = {s.index.file for _, s in old.iter_shards() if s.index is not None}
        for name in os.listdir(cache):  # index files no manifest lists any more: the cache stays this small
            if name not in listed:
                os.unlink(os.path.join(cache, name))
        for _, shard in old.iter_shards():
            if shard.index is None or listing.get(shard.index.file) != shard.index.bytes:
                continue
            name = shard.index.file
            cached = os.path.join(cache, name)
            if not _cached_intact(cached, shard):
                tmp = f"{cached}.{self.run_id}.part"
                self.store.download(name, tmp)
                os.replace(tmp, cached)
            target = os.path.join(self.staging, name)
            try:
                os.link(cached, target)
            except OSError:  # another file system: copy
                shutil.copyfile(cached, target)

    def _check_inline_samples(self, old: Manifest) -> None:
        """`MigrationError` (nothing written) unless every shard's records carry the keys its inline
        samples list: each shard object is downloaded into a folder of staging, checked, removed."""
        folder = os.path.join(self.staging, "migration-check")
        os.makedirs(folder, exist_ok=True)
        try:
            for _, shard in old.iter_shards():
                if shard.index is not None:
                    continue
                path = os.path.join(folder, shard.file)
                self.store.download(shard.file, path)
                try:
                    check_inline_samples(folder, old, shard, shown=self.store.url_of(shard.file))
                finally:
                    os.unlink(path)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _migrate(self, old: Manifest) -> Manifest:
        self._check_inline_samples(old)  # as a local migration does, before any index file is written
        new = migrated(self.staging, old, check_records=False)  # checked above: the shards are not staged
        names = [s.index.file for _, s in new.iter_shards() if s.index is not None]
        for name in names:
            self.store.put_file(name, os.path.join(self.staging, name))
        self._publish_manifest(new)
        log.info("migrated %s to manifest version 3 (%d index files)", self.url, len(names))
        return new

    # -- while converting --------------------------------------------------------------------
    def fetch_copy_sources(self, tasks: Sequence[ShardTask]) -> None:
        """Download the old shards that rewrite tasks copy records from (local runner)."""
        download_missing(self.store, copy_sources(tasks), self.staging)

    def shard_done(self, entry) -> None:
        """A shard and its index file are complete in staging: upload them (returns at once)."""
        self.lock.check()  # the lock was lost: stop now rather than at the publish
        if self.uploader is not None:
            self.uploader.raise_failed()  # an upload failed: stop now, nothing will be published
        if entry is not None and self.uploader is not None:
            files = shard_files(entry)
            self.uploader.submit(files, keep=tuple(files[1:]))

    def fetch_indexes_of(self, entries: Sequence) -> None:
        """Index files of shards that Dask workers uploaded themselves (a --rebuild's counts read them)."""
        download_missing(self.store, [e.index.file for e in entries if e.index is not None], self.staging)

    # -- publishing --------------------------------------------------------------------------
    def publish(self, manifest: Manifest, extra: Sequence[str] = ()) -> None:
        """Wait for every upload, put the `extra` staged files, then the manifest (CAS), last."""
        if self.uploader is not None:
            self.uploader.wait()
        for name in extra:
            self.store.put_file(name, os.path.join(self.staging, name))
            if self.uploader is not None:
                self.uploader.uploaded.append(name)
        self.lock.check()
        self._publish_manifest(manifest)
        self.published = True
        if self._deferred_orphans:
            log.warning("removing %d orphan object(s) of failed runs from %s: %s", len(self._deferred_orphans),
                        self.url, ", ".join(self._deferred_orphans[:5]))
            self._remove_quietly(self._deferred_orphans, "an orphan")

    def _publish_manifest(self, manifest: Manifest) -> None:
        data = manifest.dumps().encode("utf-8")
        try:
            self.manifest_version = write_if(self.store, MANIFEST_NAME, data, self.manifest_version)
        except PreconditionFailed as e:
            raise PublishRaceError(
                f"Another run published {self.store.url_of(MANIFEST_NAME)} after this run read it (the manifest is "
                f"no longer at version {self.manifest_version or '(none)'}); nothing of this run was published and "
                "its uploaded shards are removed (or left for the next run to remove). Re-run to add to the new "
                "dataset.") from e
        except StorageError as e:  # no answer (OutcomeUnknown), or a request that may still reach the store
            self.maybe_published = True
            raise PublishUnknownError(
                f"Writing {self.store.url_of(MANIFEST_NAME)} failed without a clear answer ({e}). This run's "
                "manifest may have been published (or may still be, by a request in flight): its shards are kept, "
                "and the next run removes those the manifest does not list. Re-run.") from e

    def remove(self, names: Sequence[str]) -> None:
        """Objects the published manifest no longer lists (replaced shards, stale index files)."""
        self._remove_quietly(list(names), "no longer listed")

    def upload_report(self, path: str) -> str:
        """Put a run report (written in staging's reports/) under the dataset's reports/; returns its URL."""
        name = f"{REPORTS_DIR}/{os.path.basename(path)}"
        self.store.put_file(name, path)
        return self.store.url_of(name)

    @property
    def upload_stats(self) -> dict:
        up = self.uploader
        return {} if up is None else {"uploaded_objects": len(up.uploaded), "uploaded_bytes": up.bytes,
                                      "upload_busy_seconds": round(up.busy_seconds, 3)}
