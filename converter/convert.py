"""The conversion, stage by stage: discover -> plan -> transform + write -> publish.

`convert()` is the Python API behind `imgshard convert`. It holds the output lock for
the whole run, never publishes a half-done dataset, and returns a `ConvertResult`
(or raises an error that says what went wrong, where, and what to do).
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from converter import __version__
from converter.discover.layout import BadInput
from converter.discover.sources import discover_sources
from converter.publish.band_stats import split_stats
from converter.transform.kinds import keep_earlier_kind, resolve_options
from converter.run.execute import local_start, run_tasks
from converter.plan import fptable
from converter.run.lock import OutputLock, wait_for_orphans
from converter.options import OutputOptions, RunOptions, SourceSpec
from converter.plan.names import refuse_taken_names
from converter.plan.scope import check_prune, check_spec, run_scope, sources_record
from converter.plan.shards import Plan, PlanError, make_plan, refuse_damaged
from converter.fsutil import remove_files
from converter.publish.manifest import publish_manifest, sweep_leftovers, utc_now, write_report
from converter.publish.migrate import migrate
from converter.publish.tfds import TFDS_FILES, sync_tfds_metadata
from converter.transform.colormap import ignore_index_for, mask_dtype_for
from converter.transform.semantics import make_semantics
from converter.run.task import ShardResult, WorkerContext, content_changed
from converter.write.index import write_refreshed_index
from readers.index import table_samples
from readers.manifest import (
    HISTORY_LIMIT,
    MANIFEST_NAME,
    ClassInfo,
    Manifest,
    SampleEntry,
    ShardEntry,
    SplitEntry,
)
from readers.storage import is_remote, local_path
from readers.tasks import task_kind

log = logging.getLogger(__name__)

EX_DATAERR = 65
EX_IOERR = 74


class BadInputError(ValueError):
    """Too many bad source files; nothing was published."""

    exit_code = EX_DATAERR

    def __init__(self, message: str, bad: list[BadInput], report_path: str | None) -> None:
        super().__init__(message)
        self.bad = bad
        self.report_path = report_path


class OutputWriteError(OSError):
    """Writing the output failed (disk full, I/O error, a failed upload); the previous dataset is intact."""

    exit_code = EX_IOERR

    def __str__(self) -> str:  # an object store's failure has no errno: the message alone
        return str(self.strerror) if self.errno is None and self.strerror else super().__str__()


class EmptyDatasetError(BadInputError):
    """The run would publish a dataset without a single sample (no dataset exists yet)."""


class OutputFolderError(ValueError):
    """OUT cannot be a dataset folder: it is a file, or one of its parents is (a usage error)."""

    exit_code = 2


@dataclass
class ConvertResult:
    out_dir: str
    manifest: Manifest | None
    plan: Plan
    written: list[ShardEntry] = field(default_factory=list)
    bad: list[BadInput] = field(default_factory=list)
    unknown_colors: dict[tuple[int, int, int], list[int]] = field(default_factory=dict)
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)  # seconds per stage (for the report)
    workers: dict[str, object] = field(default_factory=dict)  # backend, workers, how they were started
    report_path: str | None = None
    published: bool = False
    source: dict[str, object] = field(default_factory=dict)  # layout, why, mask semantics (segmentation)
    results: list[ShardResult] = field(default_factory=list)

    @property
    def added(self) -> int:
        return sum(r.added for r in self.results)

    @property
    def replaced(self) -> int:
        return sum(r.replaced for r in self.results)

    @property
    def samples_written(self) -> int:
        return sum(s.records for s in self.written)

    @property
    def bytes_written(self) -> int:
        return sum(s.bytes for s in self.written)


def _describe_unknown(unknown: dict, cmap, limit: int = 20) -> list[str]:
    lines = []
    for color, (pixels, files) in sorted(unknown.items(), key=lambda kv: -kv[1][0])[:limit]:
        near = ""
        if isinstance(color, int):  # an index mask's value
            lines.append(f"  value {color}: {pixels} px in {files} file(s)")
            continue
        if cmap is not None:
            name, dist = cmap.nearest(color)
            near = f", nearest class {name!r} at distance {dist}"
        lines.append(f"  colour {color}: {pixels} px in {files} file(s){near}")
    if len(unknown) > limit:
        lines.append(f"  ... and {len(unknown) - limit} more colours (see the report)")
    return lines


def _check_compatible(old: Manifest, options: OutputOptions, classes: tuple[ClassInfo, ...]) -> OutputOptions:
    """`options` as they apply to the dataset `old` (`keep_earlier_kind`), or `PlanError` when it was
    built with other options or classes."""
    diffs = []
    options = keep_earlier_kind(options, old.options)
    try:
        stored = OutputOptions.from_json(old.options)
        diffs = options.differences(stored)
    except (TypeError, ValueError, KeyError) as e:
        diffs = [f"stored options unreadable ({e})"]
    if tuple(old.classes) != tuple(classes):
        line = "classes: the class table differs from the one the dataset was built with"
        old_names, new_names = [c.name for c in old.classes], [c.name for c in classes]
        if not task_kind(options.task).dense and old_names != new_names:  # class folders
            added = [n for n in new_names if n not in old_names]
            removed = [n for n in old_names if n not in new_names]
            line += f" (class folders added: {added}, removed: {removed}; the labels would change)"
        diffs.append(line)
    if diffs:
        raise PlanError(
            "The output folder holds a dataset built with other options:\n  " + "\n  ".join(diffs)
            + "\nRe-run with the same options to add new samples, or add --rebuild to convert everything again."
        )
    return options


def check_shards_present(out_dir: str, old: Manifest) -> None:
    """Refuse to build on a damaged dataset: every listed shard must exist with its size (a cheap stat)."""
    def size_of(name: str) -> int | None:
        try:
            return os.stat(os.path.join(out_dir, name)).st_size
        except FileNotFoundError:
            return None

    refuse_damaged(out_dir, old, size_of)


def _mask_spec(options: OutputOptions, classes: tuple[ClassInfo, ...]) -> dict | None:
    if not task_kind(options.task).dense:
        return None
    n = len(classes)
    return {"dtype": mask_dtype_for(n).name if n <= 255 else "uint16", "encoding": options.mask_encoding.value,
            "ignore_index": ignore_index_for(n), "codec": options.mask_codec}


def _image_spec(options: OutputOptions, splits: dict | None = None) -> dict:
    h, w = options.size
    image = {"height": h, "width": w, **options.image_kind.manifest_entry(), "codec": options.image_encoding.value}
    if options.quality is not None:
        image["quality"] = options.quality
    stats = split_stats(splits) if splits and not options.image_kind.legacy else None
    if stats is not None:
        image["stats"] = stats  # per-band mean / std of the train split: normalize="stats"
    return image


def convert(spec: SourceSpec, out_dir: str, options: OutputOptions, run: RunOptions | None = None, *,
            on_plan: Callable[[Plan], None] | None = None,
            on_progress: Callable[[int], None] | None = None) -> ConvertResult:
    """Convert the sources in `spec` into `out_dir`. See the module docstring."""
    run = run or RunOptions()
    t0 = time.perf_counter()
    if is_remote(out_dir):
        return _convert_to_bucket(spec, os.fspath(out_dir), options, run, t0, on_plan, on_progress)
    out_dir = os.path.abspath(local_path(out_dir))
    _make_output_folder(out_dir)
    lock = _take_output_lock(out_dir)
    try:
        return _convert_locked(spec, out_dir, options, run, t0, on_plan, on_progress)
    finally:
        lock.__exit__(None, None, None)


def _convert_to_bucket(spec, url, options, run, t0, on_plan, on_progress) -> ConvertResult:
    """`convert` into an ``s3://``/``gs://`` URL: the same stages in a local staging folder,
    with the bucket's lock, uploads and conditional publish (`converter.bucket.output`)."""
    from converter.bucket.output import BucketOutput

    try:
        with BucketOutput(url, dict(run.storage_options), staging_dir=run.staging_dir,
                          lock_ttl_seconds=run.lock_ttl_seconds) as bucket:
            result = _convert_locked(spec, bucket.staging, options, run, t0, on_plan, on_progress, bucket)
    except OutputWriteError:
        raise
    except OSError as e:  # the bucket (the manifest, listing, downloads, the lock object) or the staging folder
        raise OutputWriteError(None, f"{e}. Nothing was published; the previous dataset is intact.") from e
    result.out_dir = bucket.url
    return result


