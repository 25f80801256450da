"""Crash safety: kill -9 at random and at exact moments, disk full, I/O errors.

After every crash the published dataset must be the previous one or the new one,
whole (`verify --deep`), and the next run must finish the job: every source key
exactly once, no leftover file.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from converter.testing import synth
from converter.inspect.verify import verify
from readers.index import shard_keys
from readers.manifest import MANIFEST_NAME, Manifest
from tests._cron import (
    ROOT,
    all_pairs,
    assert_whole,
    child_env,
    cli_command,
    kill_session,
    convert_args,
    link_samples,
    manifest_bytes,
    record_keys,
    run_cli,
    shard_hashes,
    source_keys,
    start_cli_session,
    startup_seconds,
)

# -- random moments over a run of a couple of seconds --------------------------------------------

# Large outputs keep a run long enough (about 0.5 s TFRecord, 1.4 s NPZ with 2 workers here)
# for kills to land while shards are being written, not only during start-up.
BIG_SIZE = "384x384"


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> dict[str, Path]:
    """192 pairs of 240x320 / 200x300 sources (converted to BIG_SIZE).

    Source folders: half (every other pair), full, and pruned (full minus 12 pairs).
    """
    root = tmp_path_factory.mktemp("crash")
    full = synth.make_camvid(root / "gen", splits={"train": 160, "val": 32}, size=[(240, 320), (200, 300)],
                             seed=31)
    pairs = all_pairs(full)
    return {
        "half": link_samples(full, root / "half", pairs[::2]),
        "full": link_samples(full, root / "full", pairs),
        "pruned": link_samples(full, root / "pruned", [p for i, p in enumerate(pairs) if i % 16 != 3]),
        "root": root,
    }


def _args(src: Path, out: Path, *extra: str, workers: int = 2, shard_size: str = "256KB") -> list[str]:
    return convert_args(src, out, "--shard-size", shard_size, *extra, size=BIG_SIZE, workers=workers)


def _published_keys(out: Path) -> set[str] | None:
    if not (out / MANIFEST_NAME).exists():
        return None
    return {k for _, shard in Manifest.load(out).iter_shards() for k in shard_keys(str(out), shard)}


def _crash_moments(fmt: str, n: int, big: dict[str, Path], tmp_path: Path) -> list[str]:
    fmt_args = ("--format", fmt)
    bases = {}
    # --prune is for sources deleted from the folders the dataset was built from (another folder is
    # another scope, refused: converter/plan/scope.py): "shrinking" starts as the full folder, and
    # loses the pairs that "pruned" lacks once its base dataset is built.
    shrinking = tmp_path / "shrinking"
    shutil.copytree(big["full"], shrinking, copy_function=os.link)
    for name, src in (("half", big["half"]), ("shrinking", shrinking)):
        bases[name] = tmp_path / f"base-{name}"
        assert run_cli(_args(src, bases[name], *fmt_args, workers=1)) == 0
    for path in [p for p in shrinking.rglob("*") if p.is_file()]:
        if not (big["pruned"] / path.relative_to(shrinking)).exists():
            path.unlink()
    scenarios = [  # (name, base dataset or None, source folder, extra args)
        ("fresh", None, big["full"], ()),
        ("append", bases["half"], big["full"], ()),
        ("prune", bases["shrinking"], shrinking, ("--prune",)),
    ]
    # How long a whole run lasts (the reference for spreading the kill moments).
    t0 = time.monotonic()
    ref = start_cli_session(_args(big["full"], tmp_path / "timing", *fmt_args))
    assert ref.wait(timeout=300) == 0, ref.stderr.read()
    duration = time.monotonic() - t0

    rng = random.Random(1234)
    log = []
    for i in range(n):
        name, base, src, extra = scenarios[i % len(scenarios)]
        out = tmp_path / f"{name}-{i}"
        if base is not None:
            shutil.copytree(base, out)
        before_keys = _published_keys(out)
        before_manifest = manifest_bytes(out)
        target_keys = source_keys(src)
        args = _args(src, out, *fmt_args, *extra)
        moment = duration * (i + rng.random()) / n
        proc = start_cli_session(args)
        time.sleep(moment)
        proc.send_signal(signal.SIGKILL)  # the run only: its workers live on as orphans
        rc = proc.wait(timeout=60)
        proc.stderr.close()
        try:
            # Whatever is published is whole, and is the previous dataset or the new one.
            published = _published_keys(out)
            if published is None:
                assert before_keys is None
            else:
                report = verify(out, deep=True)
                assert report.ok, (name, moment, [str(p) for p in report.errors])
                assert published in (before_keys, target_keys), (name, moment)
                if published == before_keys:
                    assert manifest_bytes(out) == before_manifest
            log.append(f"{name} killed at {moment:.2f}s/{duration:.2f}s (rc {rc}): "
                       f"{'new' if published == target_keys and published != before_keys else 'previous'} dataset")
            # The next run finishes the job: nothing lost, nothing duplicated, nothing left over.
            again = subprocess.run(cli_command(args), cwd=ROOT, env=child_env(), capture_output=True, text=True,
                                   timeout=300)
            assert again.returncode == 0, again.stderr
            assert_whole(out, target_keys)
        finally:
            kill_session(proc)
    return log


@pytest.mark.slow
def test_kill_9_at_random_moments_tfrecord(big, tmp_path):
    log = _crash_moments("tfrecord", 12, big, tmp_path)
    print("\n".join(log))


@pytest.mark.slow
def test_kill_9_at_random_moments_npz(big, tmp_path):
    log = _crash_moments("npz", 4, big, tmp_path)
    print("\n".join(log))


@pytest.mark.slow
def test_two_real_runs_at_once_the_second_exits_75_and_the_first_publishes(big, tmp_path):
    out = tmp_path / "out"
    startup = startup_seconds()
    # One worker writing deflated NPZ: a run of a couple of seconds, so that the second
    # run meets the first one's lock (the converter has become fast on small sources).
    args = _args(big["full"], out, "--format", "npz", "--compression", "deflate", workers=1)
    first = start_cli_session(args)
    try:
        lock = out / ".imgshard.lock"
        deadline = time.monotonic() + 30
        while f'"pid": {first.pid}' not in (lock.read_text() if lock.exists() else ""):
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.02)
        t0 = time.monotonic()
        second = subprocess.run(cli_command(args), cwd=ROOT, env=child_env(),
                                capture_output=True, text=True, timeout=60)
        elapsed = time.monotonic() - t0
        assert first.poll() is None, "the first run ended before the second started: use a bigger dataset"
        assert second.returncode == 75 and f"pid {first.pid}" in second.stderr
        assert elapsed < startup + 1.5, (elapsed, startup)
        assert first.wait(timeout=300) == 0
    finally:
        kill_session(first)
    assert_whole(out, source_keys(big["full"]))


# -- exact moments: kill -9 at a chosen rename ---------------------------------------------------

KILL_AT_RENAME = """
import os, signal, sys
target, nth, when = sys.argv[1], int(sys.argv[2]), sys.argv[3]
real_replace = os.replace
seen = [0]

