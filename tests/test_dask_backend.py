"""`imgshard convert --backend dask`: real schedulers and workers on loopback.

A `LocalCluster` with worker processes, and a `dask scheduler` with `dask worker`
subprocesses on 127.0.0.1, convert the same sources as a local run; the shards must
be the same bytes and the manifests equal (minus the run time in the history). A
worker is killed with SIGKILL while it holds a shard task: the run either completes
with identical output (the scheduler reschedules the task) or, when Dask may not
retry, fails and publishes nothing; a rerun then completes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from converter.testing import synth
from converter.convert import BadInputError, convert
from converter.run.dask_runner import DaskBackendError, ProgressTracker
from converter.options import OutputOptions, RunOptions, SourceSpec
from converter.plan.shards import ShardTask
from readers.manifest import MANIFEST_NAME

distributed = pytest.importorskip("distributed")

REPO = Path(__file__).resolve().parents[1]
SAMPLE_BYTES = 64 * 64 * 4  # 64x64 RGB image + uint8 class map
OPTIONS = OutputOptions(size=(64, 64))
SHARD_SIZE = 4 * SAMPLE_BYTES  # 4 samples per shard: 3 train shards, 1 val shard


def _run_options(**kw) -> RunOptions:
    return RunOptions(shard_size_bytes=SHARD_SIZE, **kw)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> synth.SynthDataset:
    """16 PNG pairs large enough (up to 720x1280) that a shard task takes a moment."""
    return synth.make_camvid(tmp_path_factory.mktemp("dask") / "src", splits={"train": 12, "val": 4},
                             size=[(720, 1280), (600, 800)], seed=11)


@pytest.fixture(scope="module")
def reference(sources, tmp_path_factory) -> Path:
    """The same conversion with the local backend, one process."""
    out = tmp_path_factory.mktemp("dask") / "local"
    convert(SourceSpec(root=str(sources.root)), str(out), OPTIONS, _run_options(workers=1))
    return out


def _shard_files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.suffix in (".tfrecord", ".npz")}


def _manifest_without_times(out: Path) -> dict:
    data = json.loads((out / MANIFEST_NAME).read_text())
    for run in data["history"]:
        run.pop("time")
    return data


def _assert_same_dataset(out: Path, reference: Path) -> None:
    expected = _shard_files(reference)
    got = _shard_files(out)
    assert sorted(got) == sorted(expected)
    for name in expected:
        assert got[name] == expected[name], f"{name} differs from the local run's"
    assert _manifest_without_times(out) == _manifest_without_times(reference)
    assert [p.name for p in out.iterdir() if p.name.startswith(".tmp-")] == []


def _worker_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


class LoopbackCluster:
    """`dask scheduler` + `dask worker` subprocesses on 127.0.0.1 (no nanny: one pid per worker)."""

    def __init__(self, folder: Path, n_workers: int, **scheduler_env: str) -> None:
        self.folder = folder
        self.procs: list[subprocess.Popen] = []
        self.log = open(folder / "cluster.log", "ab")
        scheduler_file = folder / "scheduler.json"
        self.procs.append(subprocess.Popen(
            [sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
             "--scheduler-file", str(scheduler_file)],
            env=_worker_env(**scheduler_env), stdout=self.log, stderr=subprocess.STDOUT, cwd=folder,
        ))
        deadline = time.monotonic() + 60
        while not scheduler_file.exists():
            if time.monotonic() > deadline or self.procs[0].poll() is not None:
                raise RuntimeError(f"dask scheduler did not start; see {folder / 'cluster.log'}")
            time.sleep(0.1)
        time.sleep(0.2)  # the file is written in one go, but be safe with a reader racing it
        self.address = json.loads(scheduler_file.read_text())["address"]
        assert self.address.startswith("tcp://127.0.0.1:")
        self.client = distributed.Client(self.address, timeout=60, set_as_default=False)
        for _ in range(n_workers):
            self.add_worker()

    def add_worker(self) -> None:
        before = len(self.client.scheduler_info()["workers"])
        self.procs.append(subprocess.Popen(
            [sys.executable, "-m", "dask", "worker", self.address, "--host", "127.0.0.1", "--nthreads", "1",
             "--no-nanny", "--no-dashboard"],
            env=_worker_env(), stdout=self.log, stderr=subprocess.STDOUT, cwd=self.folder,
        ))
        self.client.wait_for_workers(before + 1, timeout=90)

    def worker_pids(self) -> dict[str, int]:
        return self.client.run(os.getpid)

    def close(self) -> None:
        self.client.close()
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.log.close()


@pytest.fixture
def cluster_factory(tmp_path):
    made: list[LoopbackCluster] = []

    def make(n_workers: int, **scheduler_env: str) -> LoopbackCluster:
        folder = tmp_path / f"cluster{len(made)}"
        folder.mkdir()
        made.append(LoopbackCluster(folder, n_workers, **scheduler_env))
        return made[-1]

    yield make
    for cluster in made:
        cluster.close()


class WorkerKiller:
    """On the first progress event, freeze every worker (SIGSTOP), SIGKILL one that holds
    a shard task of this run, and let the others go on (SIGCONT)."""

    def __init__(self, cluster: LoopbackCluster) -> None:
        self.cluster = cluster
        self.pids = cluster.worker_pids()
        self.started = threading.Event()
        self.victim: str | None = None
        self.victim_keys: list[str] = []
        self.progress = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def on_progress(self, n: int) -> None:
        self.progress += n
        self.started.set()

    def _run(self) -> None:
        if not self.started.wait(120):
            return
        for pid in self.pids.values():
            os.kill(pid, signal.SIGSTOP)
        try:
            for _ in range(200):
                busy = {addr: [k for k in keys if str(k).startswith("imgshard-")]
                        for addr, keys in self.cluster.client.processing().items()}
                busy = {addr: keys for addr, keys in busy.items() if keys and addr in self.pids}
                if busy:
                    self.victim, self.victim_keys = sorted(busy.items())[0]
                    os.kill(self.pids[self.victim], signal.SIGKILL)
                    return
                for pid in self.pids.values():  # nobody holds a task right now: let them run a moment
                    os.kill(pid, signal.SIGCONT)
                time.sleep(0.01)
                for pid in self.pids.values():
                    os.kill(pid, signal.SIGSTOP)
        finally:
            for addr, pid in self.pids.items():
                if addr != self.victim:
                    os.kill(pid, signal.SIGCONT)


def test_local_cluster_writes_the_same_bytes_as_a_local_run(sources, reference, tmp_path):
    out = tmp_path / "dask"
    progress = []
    result = convert(SourceSpec(root=str(sources.root)), str(out), OPTIONS,
                     _run_options(workers=2, backend="dask"), on_progress=progress.append)
    assert result.published
    _assert_same_dataset(out, reference)
    assert sum(progress) == 16
    assert len(progress) > len(result.written)  # per sample, not per shard


def test_rerun_with_nothing_new_starts_no_cluster(sources, reference, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(reference, out)
    t0 = time.perf_counter()
    result = convert(SourceSpec(root=str(sources.root)), str(out), OPTIONS, _run_options(workers=2, backend="dask"))
    assert result.plan.nothing_to_do and not result.published
    assert time.perf_counter() - t0 < 5  # a LocalCluster would take seconds to start
    _assert_same_dataset(out, reference)


def test_bad_inputs_come_back_from_dask_workers_as_from_local_ones(camvid_unknown_colors, tmp_path):
    spec = SourceSpec(root=str(camvid_unknown_colors.root))
    errors = {}
    for backend in ("local", "dask"):
        out = tmp_path / backend
        with pytest.raises(BadInputError) as info:
            convert(spec, str(out), OPTIONS, _run_options(workers=1, backend=backend))
        errors[backend] = [(b.path, b.reason) for b in info.value.bad]
        assert not (out / MANIFEST_NAME).exists()
        assert _shard_files(out) == {}
    assert errors["dask"] == errors["local"] != []


def test_cli_with_scheduler_on_loopback_writes_the_same_bytes(sources, reference, tmp_path, cluster_factory):
    cluster = cluster_factory(2)
    assert set(cluster.client.run(lambda: __import__("converter").__file__).values()) == {
        str(REPO / "converter" / "__init__.py")}
    out = tmp_path / "dask"
    proc = subprocess.run(
        [sys.executable, "-m", "converter.cli", "convert", str(sources.root), str(out), "--size", "64x64",
         "--shard-size", str(SHARD_SIZE), "--backend", "dask", "--scheduler", cluster.address],
        cwd=REPO, env=_worker_env(), capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Converted 16 new" in proc.stderr
    assert "16/16" in proc.stderr  # the progress bar reached the total
    _assert_same_dataset(out, reference)
    # The shard tasks ran on the cluster's workers, not in the driver.
    tasks = cluster.client.run_on_scheduler(
        lambda dask_scheduler: sum(1 for ts in dask_scheduler.task_prefixes.values()
                                   if ts.name.startswith("imgshard")))
    assert tasks >= 1


def test_worker_killed_mid_run_is_rescheduled_and_output_is_identical(sources, reference, tmp_path,
                                                                      cluster_factory):
    cluster = cluster_factory(2)
    killer = WorkerKiller(cluster)
    out = tmp_path / "dask"
    result = convert(SourceSpec(root=str(sources.root)), str(out), OPTIONS,
                     _run_options(backend="dask", scheduler=cluster.address), on_progress=killer.on_progress)
    killer.thread.join(10)
    assert killer.victim is not None, "no worker held a shard task when the run was frozen"
    assert len(cluster.client.scheduler_info()["workers"]) == 1
    assert result.published
    _assert_same_dataset(out, reference)
    assert killer.progress == 16  # retried samples are not counted twice


def test_worker_killed_without_retries_publishes_nothing_and_rerun_completes(sources, reference, tmp_path,
                                                                            cluster_factory):
    cluster = cluster_factory(2, DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES="0")
    killer = WorkerKiller(cluster)
    out = tmp_path / "dask"
    spec = SourceSpec(root=str(sources.root))
    with pytest.raises(DaskBackendError, match="workers died"):
        convert(spec, str(out), OPTIONS, _run_options(backend="dask", scheduler=cluster.address),
                on_progress=killer.on_progress)
    killer.thread.join(10)
    assert killer.victim is not None
    assert not (out / MANIFEST_NAME).exists()
    assert _shard_files(out) == {}
    # No task of the failed run is still running (the driver waited for them).
    assert not any(k for keys in cluster.client.processing().values() for k in keys)

    cluster.add_worker()
    result = convert(spec, str(out), OPTIONS, _run_options(backend="dask", scheduler=cluster.address))
    assert result.published
    _assert_same_dataset(out, reference)


def test_missing_dask_extra_names_the_extra(sources, tmp_path):
    code = (
        "import sys; sys.modules['distributed'] = None\n"
        "from converter.cli import main\n"
        f"sys.exit(main(['convert', {str(sources.root)!r}, {str(tmp_path / 'out')!r}, '--size', '64x64', "
        "'--backend', 'dask', '-q']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 69, proc.stderr
    assert "pip install 'imgshard[dask]'" in proc.stderr
    assert not (tmp_path / "out" / MANIFEST_NAME).exists()


def test_unreachable_scheduler_fails_and_publishes_nothing(sources, tmp_path, monkeypatch):
    import socket

    from converter.run import dask_runner as execute_dask

    monkeypatch.setattr(execute_dask, "CONNECT_TIMEOUT_S", 2)
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "out"
    with pytest.raises(DaskBackendError, match=f"Cannot reach the Dask scheduler at --scheduler tcp://127.0.0.1:{port}"):
        convert(SourceSpec(root=str(sources.root)), str(out), OPTIONS,
                _run_options(backend="dask", scheduler=f"tcp://127.0.0.1:{port}"))
    assert not (out / MANIFEST_NAME).exists()
    assert _shard_files(out) == {}


@pytest.mark.parametrize("address", ["127.0.0.1", "http://127.0.0.1:8786", "tcp://host:port", "tcp://a b:1"])
def test_malformed_scheduler_address_is_rejected(address, sources, tmp_path):
    with pytest.raises(ValueError, match=r"--scheduler must be a Dask scheduler address.*Received"):
        convert(SourceSpec(root=str(sources.root)), str(tmp_path / "out"), OPTIONS,
                _run_options(backend="dask", scheduler=address))


def test_progress_counts_each_sample_once_when_a_shard_is_retried():
    tasks = [ShardTask("train", "train-00000.tfrecord", tuple(range(3))),
             ShardTask("train", "train-00001.tfrecord", tuple(range(2)))]
    seen: list[int] = []
    tracker = ProgressTracker(tasks, seen.append)
    for _ in range(2):  # first attempt: 2 samples, then the worker dies; the retry reports all 3
        tracker.event((0.0, ["train-00000.tfrecord", 1]))
    for _ in range(3):
        tracker.event((0.0, ["train-00000.tfrecord", 1]))
    tracker.finished("train-00000.tfrecord")
    tracker.event((0.0, ["train-00001.tfrecord", 1]))
    tracker.finished("train-00001.tfrecord")  # its second event arrives after the result
    tracker.event((0.0, ["train-00001.tfrecord", 1]))
    tracker.event((0.0, ["other-run.tfrecord", 1]))
    assert sum(seen) == 5 == tracker.total