def _make_output_folder(out_dir: str) -> None:
    """Create OUT (and its parents); a path that cannot be a folder is a usage error
    (exit 2), a folder that cannot be written an output error (exit 74), named in one line."""
    blocker = next((p for p in _self_and_parents(out_dir) if os.path.lexists(p) and not os.path.isdir(p)), None)
    if blocker is not None:
        kind = "a broken symbolic link" if os.path.islink(blocker) and not os.path.exists(blocker) else "a file"
        what = f"is {kind}" if blocker == out_dir else f"cannot be created: {blocker} is {kind}"
        raise OutputFolderError(f"output folder {out_dir} {what}, not a folder. Give a folder path for OUT "
                                "(it is created if missing), or move the file away.")
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise _unwritable(out_dir, e) from e
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise _unwritable(out_dir, OSError(errno.EACCES, "not writable (read-only file system or permissions)"))


def _self_and_parents(path: str) -> list[str]:
    out = [path]
    while os.path.dirname(out[-1]) != out[-1]:
        out.append(os.path.dirname(out[-1]))
    return out


def _unwritable(out_dir: str, e: OSError) -> OutputWriteError:
    return OutputWriteError(e.errno, f"cannot write to the output folder {out_dir}: {e.strerror or e}. Nothing was "
                            "written. Choose a writable OUT, or fix its permissions or mount (read-only?).")


