"""Run planned shard tasks on a Dask cluster (`imgshard convert --backend dask`).

The tasks are the same `ShardTask`s the local backend runs, executed by the same
function (`converter.run.task.run_shard_task`), so the shards are the same bytes.
Only small `ShardResult`s come back; the driver (`converter.convert`) assembles and
publishes the manifest after every task succeeded, exactly as with the local backend.

* Cluster: ``scheduler=None`` starts a `distributed.LocalCluster` on this machine
  (processes, one thread each, `workers` of them, loopback only); ``scheduler=ADDRESS``
  connects to a running scheduler and uses all of its workers. Sources and output
  must be on storage every worker reaches under the same paths (a shared filesystem);
  this is checked before any task is submitted.
* Tasks go through `dask.distributed` directly (`Client.submit`, one future per shard,
  key ``imgshard-<run>-<shard file>``), not through joblib's Dask backend: on a failure
  the driver must know which tasks still run and wait for them, so that no task of a
  failed run renames a shard after the driver cleaned up and released the output
  lock; joblib's backend forgets its futures on abort and batches tasks under opaque
  keys.
* Lost workers: the scheduler reschedules the tasks of a worker that dies (up to
  ``distributed.scheduler.allowed-failures`` deaths per task, then `KilledWorker`,
  which ends the run with `DaskBackendError`). Re-running a shard task is safe: a
  shard is written under a unique temporary name and renamed (`ShardWriter`), its
  bytes are a function of the task alone, and the temporary files of killed attempts
  are removed when the run succeeds (or swept by the next run).
* Progress: every sample a worker finishes is logged as a Dask event
  (``Worker.log_event``) on a per-run topic that the driver subscribes to, so the bar
  moves per sample as with the local backend. Counts are capped per shard (a retried
  shard reports its samples again) and topped up when the shard's result arrives
  (events and results travel separately), so the bar ends at exactly the total.
* Dask is an optional extra (``pip install 'imgshard[dask]'``), imported only here.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import re
import secrets
import threading
import time
from typing import Any, Callable, Iterator, Sequence

from converter.plan.shards import ShardTask
from converter.fsutil import TMP_PREFIX
from converter.run.task import ShardResult, WorkerContext, run_shard_task

log = logging.getLogger(__name__)

ProgressFn = Callable[[int], None]

EX_UNAVAILABLE = 69  # sysexits.h: a service (the cluster, or the Dask extra) is unavailable
CONNECT_TIMEOUT_S = 30
WAIT_FOR_WORKERS_S = 60
#: After a failure on an external cluster, how long to wait for shard tasks that are
#: already running (they cannot be interrupted) before giving up on them.
STRAGGLER_WAIT_S = 600

_ADDRESS_RE = re.compile(r"^(?:(?:tcp|tls|ws|wss|ucx)://)?(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):\d{1,5}$")


class DaskBackendError(RuntimeError):
    """The Dask backend cannot run (extra missing, scheduler unreachable, workers lost)."""

    exit_code = EX_UNAVAILABLE


def import_distributed() -> Any:
    """`distributed`, or a `DaskBackendError` naming the extra to install."""
    try:
        import distributed
    except ImportError as e:
        raise DaskBackendError(
            "--backend dask needs the optional Dask extra, which is not installed here: "
            f"pip install 'imgshard[dask]' (installs dask[distributed]). Received: {type(e).__name__}: {e}"
        ) from e
    return distributed


def check_scheduler_address(address: str) -> str:
    """`address` as given, if it looks like ``tcp://HOST:PORT``; else a `ValueError`."""
    if not isinstance(address, str) or not _ADDRESS_RE.match(address.strip()):
        raise ValueError(
            "--scheduler must be a Dask scheduler address such as tcp://10.0.0.5:8786 "
            f"(the address `dask scheduler` prints). Received: {address!r}"
        )
    return address.strip()


class EventProgress:
    """Worker side of the progress: picklable; logs ``[shard file, n]`` on the run's topic."""

    def __init__(self, topic: str, file: str) -> None:
        self.topic = topic
        self.file = file

    def __call__(self, n: int) -> None:
        from distributed import get_worker

        try:
            worker = get_worker()
        except ValueError:  # not inside a Dask worker (nothing to report to)
            return
        worker.log_event(self.topic, [self.file, int(n)])


class ProgressTracker:
    """Driver side of the progress: per-shard counts, capped, topped up on completion.

    `event` runs on the Dask client's event-loop thread, `finished` on the thread that
    consumes the results; a lock serialises them and the calls to `on_progress`.
    """

    def __init__(self, tasks: Sequence[ShardTask], on_progress: ProgressFn | None) -> None:
        self._planned = {t.file: t.num_samples for t in tasks}
        self._seen = dict.fromkeys(self._planned, 0)
        self._done: set[str] = set()
        self._on_progress = on_progress
        self._lock = threading.Lock()

    def _add(self, file: str, n: int) -> None:
        add = max(0, min(n, self._planned[file] - self._seen[file]))
        self._seen[file] += add
        if add and self._on_progress is not None:
            self._on_progress(add)

    def event(self, event: Any) -> None:
        try:
            _, (file, n) = event
        except (TypeError, ValueError):
            log.debug("ignoring a malformed progress event: %r", event)
            return
        with self._lock:
            if file in self._planned and file not in self._done:
                self._add(file, int(n))

    def finished(self, file: str) -> None:
        with self._lock:
            self._add(file, self._planned[file])
            self._done.add(file)

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self._seen.values())