def replace(src, dst, *args, **kwargs):
    hit = target in os.path.basename(os.fspath(dst))
    if hit:
        seen[0] += 1
    if hit and seen[0] == nth and when == "before":
        os.kill(os.getpid(), signal.SIGKILL)
    result = real_replace(src, dst, *args, **kwargs)
    if hit and seen[0] == nth and when == "after":
        os.kill(os.getpid(), signal.SIGKILL)
    return result

os.replace = replace
from converter.cli import main
sys.exit(main(sys.argv[4:]))
"""


@pytest.mark.parametrize("target,nth,when", [
    (".tfrecord", 2, "before"),   # between two shard renames
    (".tfrecord", 2, "after"),
    (MANIFEST_NAME, 1, "before"),  # every shard renamed, manifest not yet
    (MANIFEST_NAME, 1, "after"),   # manifest published, dropped shards not yet removed
])
def test_kill_9_at_an_exact_rename(tmp_path, target, nth, when):
    full = synth.make_camvid(tmp_path / "gen", splits={"train": 12, "val": 4}, size=[(40, 56), (36, 48)], seed=41)
    pairs = all_pairs(full)
    src = link_samples(full, tmp_path / "src", [p for i, p in enumerate(pairs) if i % 2 == 0])
    out = tmp_path / "out"
    small = ("--shard-size", "8KB")
    assert run_cli(convert_args(src, out, *small)) == 0
    before_manifest, before_keys = manifest_bytes(out), _published_keys(out)
    before_hashes = shard_hashes(out)
    # Next: new sources (new shards) and a deleted one with --prune (a rewrite + a dropped shard).
    link_samples(full, src, pairs)
    victim = sorted(source_keys(src) & before_keys)[0]
    (src / victim).unlink()
    next(src.glob(victim.replace("/", "_labels/").rsplit(".", 1)[0] + "*")).unlink()
    target_keys = source_keys(src)
    args = convert_args(src, out, *small, "--prune")
    crashed = subprocess.run([sys.executable, "-c", KILL_AT_RENAME, target, str(nth), when, *args], cwd=ROOT,
                             env=child_env(), capture_output=True, text=True, timeout=120)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr

    report = verify(out, deep=True)
    assert report.ok, [str(p) for p in report.errors]
    published = _published_keys(out)
    if target == MANIFEST_NAME and when == "after":
        assert published == target_keys
        assert report.warnings  # the dropped shard is still there, unlisted
    else:
        assert published == before_keys and manifest_bytes(out) == before_manifest
        for name, digest in before_hashes.items():
            assert shard_hashes(out)[name] == digest
    assert run_cli(args) == 0
    assert_whole(out, target_keys)


# -- disk full and I/O errors --------------------------------------------------------------------

def _fsync_fails_for_shards(monkeypatch, err: int) -> None:
    """Make fsync of a temporary shard file fail, as a full disk or a dying one does."""
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if ".tmp-" in os.readlink(f"/proc/self/fd/{fd}") and "imgshard.json" not in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(err, os.strerror(err))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EIO])
@pytest.mark.parametrize("fmt", ["tfrecord", "npz"])
def test_write_error_exits_74_and_leaves_the_previous_dataset_intact(camvid_src, tmp_path, monkeypatch, capsys,
                                                                     err, fmt):
    full = camvid_src
    pairs = all_pairs(full)
    src = link_samples(full, tmp_path / "src", pairs[:5])
    out = tmp_path / "out"
    assert run_cli(convert_args(src, out, "--format", fmt)) == 0
    manifest, hashes = manifest_bytes(out), shard_hashes(out)
    link_samples(full, src, pairs)
    capsys.readouterr()
    with monkeypatch.context() as m:
        _fsync_fails_for_shards(m, err)
        assert run_cli(convert_args(src, out, "--format", fmt)) == 74
    message = capsys.readouterr().err
    assert os.strerror(err) in message and "previous dataset is intact" in message
    assert manifest_bytes(out) == manifest and shard_hashes(out) == hashes
    report = verify(out, deep=True)
    assert report.ok and not report.warnings, [str(p) for p in report.errors + report.warnings]
    assert run_cli(convert_args(src, out, "--format", fmt)) == 0  # space back: the next run finishes
    assert_whole(out, source_keys(src))


def test_manifest_publish_failure_exits_74_and_keeps_the_previous_manifest(camvid_src, tmp_path, monkeypatch):
    pairs = all_pairs(camvid_src)
    src = link_samples(camvid_src, tmp_path / "src", pairs[:5])
    out = tmp_path / "out"
    assert run_cli(convert_args(src, out)) == 0
    manifest, hashes = manifest_bytes(out), shard_hashes(out)
    link_samples(camvid_src, src, pairs)
    real_replace = os.replace

    def replace(a, b, *args, **kwargs):
        if os.path.basename(os.fspath(b)) == MANIFEST_NAME:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_replace(a, b, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(os, "replace", replace)
        assert run_cli(convert_args(src, out)) == 74
    assert manifest_bytes(out) == manifest and shard_hashes(out) == hashes
    assert verify(out).ok and not verify(out).warnings


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    return done.returncode == 0


@pytest.mark.parametrize("workers", [1, 2])  # in-process, and forked workers (the error crosses a queue)
def test_real_full_disk_on_a_tiny_tmpfs_exits_74_with_the_previous_dataset_intact(tmp_path, workers):
    mnt = tmp_path / "tiny"
    if not _mount_tmpfs(mnt, "1m"):
        pytest.skip("cannot mount a tmpfs here (needs root); the injected ENOSPC tests cover the logic")
    try:
        full = synth.make_camvid(tmp_path / "gen", splits={"train": 32}, size=(48, 64), seed=51)
        pairs = all_pairs(full)
        src = link_samples(full, tmp_path / "src", pairs[:6])
        out = mnt / "out"
        # 64 KB per sample: 6 fit in 1 MB, 32 do not
        args = convert_args(src, out, "--shard-size", "256KB", size="128x128", workers=workers)
        done = subprocess.run(cli_command(args), cwd=ROOT, env=child_env(), capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        manifest, hashes = manifest_bytes(out), shard_hashes(out)
        link_samples(full, src, pairs)
        done = subprocess.run(cli_command(args), cwd=ROOT, env=child_env(), capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 74, done.stderr
        assert "No space left on device" in done.stderr and "previous dataset is intact" in done.stderr
        assert manifest_bytes(out) == manifest and shard_hashes(out) == hashes
        report = verify(out, deep=True)
        assert report.ok and not report.warnings, [str(p) for p in report.errors + report.warnings]
        assert set(record_keys(out)) == {f"train/{img.name}" for img, _ in pairs[:6]}
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_folder_fsync_failing_after_the_manifest_rename_keeps_the_new_dataset(camvid_src, tmp_path, monkeypatch,
                                                                              capsys):
    import converter.fsutil as publish

    out = tmp_path / "out"
    real = publish.fsync_dir
    calls = []

    def fsync_dir(path: str) -> None:
        caller = sys._getframe(1)
        if caller.f_code.co_name == "write_atomic" and caller.f_locals["path"].endswith(MANIFEST_NAME):
            calls.append(path)  # the fsync of the folder after the rename of imgshard.json
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(path)

    with monkeypatch.context() as m:
        m.setattr(publish, "fsync_dir", fsync_dir)
        assert run_cli(convert_args(camvid_src.root, out)) == 74
    assert calls and "Published imgshard.json" in capsys.readouterr().err
    assert_whole(out, source_keys(Path(camvid_src.root)))  # the shards it lists were kept



# -- the orphan guard, directly: a worker whose run was killed mid-task --------------------------

RUN_WITH_ONE_WORKER = """
import os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:], str(os.getpid())])
print(child.pid, flush=True)
child.wait()
"""

WORKER = """
import sys
from converter.discover.classes import load_class_table
from converter.discover.layouts import discover
from converter.options import OutputOptions, SourceSpec
from converter.plan.shards import ShardTask
from converter.run.task import WorkerContext, run_shard_task