def _take_output_lock(out_dir: str) -> OutputLock:
    """OUT's lock, taken; a folder where the lock file cannot be created is an output error (74)."""
    lock = OutputLock(out_dir)
    try:
        lock.__enter__()
    except OSError as e:
        raise _unwritable(out_dir, e) from e
    return lock


def _convert_locked(spec, out_dir, options, run, t0, on_plan, on_progress, bucket=None) -> ConvertResult:
    """The run, holding the lock. `bucket`: a `converter.bucket.output.BucketOutput` when OUT is a
    bucket (`out_dir` is then its local staging folder), None for a local OUT."""
    found, classes, options = discover_sources(spec, options)  # options: with the resolved mask semantics
    options = resolve_options(found.samples, options)  # and the stored image kind (dtype, channels)
    if bucket is not None:
        checked = [options]
        old = bucket.prepare(run.rebuild, lambda m: checked.append(_check_compatible(m, options, classes)))
        options = checked[-1]
    else:
        old, options = _prepare_output(out_dir, options, run, classes)
    base_manifest = None if run.rebuild else old
    scope = run_scope(found.scope) if task_kind(options.task).dense else None
    if scope is not None:
        check_spec(old, spec.spec_text, run.rebuild)
        check_prune(base_manifest, scope, run.prune)
    next_index = {s: e.next_shard_index for s, e in old.splits.items()} if old is not None else {}
    plan = make_plan(found.samples, base_manifest, options, run, len(classes), next_index, root=out_dir,
                     run_id=bucket.run_id if bucket is not None else None,
                     scope_splits=None if scope is None else {e["split"] for e in scope})
    refuse_taken_names(out_dir, old, [t.file for t in plan.tasks])  # never over a published shard
    if scope is not None:
        plan.sources = sources_record(base_manifest, scope, spec.spec_text, run.rebuild)
    if run.rebuild and old is not None:
        plan.drop_shards |= {s.file for _, s in old.iter_shards()}
    for key in plan.changed_kept:
        log.warning("%s changed since it was converted; keeping the old record (--on-change replace re-converts it)", key)
    for key in plan.deleted_kept:
        log.warning("%s: its source is gone; keeping its record (--prune drops it)", key)
    t_plan = time.perf_counter()
    if on_plan is not None:
        on_plan(plan)

    result = ConvertResult(out_dir, old, plan, bad=list(found.bad))  # after the plan consumed the samples
    if task_kind(options.task).dense:
        result.source = {"layout": found.layout, "why": found.why, "labels": options.labels.to_json(),
                         "classes_from": found.defaults.classes_from}
    results = _write_shards(spec, out_dir, options, run, classes, old, result, on_progress, bucket)
    _collect(result, results)
    result.workers["helped_samples"] = sum(r.helped for r in results)  # converted by a worker that had no shard left
    result.seconds = time.perf_counter() - t0
    result.timings = {"discover_and_plan": t_plan - t0, "write_shards": time.perf_counter() - t_plan,
                      "worker_busy": sum(r.seconds for r in results)}

    cmap = make_semantics(options.labels, classes) if task_kind(options.task).dense else None
    report = _report(result, options, run, cmap)
    if bucket is not None:
        report |= {"out_dir": bucket.url, "run_id": bucket.run_id, "orphans_removed": bucket.orphans}
    if len(result.bad) > run.max_bad:
        cleanup_quietly(out_dir, [t.file for t in plan.tasks], old)
        result.report_path = _write_report_safely(out_dir, report | {"published": False}, bucket)
        raise BadInputError(_bad_message(result, run, cmap), result.bad, result.report_path)
    if old is None and not result.samples_written:  # a first run that found nothing to convert
        _refuse_empty(spec, found, result, run, report, bucket)
    if not (result.written or plan.drop_shards or plan.refreshed):  # nothing new (or every new sample bad)
        result.report_path = _write_report_safely(out_dir, report | {"published": False, "nothing_new": True},
                                                  bucket)
        return result
    return _publish(spec, out_dir, options, run, classes, old, result, report, bucket)