@contextlib.contextmanager
def _connect(distributed: Any, scheduler: str | None, workers: int) -> Iterator[tuple[Any, bool]]:
    """(client, is_local_cluster); closes both on exit (a local cluster's workers are killed)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(_quiet_dask_logs())
        if scheduler is None:
            import dask

            # The workers' statistical profiler costs a third of an idle worker's CPU; off here.
            stack.enter_context(dask.config.set({"distributed.worker.profile.enabled": False}))
            cluster = stack.enter_context(distributed.LocalCluster(
                n_workers=max(1, workers), threads_per_worker=1, processes=True, host="127.0.0.1",
                dashboard_address="127.0.0.1:0", scheduler_kwargs={"dashboard": False}, silence_logs=logging.ERROR,
            ))
            client = stack.enter_context(distributed.Client(cluster, set_as_default=False))
            log.info("started a local Dask cluster of %d worker process(es) at %s", workers, cluster.scheduler_address)
        else:
            address = check_scheduler_address(scheduler)
            try:
                client = distributed.Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
            except (OSError, TimeoutError) as e:
                raise DaskBackendError(
                    f"Cannot reach the Dask scheduler at --scheduler {address} within {CONNECT_TIMEOUT_S} s. "
                    "Start one (`dask scheduler`, plus `dask worker ADDRESS` on each machine), check the address "
                    f"and the firewall, or leave out --scheduler to run a local cluster. Received: {e}"
                ) from e
            stack.enter_context(client)
        yield client, scheduler is None


@contextlib.contextmanager
def _quiet_dask_logs() -> Iterator[None]:
    """Dask logs its start-up and shut-down at INFO; keep WARNING and above (all with -vv)."""
    dask_log = logging.getLogger("distributed")
    before = dask_log.level
    if not log.isEnabledFor(logging.DEBUG):
        dask_log.setLevel(max(before, logging.WARNING))
    try:
        yield
    finally:
        dask_log.setLevel(before)


def _paths_missing(paths: Sequence[str]) -> list[str]:
    """Runs on each worker: which of `paths` it cannot see."""
    return [p for p in paths if not os.path.exists(p)]


def _check_shared_storage(client: Any, ctx: WorkerContext, token: str, scheduler: str | None,
                          bucket: Any = None) -> None:
    """Every worker sees the sources and the output folder (a file written here, there); with a
    bucket OUT (`bucket`: a `converter.bucket.worker.BucketTarget`), every worker reaches the bucket
    instead, and only local source folders need to be shared."""
    try:
        client.wait_for_workers(1, timeout=WAIT_FOR_WORKERS_S)
    except TimeoutError as e:
        raise DaskBackendError(
            f"The Dask scheduler {scheduler} has no worker after {WAIT_FOR_WORKERS_S} s. Start workers with "
            f"`dask worker {scheduler}` on machines that mount the sources and the output folder."
        ) from e
    sources = [] if "://" in ctx.source_base else [ctx.source_base]  # sources in a bucket: read by URL
    if bucket is not None:
        _check_bucket_reachable(client, bucket)
        missing = client.run(_paths_missing, sources) if sources else {}
        where = f"source folder {ctx.source_base} (the output goes to {bucket.store.url})"
    else:
        probe = os.path.join(ctx.out_dir, f"{TMP_PREFIX}dask-probe-{token}")
        with open(probe, "wb"):
            pass
        try:
            missing = client.run(_paths_missing, sources + [probe])
        finally:
            os.unlink(probe)
        where = f"source folder {ctx.source_base}, output folder {ctx.out_dir}"
    blind = {addr: paths for addr, paths in sorted(missing.items()) if paths}
    if blind:
        lines = [f"  worker {addr} cannot see: {', '.join(paths)}" for addr, paths in blind.items()]
        raise DaskBackendError(
            f"Sources and output must be on storage every Dask worker reaches under the same paths "
            f"(a shared filesystem, or a bucket); {where}.\n"
            + "\n".join(lines)
            + "\nMount them at the same paths on every worker machine, put them in a bucket, or use --backend local."
        )


def _store_problem(store: Any) -> str | None:
    """Runs on each worker: why it cannot list the output bucket (None: it can)."""
    try:
        store.list("imgshard-probe-none/")
    except Exception as e:  # noqa: BLE001 - reported per worker by the driver
        return f"{type(e).__name__}: {e}"
    return None


def _check_bucket_reachable(client: Any, bucket: Any) -> None:
    problems = {addr: p for addr, p in sorted(client.run(_store_problem, bucket.store).items()) if p}
    if problems:
        lines = [f"  worker {addr}: {p}" for addr, p in problems.items()]
        raise DaskBackendError(
            f"Dask workers cannot reach the output bucket {bucket.store.url}:\n" + "\n".join(lines)
            + "\nGive the workers the same credentials and endpoint settings (AWS_ENDPOINT_URL, AWS_PROFILE, "
            "GOOGLE_APPLICATION_CREDENTIALS) as the driver.")


def _remove_attempt_leftovers(out_dir: str, tasks: Sequence[ShardTask]) -> None:
    """Temporary files of shard attempts (the shard's and its index file's) that died with their worker."""
    for task in tasks:
        for path in glob.glob(os.path.join(glob.escape(out_dir), glob.escape(f"{TMP_PREFIX}{task.file}") + "[-.]*")):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def _stop_stragglers(client: Any, futures: list[Any]) -> None:
    """After a failure: cancel what has not started, wait for what runs (it may still rename a shard)."""
    keys = {f.key for f in futures}
    try:
        running = {k for ks in client.processing().values() for k in ks} & keys
    except (OSError, TimeoutError) as e:  # the scheduler is gone too: nothing of this run can go on
        log.warning("could not ask the scheduler which shard tasks still run (%s); cancelling all", e)
        running = set()
    client.cancel([f for f in futures if f.key not in running])
    still = [f for f in futures if f.key in running]
    if not still:
        return
    log.warning("waiting for %d running shard task(s) to stop before cleaning up", len(still))
    deadline = time.monotonic() + STRAGGLER_WAIT_S
    while not all(f.done() for f in still) and time.monotonic() < deadline:
        time.sleep(0.1)
    if not all(f.done() for f in still):
        log.warning(
            "%d shard task(s) still run after %d s; their shards are not published and the next run removes them",
            sum(1 for f in still if not f.done()), STRAGGLER_WAIT_S,
        )
    client.cancel(still)


def run_dask(tasks: Sequence[ShardTask], ctx: WorkerContext, *, workers: int, scheduler: str | None = None,
             on_progress: ProgressFn | None = None, bucket: Any = None) -> Iterator[ShardResult]:
    """Yield one `ShardResult` per task as shards finish (unordered); see the module docstring.

    Raises `DaskBackendError` (exit code 69) when Dask is missing, the scheduler cannot
    be reached, no worker sees the shared storage, or a task's workers kept dying; any
    other exception of a task (a full disk...) is re-raised as the task raised it.
    """
    distributed = import_distributed()
    if scheduler is not None:
        check_scheduler_address(scheduler)
    if not tasks:
        return
    token = secrets.token_hex(6)
    topic = f"imgshard-progress-{token}"
    tracker = ProgressTracker(tasks, on_progress)
    with _connect(distributed, scheduler, workers) as (client, local):
        if scheduler is not None and workers:
            log.info("using the %d worker thread(s) of %s (--workers applies to local runs only)",
                     sum(client.nthreads().values()), scheduler)
        _check_shared_storage(client, ctx, token, scheduler or "(local cluster)", bucket)
        client.subscribe_topic(topic, tracker.event)
        if bucket is not None:  # workers write to their own scratch and upload (no shared filesystem)
            from converter.bucket.worker import run_bucket_task

            task_fn, extra = run_bucket_task, (bucket,)
        else:
            task_fn, extra = run_shard_task, ()
        futures = [
            client.submit(task_fn, task, ctx, *extra, EventProgress(topic, task.file),
                          key=f"imgshard-{token}-{task.file}", pure=False)
            for task in tasks
        ]
        file_of = {f.key: t.file for f, t in zip(futures, tasks)}
        succeeded = False
        try:
            for future in distributed.as_completed(futures, loop=client.loop):
                try:
                    result = future.result()
                except distributed.KilledWorker as e:
                    raise DaskBackendError(
                        f"Shard {file_of[future.key]}: Dask gave up after its workers died while running it "
                        "(see distributed.scheduler.allowed-failures). Nothing was published; check the workers' "
                        f"memory and logs and re-run. Received: {e}"
                    ) from e
                except distributed.client.FutureCancelledError as e:
                    raise DaskBackendError(
                        f"Shard {file_of[future.key]}: the task was cancelled (lost connection to the scheduler "
                        f"{scheduler or '(local cluster)'}?). Nothing was published; re-run. Received: {e}"
                    ) from e
                tracker.finished(file_of[future.key])
                future.release()
                yield result
            succeeded = True
        finally:
            with contextlib.suppress(Exception):
                client.unsubscribe_topic(topic)
            if succeeded and bucket is None:
                _remove_attempt_leftovers(ctx.out_dir, tasks)
            elif not local:  # a local cluster's workers are killed when it closes
                _stop_stragglers(client, futures)