out, src, guard, owner = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
spec = SourceSpec(root=src)
samples = tuple(s for s in discover(spec).samples if s.split == "train")
ctx = WorkerContext(out, OutputOptions(size=(96, 96)), load_class_table(src + "/class_dict.csv"), spec.base,
                    10**9, owner_pid=owner if guard == "on" else None)
run_shard_task(ShardTask("train", "train-00000.tfrecord", samples), ctx)
print("renamed", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("guard", ["on", "off"])
def test_a_worker_whose_run_was_killed_mid_task_renames_nothing(big, tmp_path, guard):
    """SIGKILL does not reach the run's workers (loky's or Dask's): they finish the task
    in hand. With the guard (what `convert` uses) the orphan discards its shard and exits;
    without it (the control) it renames the shard into a folder the next run owns."""
    out = tmp_path / "out"
    out.mkdir()
    run = subprocess.Popen([sys.executable, "-c", RUN_WITH_ONE_WORKER, WORKER, str(out), str(big["half"]), guard],
                           cwd=ROOT, env=child_env(), stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        run.stdout.readline()  # the worker's pid: it has started
        deadline = time.monotonic() + 60
        while not list(out.glob(".tmp-train-00000.tfrecord-*")):
            assert time.monotonic() < deadline and run.poll() is None, "the worker never started its shard"
            time.sleep(0.005)
        run.send_signal(signal.SIGKILL)  # the run dies mid-task; its worker lives on
        run.wait(timeout=30)
        # The orphan ends its task by renaming or discarding its temporary file (it may
        # linger as a zombie where nothing reaps orphans, so its pid proves nothing).
        while list(out.glob(".tmp-train-00000.tfrecord-*")):
            assert time.monotonic() < deadline + 60, "the orphaned worker never ended its task"
            time.sleep(0.05)
        time.sleep(0.2)
    finally:
        kill_session(run)
    shards = [p.name for p in out.iterdir() if not p.name.startswith(".imgshard")]
    if guard == "on":
        assert shards == [], f"the orphaned worker left {shards}"
    else:
        assert sorted(shards)[0] == "train-00000.tfrecord"  # the hazard the guard removes
        assert len(shards) == 2 and sorted(shards)[1].endswith(".idx.npy")  # with its index file