def _prepare_output(out_dir: str, options: OutputOptions, run: RunOptions,
                    classes: tuple[ClassInfo, ...]) -> tuple[Manifest | None, OutputOptions]:
    """(the published manifest (None: a new dataset), the options as they apply to it), after
    checking that this run may add to it, and once the leftovers of crashed runs are gone."""
    old = Manifest.load(out_dir) if os.path.exists(os.path.join(out_dir, MANIFEST_NAME)) else None
    if old is not None:  # TFDS files in step with the published manifest (a run may have died in between)
        sync_tfds_metadata(out_dir, old)
    if old is not None and not run.rebuild:
        options = _check_compatible(old, options, classes)
    wait_for_orphans(out_dir)  # workers of a killed run finish their task or stop first
    sweep_leftovers(out_dir, old)
    if old is not None and not run.rebuild:
        check_shards_present(out_dir, old)
        if not old.indexed:  # version 1 or 2: per-sample data moves to index files first
            old = _migrate(out_dir, old)
    return old, options


def _migrate(out_dir: str, old: Manifest) -> Manifest:
    try:
        return migrate(out_dir, old)
    except OSError as e:
        cleanup_quietly(out_dir, [], old)
        raise OutputWriteError(e.errno, f"Migrating {out_dir} to manifest version 3 failed: {e.strerror or e}. "
                               "The previous dataset is intact; fix the disk and re-run.") from e


def _write_shards(spec, out_dir, options, run, classes, old: Manifest | None, result: ConvertResult,
                  on_progress, bucket=None) -> list[ShardResult]:
    """Run the plan's shard tasks; an output failure removes what they wrote and says so.

    Into a bucket: the local runner's shards are uploaded by `bucket` as they finish (while the
    next ones are converted); Dask workers upload their own (`converter.bucket.worker`)."""
    plan = result.plan
    target = None
    if bucket is not None and run.backend == "dask":
        from converter.bucket.worker import BucketTarget

        target = BucketTarget(bucket.store)
    elif bucket is not None:
        bucket.fetch_copy_sources(plan.tasks)
    ctx = WorkerContext(out_dir, options, classes, spec.base, run.max_pixels,
                        os.path.join(out_dir, MANIFEST_NAME) if old is not None else None,
                        owner_pid=os.getpid() if run.backend == "local" else None,
                        source_options=spec.storage_options)
    results: list[ShardResult] = []
    start = local_start(run.effective_workers, len(plan.tasks)) if run.backend == "local" else None
    result.workers = {"backend": run.backend, "workers": run.effective_workers, "start": start or run.backend}
    try:
        for r in run_tasks(plan.tasks, ctx, workers=run.effective_workers, backend=run.backend,
                           scheduler=run.scheduler, on_progress=on_progress, start=start, bucket=target):
            if bucket is not None and target is None:
                bucket.shard_done(r.entry)
            results.append(r)
    except OSError as e:
        # Source files never raise OSError here (the workers turn their errors into bad
        # inputs): this is the output folder failing (disk full, quota, I/O error...).
        cleanup_quietly(out_dir, [t.file for t in plan.tasks], old)
        hint = ("Free space (or raise the quota) and re-run." if e.errno in (errno.ENOSPC, errno.EDQUOT)
                else "Fix the disk or the folder's permissions and re-run." if bucket is None
                else "Check the bucket's credentials, endpoint and network (or the staging folder's disk) and re-run.")
        where = out_dir if bucket is None else f"{bucket.url} (staged in {out_dir})"
        raise OutputWriteError(
            e.errno, f"Writing shards to {where} failed: {e.strerror or e} ({e.filename or 'shard'}). "
            f"Nothing was published; the previous dataset is intact. {hint}"
        ) from e
    except BaseException:
        cleanup_quietly(out_dir, [t.file for t in plan.tasks], old)
        raise
    return results


def _collect(result: ConvertResult, results: list[ShardResult]) -> None:
    """The workers' bad inputs, unknown colours and written shards, in a stable order."""
    for r in results:
        result.bad.extend(r.bad)
        for color, (px, files) in r.unknown_colors.items():
            agg = result.unknown_colors.setdefault(color, [0, 0])
            agg[0] += px
            agg[1] += files
    result.bad.sort(key=lambda b: (b.path, b.reason))
    result.written = sorted((r.entry for r in results if r.entry is not None), key=lambda e: e.file)
    result.results = results


def _publish(spec, out_dir, options, run, classes, old: Manifest | None, result: ConvertResult,
             report: dict, bucket=None) -> ConvertResult:
    """Refreshed index files, TFDS files, then the manifest (last); then the shards and index
    files it no longer lists go."""
    plan = result.plan
    try:
        refreshed = refresh_indexes(out_dir, old, plan) if not run.rebuild else {}
    except OSError as e:
        cleanup_quietly(out_dir, [t.file for t in plan.tasks], old)
        raise OutputWriteError(e.errno, f"Writing an index file in {out_dir} failed: {e.strerror or e}. "
                               "Nothing was published; the previous dataset is intact.") from e
    if bucket is not None and run.rebuild and run.backend == "dask":
        bucket.fetch_indexes_of(result.written)  # the history counts read the new index files
    manifest = _assemble(old, result, options, classes, plan, spec.base, refreshed, rebuild=run.rebuild)
    if bucket is not None:
        return _publish_to_bucket(bucket, out_dir, old, manifest, refreshed, result, report)
    try:
        sync_tfds_metadata(out_dir, manifest)  # before the manifest: the manifest is published last
        publish_manifest(out_dir, manifest)
    except OSError as e:
        if _is_published(out_dir, manifest):  # renamed, then the folder fsync failed: keep its shards
            raise OutputWriteError(
                e.errno, f"Published {MANIFEST_NAME} in {out_dir}, but making it durable failed: "
                f"{e.strerror or e}. Check the disk, then run `imgshard verify OUT`."
            ) from e
        _restore_tfds_metadata(out_dir, old)
        cleanup_quietly(out_dir, [t.file for t in plan.tasks], old)
        raise OutputWriteError(
            e.errno, f"Publishing {MANIFEST_NAME} in {out_dir} failed: {e.strerror or e}. "
            "The previous dataset is intact; fix the disk and re-run."
        ) from e
    remove_files(out_dir, sorted(plan.drop_shards) + stale_indexes(old, manifest))
    result.manifest = manifest
    result.published = True
    report["history"] = manifest.history[-1]
    result.report_path = _write_report_safely(out_dir, report | {"published": True})
    return result


def _publish_to_bucket(bucket, out_dir: str, old: Manifest | None, manifest: Manifest,
                       refreshed: dict[str, ShardEntry], result: ConvertResult, report: dict) -> ConvertResult:
    """Every upload done, the refreshed index files put, then the manifest (compare-and-swap on
    the version read at the start), last; then the objects it no longer lists go."""
    try:
        bucket.publish(manifest, [e.index.file for e in refreshed.values() if e.index is not None])
    except OSError as e:  # an upload or the manifest's PUT failed
        raise OutputWriteError(None, f"Uploading to {bucket.url} failed: {e}. Nothing was published; the "
                               "previous dataset is intact. Re-run (the next run removes what was uploaded).") from e
    bucket.remove(sorted(result.plan.drop_shards) + stale_indexes(old, manifest))
    result.manifest = manifest
    result.published = True
    report["history"] = manifest.history[-1]
    report["uploads"] = bucket.upload_stats
    result.report_path = _write_report_safely(out_dir, report | {"published": True}, bucket)
    return result


def _refuse_empty(spec: SourceSpec, found, result: ConvertResult, run: RunOptions, report: dict,
                  bucket=None) -> None:
    """A first run without a single sample publishes nothing and fails (exit 65), so cron learns."""
    remove_files(result.out_dir, [t.file for t in result.plan.tasks])
    result.report_path = _write_report_safely(result.out_dir, report | {"published": False, "empty": True}, bucket)
    where = result.out_dir if bucket is None else bucket.url
    raise EmptyDatasetError(_empty_message(spec, found, result, run, where), result.bad, result.report_path)


def _empty_message(spec: SourceSpec, found, result: ConvertResult, run: RunOptions, where: str) -> str:
    """Why a first run has no sample to publish: no sources at all, or every one bad."""
    if not result.bad:
        splits = ", ".join(found.splits) or "none"
        return (f"nothing to convert: no source images found under {spec.base} (splits: {splits}), and "
                f"{where} holds no dataset yet; nothing was published. Put the source "
                "images in SRC's split (or class) folders, or point SRC at the right folder.")
    lines = [f"nothing to convert: every source is bad ({len(result.bad)} file(s), within --max-bad "
             f"{run.max_bad}), so the dataset would have no sample; nothing was published."]
    lines += [f"  {b}" for b in result.bad[:20]]
    if len(result.bad) > 20:
        lines.append(f"  ... and {len(result.bad) - 20} more (see {result.report_path})")
    return "\n".join(lines)


def _is_published(out_dir: str, manifest: Manifest) -> bool:
    try:
        with open(os.path.join(out_dir, MANIFEST_NAME), "rb") as f:
            return f.read() == manifest.dumps().encode("utf-8")
    except OSError:
        return False


def cleanup_quietly(out_dir: str, files: list[str], old: Manifest | None) -> None:
    """Remove this run's shards after a write failure; a failure here only leaves
    leftovers (unlisted, swept by the next run) and must not hide the first error."""
    try:
        remove_files(out_dir, files)
        sweep_leftovers(out_dir, old)
    except OSError as e:
        log.warning("could not remove this run's partial files in %s (%s); the next run sweeps them", out_dir, e)


def _write_report_safely(out_dir: str, report: dict, bucket=None) -> str | None:
    """Write the run report (and put it into the bucket's reports/); on a full disk or a failed
    upload say so instead of hiding the run's outcome."""
    try:
        path = write_report(out_dir, report)
        return path if bucket is None else bucket.upload_report(path)
    except OSError as e:
        where = out_dir if bucket is None else bucket.url
        log.error("could not write the run report under %s/reports: %s", where, e.strerror or e)
        return None


def _restore_tfds_metadata(out_dir: str, old: Manifest | None) -> None:
    """After a failed publish, point the TFDS files back at the previous dataset (best effort:
    the next run does it again before anything else)."""
    try:
        if old is not None:
            sync_tfds_metadata(out_dir, old)
        else:
            remove_files(out_dir, TFDS_FILES)
    except OSError as e:
        log.warning("could not restore the TFDS metadata in %s (%s); the next run rewrites it", out_dir, e)


def refresh_indexes(out_dir: str, old: Manifest | None, plan: Plan) -> dict[str, ShardEntry]:
    """Shards whose sources were only touched (new mtime, same content): a new index file each
    (a new name: the published one stays as it is until the new manifest replaces it)."""
    out: dict[str, ShardEntry] = {}
    if old is None:
        return out
    for _, shard in old.iter_shards():
        rows = plan.refreshed.get(shard.file)
        if not rows or shard.file in plan.drop_shards:
            continue
        out[shard.file] = dataclasses.replace(shard, index=write_refreshed_index(out_dir, shard, rows))
    return out


def stale_indexes(old: Manifest | None, new: Manifest) -> list[str]:
    """Index files of the previous manifest that the new one no longer lists (removed after publishing)."""
    if old is None:
        return []
    listed = {s.index.file for _, s in new.iter_shards() if s.index is not None}
    return sorted(s.index.file for _, s in old.iter_shards() if s.index is not None and s.index.file not in listed)


def _assemble(previous: Manifest | None, result: ConvertResult, options: OutputOptions,
              classes: tuple[ClassInfo, ...], plan: Plan, source_base: str, refreshed: dict[str, ShardEntry], *,
              rebuild: bool = False) -> Manifest:
    """The new manifest: the previous shards (all dropped with --rebuild) plus this run's."""
    old = None if rebuild else previous
    splits: dict[str, list[ShardEntry]] = {}
    if old is not None:
        for split, entry in old.splits.items():
            splits[split] = [refreshed.get(s.file, s) for s in entry.shards if s.file not in plan.drop_shards]
    split_of = {t.file: t.split for t in plan.tasks}
    for e in result.written:
        splits.setdefault(split_of[e.file], []).append(e)
    split_entries = {
        name: SplitEntry(tuple(sorted(shards, key=lambda s: s.file)), plan.next_index.get(name, 0))
        for name, shards in splits.items()
    }
    samples = sum(e.num_samples for e in split_entries.values())
    if rebuild:
        try:
            counts = rebuild_counts(previous, result.out_dir, split_entries, source_base)
        except (OSError, ValueError) as e:  # a damaged previous dataset: what --rebuild is for
            log.warning("the history counts of this --rebuild are approximate: %s", e)
            counts = {"added": result.added, "replaced": 0, "pruned": 0, "approximate": True}
    else:
        counts = {"added": result.added, "replaced": result.replaced, "pruned": plan.pruned}
    history = list(previous.history) if previous is not None else []
    history.append(history_entry(counts, samples, rebuild=rebuild))
    return Manifest(
        tool_version=__version__,
        task=options.task.value,
        format=options.format.value,
        compression=options.compression,  # type: ignore[arg-type]
        options=options.to_json(),
        image=_image_spec(options, splits),
        mask=_mask_spec(options, classes),
        classes=classes,
        splits=split_entries,
        history=tuple(history[-HISTORY_LIMIT:]),
        sources=plan.sources,
    )


def history_entry(counts: dict[str, int], samples: int, *, rebuild: bool = False) -> dict:
    """One history line: added (keys now listed that the previous manifest did not list),
    replaced (keys in both whose image or mask content changed), pruned (keys dropped)."""
    entry = {"time": utc_now(), **counts, "samples": samples, "tool_version": __version__}
    if rebuild:
        entry["rebuild"] = True
    return entry


def rebuild_counts(previous: Manifest | None, out_dir: str, splits: dict[str, SplitEntry],
                   source_base: str) -> dict[str, int]:
    """History counts of a --rebuild, from the previous and new datasets' compact tables
    (key hashes; the exact comparison only for keys whose sources' stats differ)."""
    new = fptable.build(((name, s) for name in sorted(splits) for s in splits[name].shards), out_dir)
    if previous is None:
        return {"added": len(new), "replaced": 0, "pruned": 0}
    old = fptable.build(previous.iter_shards(), out_dir)
    _, i_old, i_new = np.intersect1d(old.key_hash, new.key_hash, assume_unique=True, return_indices=True)
    moved = np.flatnonzero(old.stat_hash[i_old] != new.stat_hash[i_new])
    replaced = 0
    rows: dict[tuple[int, int], np.ndarray] = {}  # (table, shard id) -> its index rows, loaded on demand

    def sample(table: fptable.FingerprintTable, which: int, row: int) -> SampleEntry:
        sid = int(table.shard[row])
        if (which, sid) not in rows:
            rows[(which, sid)] = fptable.shard_table(out_dir, table.shards[sid][1])
        return table_samples(rows[(which, sid)][[int(table.record[row])]])[0]

    for j in moved:
        a, b = sample(new, 1, i_new[j]), sample(old, 0, i_old[j])
        replaced += content_changed(a, b, source_base)
    common = len(i_old)
    return {"added": len(new) - common, "replaced": replaced, "pruned": len(old) - common}


def _report(result: ConvertResult, options: OutputOptions, run: RunOptions, cmap) -> dict:
    plan = result.plan
    return {
        "tool_version": __version__,
        "time": utc_now(),
        "out_dir": result.out_dir,
        "options": options.to_json(),
        "max_bad": run.max_bad,
        "counts": {"new": plan.new, "replaced": plan.replaced, "pruned": plan.pruned, "unchanged": plan.unchanged,
                   "changed_kept": len(plan.changed_kept), "deleted_kept": len(plan.deleted_kept),
                   "written_samples": result.samples_written, "written_shards": len(result.written),
                   "bad": len(result.bad)},
        "bad": [b.to_json() for b in result.bad],
        "unknown_colors": [
            {"color": list(c), "pixels": px, "files": files,
             **(dict(zip(("nearest", "distance"), cmap.nearest(c))) if cmap else {})}
            if not isinstance(c, int) else {"value": c, "pixels": px, "files": files}
            for c, (px, files) in sorted(result.unknown_colors.items(), key=lambda kv: -kv[1][0])
        ],
        "changed_kept": plan.changed_kept,
        "deleted_kept": plan.deleted_kept,
        "seconds": round(result.seconds, 3),
        "timings": {k: round(v, 3) for k, v in result.timings.items()},
        "workers": result.workers,
        "source": result.source,
        "shards": [s.file for s in result.written],
    }


def _bad_message(result: ConvertResult, run: RunOptions, cmap) -> str:
    n = len(result.bad)
    lines = [f"{n} bad source file(s) (allowed: --max-bad {run.max_bad}); nothing was published:"]
    for b in result.bad[:50]:
        lines.append(f"  {b}")
    if n > 50:
        lines.append(f"  ... and {n - 50} more (see the report)")
    if result.unknown_colors:
        lines.append("Unknown mask colours (not in the class table):")
        lines += _describe_unknown(result.unknown_colors, cmap)
        lines.append("Fix the masks or class_dict.csv, snap near colours with --color-tolerance N, "
                     "or map them to the ignore index with --unknown-color ignore.")
    lines.append(f"Convert the good samples anyway with --max-bad {n}.")
    return "\n".join(lines)
